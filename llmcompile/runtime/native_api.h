/* What native_call.c gives autograd_nodes.cpp (the capsule "llmcompile.native_api"): a kernel
 * function's planned Caller, found with the GIL held, then run without it. An autograd node's
 * backward runs in the engine's worker thread; taking the GIL there cost a small training step
 * 6-18% of its host time on the H100 (a no-op C hook on torch's own output did the same), so the
 * backward launches its kernel through `run`, which touches no Python object. Tensors are DLTensor
 * (dlpack.h's layout) passed as void*, so that the C and C++ sides need not share a dlpack.h. */
#ifndef LLMCOMPILE_NATIVE_API_H
#define LLMCOMPILE_NATIVE_API_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { NATIVE_API_VERSION = 2 };

/* what `run` returns: launched; refused before any allocation (the checked Python call would take
 * it, and say what is wrong); an output not allocated (the allocator's ctx holds why); the kernel
 * call failed (its error held by TVM-FFI for this thread: `raise_failure` with the GIL) */
enum { RUN_OK = 0, RUN_REFUSED_TYPE = 1, RUN_REFUSED_VALUE = 2, RUN_NO_MEMORY = 3, RUN_FAILED = 4 };

/* makes output `proto` (a DLTensor with device, dtype, ndim and shape set) and views it in `out`
 * (a DLTensor): 0, or -1 */
typedef int (*NativeAlloc)(void* ctx, const void* proto, void* out);

typedef struct {
  int32_t version;
  /* (GIL held) the Caller planned for rows of (dtype code, bits, ndim, n) in `fn`, a kernel
   * function (an Entry instance); NULL where fn is none or no such rows are planned. The Caller
   * found is kept for the process: a node may run it after its kernel function planned anew. */
  void* (*caller_for)(void* fn, uint8_t code, uint8_t bits, int32_t ndim, int64_t n);
  /* (no GIL needed) the Caller's kernel on `n_in` inputs (DLTensor[n_in]), outputs made by
   * `alloc`, on the caller thread's current torch stream: a RUN_ code */
  int (*run)(void* caller, const void* ins, int32_t n_in, NativeAlloc alloc, void* ctx);
  /* (GIL held) the failure `run` left (RUN_FAILED) set as the Python exception */
  void (*raise_failure)(void);
  /* (GIL held) `obj` itself where it is a Caller (a kernel function's fast call with its scalars
   * bound), kept as caller_for's; else NULL */
  void* (*as_caller)(void* obj);
} NativeApi;

#ifdef __cplusplus
}
#endif

#endif
