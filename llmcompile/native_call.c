/* The eager call of a compiled kernel with its outputs made in C.
 *
 * From Python, a call is: allocate the outputs (torch.empty_like, 2-4 us of host time on the
 * H100 machine), then call the kernel's TVM-FFI function (6.5 us, most of it the launch). The
 * allocation alone costs more from Python than torch's whole dispatch does in C++. Here one
 * TVM-FFI function takes the inputs, allocates the outputs through the tensor allocator the
 * Python call installs (torch's caching allocator, from the inputs' DLPack exchange API),
 * calls the kernel and returns them; TVM-FFI hands them back to Python as torch tensors.
 *
 * `llmcompile_make_caller(fn, n_in, n_out, [src, dims, code, bits] * n_out, n_bound, bound...,
 * n_vals, vals...)` returns such a function for one kernel: output i has the shape of input
 * `src` (dims 0), only its first dim (1) or only its last (2), and the dtype (code, bits); the
 * `bound` tensors (a kernel's workspace) follow the outputs, then the scalars. Anything it cannot
 * take is refused before any allocation with a TypeError or ValueError, as the kernel's own
 * checks refuse, so the caller's Python path can take the call again. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <tvm/ffi/c_api.h>
#include <tvm/ffi/extra/c_env_api.h>

enum { MAX_TENSORS = 16, MAX_BOUND = 4, MAX_VALUES = 8 };
enum { DIMS_ALL = 0, DIMS_FIRST = 1, DIMS_LAST = 2 };
/* the kernels index with int32: their launchers check it too, this keeps such calls off */
static const int64_t MAX_ELEMS = (int64_t)1 << 31;

typedef struct {
  TVMFFIObjectHandle fn;
  int32_t n_in, n_out, n_bound, n_vals;
  int32_t src[MAX_TENSORS], dims[MAX_TENSORS];
  DLDataType dtype[MAX_TENSORS];
  TVMFFIAny bound[MAX_BOUND];
  TVMFFIAny vals[MAX_VALUES];
} Caller;

static int refuse(const char* kind, const char* message) {
  TVMFFIErrorSetRaisedFromCStr(kind, message);
  return -1;
}

static DLTensor* tensor_of(const TVMFFIAny* a) {
  if (a->type_index == kTVMFFIDLTensorPtr) return (DLTensor*)a->v_ptr;
  if (a->type_index == kTVMFFITensor) return (DLTensor*)((char*)a->v_obj + sizeof(TVMFFIObject));
  return NULL;
}

static int caller_call(void* self, const TVMFFIAny* args, int32_t nargs, TVMFFIAny* result) {
  const Caller* c = (const Caller*)self;
  TVMFFIAny packed[2 * MAX_TENSORS + MAX_BOUND + MAX_VALUES];
  TVMFFIObjectHandle outs[MAX_TENSORS];
  int32_t i, j;
  if (nargs != c->n_in) return refuse("TypeError", "wrong number of inputs for this kernel");
  for (i = 0; i < nargs; ++i) {
    if (tensor_of(&args[i]) == NULL) return refuse("TypeError", "every input must be a tensor");
    packed[i] = args[i];
  }
  {
    const DLTensor* x = tensor_of(&args[0]);
    int64_t numel = 1;
    for (j = 0; j < x->ndim; ++j) numel *= x->shape[j];
    if (x->ndim < 1 || numel <= 0 || numel >= MAX_ELEMS)
      return refuse("ValueError", "an empty or too large input is not a fast call");
  }
  for (i = 0; i < c->n_out; ++i) {
    const DLTensor* s = tensor_of(&args[c->src[i]]);
    DLTensor proto;
    memset(&proto, 0, sizeof(proto));
    proto.device = s->device;
    proto.ndim = c->dims[i] == DIMS_ALL ? s->ndim : 1;
    proto.dtype = c->dtype[i];
    proto.shape = c->dims[i] == DIMS_LAST ? s->shape + (s->ndim - 1) : s->shape;
    if (TVMFFIEnvTensorAlloc(&proto, &outs[i]) != 0) {
      for (j = 0; j < i; ++j) TVMFFIObjectDecRef(outs[j]);
      return -1;
    }
    packed[nargs + i].type_index = kTVMFFITensor;
    packed[nargs + i].zero_padding = 0;
    packed[nargs + i].v_obj = (TVMFFIObject*)outs[i];
  }
  for (i = 0; i < c->n_bound; ++i) packed[nargs + c->n_out + i] = c->bound[i];
  for (i = 0; i < c->n_vals; ++i) packed[nargs + c->n_out + c->n_bound + i] = c->vals[i];
  {
    TVMFFIAny ret;
    memset(&ret, 0, sizeof(ret));
    ret.type_index = kTVMFFINone;
    if (TVMFFIFunctionCall(c->fn, packed, nargs + c->n_out + c->n_bound + c->n_vals, &ret) != 0) {
      for (j = 0; j < c->n_out; ++j) TVMFFIObjectDecRef(outs[j]);
      return -1; /* the kernel's error stays raised */
    }
  }
  if (c->n_out == 1) {
    result->type_index = kTVMFFITensor;
    result->zero_padding = 0;
    result->v_obj = (TVMFFIObject*)outs[0];
    return 0;
  }
  {
    /* several outputs: a TVM-FFI Array of them, made by TVM-FFI's own constructor */
    static TVMFFIObjectHandle array_ctor = NULL;
    TVMFFIByteArray name = {"ffi.Array", 9};
    int rc;
    if (array_ctor == NULL && TVMFFIFunctionGetGlobal(&name, &array_ctor) != 0) {
      for (j = 0; j < c->n_out; ++j) TVMFFIObjectDecRef(outs[j]);
      return -1;
    }
    rc = TVMFFIFunctionCall(array_ctor, packed + nargs, c->n_out, result);
    for (j = 0; j < c->n_out; ++j) TVMFFIObjectDecRef(outs[j]); /* the array holds them now */
    return rc;
  }
}

static void caller_free(void* self) {
  Caller* c = (Caller*)self;
  int32_t i;
  for (i = 0; i < c->n_bound; ++i) TVMFFIObjectDecRef(c->bound[i].v_obj);
  if (c->fn != NULL) TVMFFIObjectDecRef(c->fn);
  free(c);
}

static int as_int(const TVMFFIAny* a, int32_t* out) {
  if (a->type_index != kTVMFFIInt && a->type_index != kTVMFFIBool) return -1;
  *out = (int32_t)a->v_int64;
  return 0;
}

int __tvm_ffi_llmcompile_make_caller(void* self, const TVMFFIAny* args, int32_t nargs, TVMFFIAny* result) {
  Caller* c;
  TVMFFIObjectHandle fn_out;
  int32_t i, k, code, bits;
  (void)self;
  if (nargs < 4 || args[0].type_index != kTVMFFIFunction)
    return refuse("TypeError", "make_caller(fn, n_in, n_out, specs..., n_vals, vals...)");
  c = (Caller*)calloc(1, sizeof(Caller));
  if (c == NULL) return refuse("MemoryError", "make_caller: out of host memory");
  if (as_int(&args[1], &c->n_in) || as_int(&args[2], &c->n_out) || c->n_in < 1 || c->n_in > MAX_TENSORS ||
      c->n_out < 1 || c->n_out > MAX_TENSORS || nargs < 4 + 4 * c->n_out) {
    free(c);
    return refuse("ValueError", "make_caller: bad tensor counts");
  }
  k = 3;
  for (i = 0; i < c->n_out; ++i, k += 4) {
    if (as_int(&args[k], &c->src[i]) || as_int(&args[k + 1], &c->dims[i]) || as_int(&args[k + 2], &code) ||
        as_int(&args[k + 3], &bits) || c->src[i] < 0 || c->src[i] >= c->n_in || c->dims[i] < DIMS_ALL ||
        c->dims[i] > DIMS_LAST) {
      free(c);
      return refuse("ValueError", "make_caller: bad output spec");
    }
    c->dtype[i].code = (uint8_t)code;
    c->dtype[i].bits = (uint8_t)bits;
    c->dtype[i].lanes = 1;
  }
  if (nargs < k + 1 || as_int(&args[k], &c->n_bound) || c->n_bound < 0 || c->n_bound > MAX_BOUND ||
      nargs < k + 2 + c->n_bound) {
    free(c);
    return refuse("ValueError", "make_caller: bad bound tensor count");
  }
  for (i = 0; i < c->n_bound; ++i) {
    if (args[k + 1 + i].type_index != kTVMFFITensor) {
      free(c);
      return refuse("TypeError", "make_caller: bound arguments must be tensors");
    }
  }
  k += 1 + c->n_bound;
  if (as_int(&args[k], &c->n_vals) || c->n_vals < 0 || c->n_vals > MAX_VALUES || nargs != k + 1 + c->n_vals) {
    free(c);
    return refuse("ValueError", "make_caller: bad scalar count");
  }
  for (i = 0; i < c->n_vals; ++i) {
    const TVMFFIAny* v = &args[k + 1 + i];
    if (v->type_index != kTVMFFIInt && v->type_index != kTVMFFIFloat && v->type_index != kTVMFFIBool) {
      free(c);
      return refuse("TypeError", "make_caller: scalars must be ints or floats");
    }
    c->vals[i] = *v;
  }
  /* from here on the caller owns references: caller_free releases them */
  for (i = 0; i < c->n_bound; ++i) {
    c->bound[i] = args[k - c->n_bound + i];
    TVMFFIObjectIncRef(c->bound[i].v_obj);
  }
  c->fn = args[0].v_obj;
  TVMFFIObjectIncRef(c->fn);
  if (TVMFFIFunctionCreate(c, caller_call, caller_free, &fn_out) != 0) {
    caller_free(c);
    return -1;
  }
  result->type_index = kTVMFFIFunction;
  result->zero_padding = 0;
  result->v_obj = (TVMFFIObject*)fn_out;
  return 0;
}
