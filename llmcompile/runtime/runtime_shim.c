/* The one CuTe DSL runtime entry point a sealed kernel calls that CuTe DSL's static runtime
 * archive (libcuda_dialect_runtime_static.a) does not define: raising a CUDA error through
 * TVM-FFI. Linked into an exported library so that it loads without libcute_dsl_runtime.so
 * (43 MB, part of CuTe DSL). The host code passes TVMFFIErrorSetRaisedFromCStrParts and the
 * cudaError_t; the CUDA runtime is the caller process's own (torch's). */
#include <stdint.h>

extern const char* cudaGetErrorName(int error);
extern const char* cudaGetErrorString(int error);

typedef void (*llmcompile_set_raised_parts)(const char* kind, const char** parts, int32_t num_parts);

void CuteDSLRT_TVMFFISetRaisedCudaError(llmcompile_set_raised_parts set_raised, int32_t error) {
  const char* parts[4] = {"CUDA error ", cudaGetErrorName(error), ": ", cudaGetErrorString(error)};
  set_raised("RuntimeError", parts, 4);
}
