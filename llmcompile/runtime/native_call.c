/* The eager call of a compiled kernel, in C: a CPython extension over TVM-FFI's C API and the
 * DLPack exchange API torch puts on its Tensor type (`__dlpack_c_exchange_api__`).
 *
 * From Python, a call costs a Python method, torch.empty_like for each output (1.8-4 us of host
 * time on the H100 machine) and tvm_ffi.Function's call, which turns each torch tensor into an
 * owning DLPack tensor and then a TVM-FFI Tensor (two heap objects a tensor) and turns a returned
 * tensor back the same way. Here one C function does the call: each input seen as a DLTensor on
 * the stack (no allocation), each output allocated by torch's allocator and wrapped as a torch
 * tensor once, torch's current stream set for the kernel, the kernel's TVM-FFI function called
 * with DLTensor pointers.
 *
 * `Caller` is that call for one kernel: `make_caller(fn, n_in, specs, values, bound, flat)`; output i
 * has the shape of input `src` (dims 0), only its first dim (1), only its last (2), is one value (3,
 * a total: shape (1,)) or has all of src's dims but the last (4, attention's lse) and the dtype
 * (code, bits); the `bound` tensors (a kernel's workspace) follow the outputs, then the scalars.
 * `flat` says which inputs are rows or a value a row: their leading dims (batch, sequence) reach
 * the kernel as one M, and outputs made like them come back in the caller's shape.
 * What it cannot take is refused before any allocation with a TypeError or ValueError, as the
 * kernel's own checks refuse, so the caller's Python path can take the call again.
 * `set_strided(caller, other)` gives a Caller a second one, the same call compiled for x's rows at
 * any 16-byte-aligned row stride: a slice x[:, :N] of wider rows goes there, read where it lies,
 * not copied dense first. `make_caller(..., in_dtypes)` says which dtype each input must have
 * (an input of another is refused at no cost), and `set_alternate(caller, other)` gives it the call
 * of the same op made for other dtypes (fp32 weights beside 16-bit rows), taken instead.
 *
 * `Entry` is the base of the Python class of a torch-facing kernel function (callpath's
 * KernelFunction). Its call finds the Caller planned for x's (dtype, dims, N) in a small table and
 * runs it; it hands anything else to the class's Python `__call__` (grads, keywords, a shape not
 * planned yet) and a call the kernel refuses to the class's `_checked_call`.
 * `install(cls)` makes a call of a `cls` instance reach this C call while `cls.__call__` stays the
 * Python function, the one torch.compile traces (dynamo reads the class's `__call__`, never the
 * type slot). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <stdint.h>
#include <string.h>

#include <dlpack/dlpack.h>
#include <tvm/ffi/c_api.h>
#include <tvm/ffi/extra/c_env_api.h>

#include "native_api.h"

enum { MAX_TENSORS = 16, MAX_BOUND = 4, MAX_BOUND_DIMS = 4, MAX_VALUES = 8 };
enum { MAX_ARGS = 2 * MAX_TENSORS + MAX_BOUND + MAX_VALUES };
enum { DIMS_ALL = 0, DIMS_FIRST = 1, DIMS_LAST = 2, DIMS_ONE = 3, DIMS_LEAD = 4 };
static const int64_t ONE_VALUE[1] = {1};
/* How an input's leading dims reach the kernel: as they are; rows (..., N) seen as (M, N); values
 * of each row (...) seen as (M,). A view, never a copy: dims that do not flatten are refused. */
enum { FLAT_NONE = 0, FLAT_ROWS = 1, FLAT_VALUES = 2 };
/* the kernels index with int32: their launchers check it too, this keeps such calls off */
static const int64_t MAX_ELEMS = (int64_t)1 << 31;

static const DLPackExchangeAPI* api = NULL; /* torch's, found by the first make_caller */
static PyTypeObject* tensor_type = NULL;    /* torch.Tensor */

/* ------------------------------------------------------------------ errors */

/* The error TVM-FFI holds raised, as the Python exception of the same name where there is one. */
static void raise_ffi_error(void) {
  TVMFFIObjectHandle err = NULL;
  const TVMFFIErrorCell* cell;
  PyObject *kind, *message, *type;
  TVMFFIErrorMoveFromRaised(&err);
  if (err == NULL) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "the kernel call failed");
    return;
  }
  cell = (const TVMFFIErrorCell*)((const char*)err + sizeof(TVMFFIObject));
  kind = PyUnicode_DecodeUTF8(cell->kind.data, (Py_ssize_t)cell->kind.size, "replace");
  message = PyUnicode_DecodeUTF8(cell->message.data, (Py_ssize_t)cell->message.size, "replace");
  TVMFFIObjectDecRef(err);
  if (kind == NULL || message == NULL) goto done;
  if (PyUnicode_CompareWithASCIIString(kind, "EnvErrorAlreadySet") == 0 && PyErr_Occurred())
    goto done; /* a Python callback's exception, still set */
  type = PyDict_GetItemWithError(PyEval_GetBuiltins(), kind);
  if (type != NULL && PyType_Check(type) && PyType_IsSubtype((PyTypeObject*)type, (PyTypeObject*)PyExc_Exception))
    PyErr_SetObject(type, message);
  else if (!PyErr_Occurred())
    PyErr_Format(PyExc_RuntimeError, "%U: %U", kind, message);
done:
  Py_XDECREF(kind);
  Py_XDECREF(message);
}

static void set_alloc_error(void* ctx, const char* kind, const char* message) {
  (void)ctx;
  PyErr_Format(strcmp(kind, "MemoryError") == 0 ? PyExc_MemoryError : PyExc_RuntimeError, "%s: %s", kind, message);
}

/* ------------------------------------------------------------------ Caller */

typedef struct {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* fn; /* the tvm_ffi.Function: it holds the handle */
  TVMFFIObjectHandle handle;
  int32_t n_in, n_out, n_bound, n_vals;
  int32_t src[MAX_TENSORS], dims[MAX_TENSORS];
  int32_t flat[MAX_TENSORS]; /* each input: FLAT_NONE, FLAT_ROWS or FLAT_VALUES */
  DLDataType dtype[MAX_TENSORS];
  PyObject* bound[MAX_BOUND];
  /* their views, made once (a bound tensor is never resized): a call reads no Python object */
  DLTensor bound_dl[MAX_BOUND];
  int64_t bound_shape[MAX_BOUND][MAX_BOUND_DIMS], bound_strides[MAX_BOUND][MAX_BOUND_DIMS];
  TVMFFIAny vals[MAX_VALUES];
  /* the same call compiled for x's rows at any 16-byte-aligned stride (a slice of wider rows):
   * taken where x is such a slice; NULL until the first slice asked for it (set_strided) */
  PyObject* strided;
  int32_t any_row_stride; /* this is such a call: x's rows need not be dense */
  /* each input's dtype as the kernel was compiled for it (code 255: not checked here), and the
   * call of the same op compiled for other input dtypes (fp32 weights beside bf16 rows), taken
   * where an input's dtype is not this call's; NULL until set_alternate */
  DLDataType in_dtype[MAX_TENSORS];
  PyObject* alternate;
} Caller;

static PyTypeObject CallerType;

static PyObject* refuse(PyObject* type, const char* message) {
  PyErr_SetString(type, message);
  return NULL;
}

static int view_of(PyObject* obj, DLTensor* out) {
  if (!PyObject_TypeCheck(obj, tensor_type)) {
    PyErr_SetString(PyExc_TypeError, "every input must be a torch tensor");
    return -1;
  }
  return api->dltensor_from_py_object_no_sync(obj, out);
}

/* `t` seen with its leading dims as one (FLAT_ROWS: (M, N); FLAT_VALUES: (M,)), its new shape and
 * strides in `shape` and `stride`; -1 where those dims are not one run of memory. Dims of size 1
 * take any stride, as torch's own contiguity says. */
static int flatten(DLTensor* t, int32_t how, int64_t* shape, int64_t* stride) {
  int32_t keep = how == FLAT_ROWS ? 1 : 0; /* trailing dims kept as they are */
  int32_t lead = t->ndim - keep, j;
  int64_t m = 1, run = -1; /* run: the stride of the innermost leading dim of size > 1 */
  if (how == FLAT_NONE || lead <= 1) return 0;
  for (j = lead - 1; j >= 0; --j) {
    int64_t st = t->strides ? t->strides[j] : 0;
    if (t->shape[j] == 1) continue;
    if (t->strides == NULL) {
      run = 0;
    } else if (run < 0) {
      run = st;
      m = t->shape[j];
      continue;
    } else if (st != run * m) {
      return -1;
    }
    m *= t->shape[j];
  }
  m = 1;
  for (j = 0; j < lead; ++j) m *= t->shape[j];
  shape[0] = m;
  if (keep) shape[1] = t->shape[t->ndim - 1];
  if (t->strides != NULL) {
    int64_t inner = keep ? t->strides[t->ndim - 1] : 1;
    stride[0] = run >= 0 ? run : (keep ? shape[1] * inner : 1);
    if (keep) stride[1] = inner;
    t->strides = stride;
  }
  t->shape = shape;
  t->ndim = 1 + keep;
  return 0;
}

/* Rows (M, N) each dense but apart, a row stride that keeps every row 16-byte aligned: a slice
 * x[:, :N] of wider rows, which a call compiled for strided rows reads where it lies. */
static int strided_rows(const DLTensor* t) {
  int64_t bytes;
  if (t->ndim != 2 || t->strides == NULL || t->strides[1] != 1 || t->strides[0] < t->shape[1]) return 0;
  if (t->shape[0] * t->strides[0] >= MAX_ELEMS) return 0; /* (the kernels index with int32) */
  bytes = t->strides[0] * (int64_t)t->dtype.bits / 8;
  return bytes % 16 == 0 && ((uintptr_t)t->data + t->byte_offset) % 16 == 0;
}

/* Whether rows (FLAT_ROWS: (M, N)) or a value a row (FLAT_VALUES) lie densely, as the kernels are
 * compiled to read them: a slice of wider rows, or a vector broadcast with stride 0, is refused
 * here, at no cost, rather than by the kernel's own checks (whose error takes tens of us to make). */
static int compact(const DLTensor* t, int32_t how) {
  if (how == FLAT_NONE || t->strides == NULL) return 1;
  if (t->ndim < 1 || (t->strides[t->ndim - 1] != 1 && t->shape[t->ndim - 1] != 1)) return 0;
  return how == FLAT_VALUES || t->ndim < 2 || t->shape[0] == 1 || t->strides[0] == t->shape[1];
}

static int same_device(DLDevice a, DLDevice b) { return a.device_type == b.device_type && a.device_id == b.device_id; }

/* The call of `c` on inputs `ins` (views, `n_in` of them), each output made by `alloc`: a RUN_
 * code (native_api.h), `*why` saying what a refusal refuses. Touches no Python object, so that a
 * backward runs it without the GIL (native_api.h); the Python call below wraps it. */
static int caller_run(Caller* c, const DLTensor* ins, int32_t n_in, NativeAlloc alloc, void* ctx, const char** why) {
  DLTensor dl[2 * MAX_TENSORS + MAX_BOUND];
  int64_t shapes[2 * MAX_TENSORS][2], strides[2 * MAX_TENSORS][2];
  TVMFFIAny packed[MAX_ARGS];
  TVMFFIAny ret;
  TVMFFIStreamHandle prev = NULL;
  int32_t i, j, n_tensors, rc, lead_ndim;
  DLDevice dev;
  *why = NULL;
  if (n_in != c->n_in) {
    *why = "wrong number of inputs for this kernel";
    return RUN_REFUSED_TYPE;
  }
  for (i = 0; i < c->n_in; ++i) {
    const DLDataType want = c->in_dtype[i];
    if (want.code != 255 && (ins[i].dtype.code != want.code || ins[i].dtype.bits != want.bits)) {
      if (c->alternate != NULL) return caller_run((Caller*)c->alternate, ins, n_in, alloc, ctx, why);
      /* refused here at no cost: the kernel's own dtype check makes an error of tens of us */
      *why = "an input of a dtype this kernel was not compiled for";
      return RUN_REFUSED_TYPE;
    }
  }
  memcpy(dl, ins, (size_t)n_in * sizeof(DLTensor)); /* (flattened below: the caller's views stay) */
  lead_ndim = dl[0].ndim - 1;
  for (i = 0; i < c->n_in; ++i) {
    if (flatten(&dl[i], c->flat[i], shapes[i], strides[i]) != 0) {
      *why = "leading dims that are not one run of memory";
      return RUN_REFUSED_VALUE;
    }
    if (!compact(&dl[i], c->flat[i])) {
      if (i == 0 && c->flat[0] == FLAT_ROWS && strided_rows(&dl[0])) {
        if (c->any_row_stride) continue;
        if (c->strided != NULL) return caller_run((Caller*)c->strided, ins, n_in, alloc, ctx, why);
      }
      *why = "rows that are not contiguous";
      return RUN_REFUSED_VALUE;
    }
  }
  {
    int64_t numel = 1;
    for (j = 0; j < dl[0].ndim; ++j) numel *= dl[0].shape[j];
    if (dl[0].ndim < 1 || numel <= 0 || numel >= MAX_ELEMS) {
      *why = "an empty or too large input is not a fast call";
      return RUN_REFUSED_VALUE;
    }
  }
  /* one device for every tensor: the kernel runs on x's (CuTe DSL's wrapper makes it current for
   * the call), and its own checks see a device's type, not which one; on a host of several GPUs a
   * tensor on another one is refused here, and the checked path says so */
  dev = dl[0].device;
  for (i = 1; i < c->n_in; ++i)
    if (!same_device(dl[i].device, dev)) {
      *why = "inputs on different devices";
      return RUN_REFUSED_VALUE;
    }
  for (j = 0; j < c->n_bound; ++j)
    if (!same_device(c->bound_dl[j].device, dev)) {
      *why = "a workspace made on another device";
      return RUN_REFUSED_VALUE;
    }
  for (i = 0; i < c->n_out; ++i) {
    const DLTensor* s = &dl[c->src[i]];
    DLTensor proto;
    DLTensor* out = &dl[c->n_in + i];
    memset(&proto, 0, sizeof(proto));
    proto.device = s->device;
    proto.dtype = c->dtype[i];
    /* an output made like x, whose leading dims were flattened, takes the caller's shape (and is
     * flattened in turn below) */
    int like_lead = c->src[i] == 0 && c->flat[0] == FLAT_ROWS && lead_ndim > 1;
    if (c->dims[i] == DIMS_ALL) {
      proto.ndim = like_lead ? lead_ndim + 1 : s->ndim;
      proto.shape = like_lead ? ins[0].shape : s->shape;
    } else if (c->dims[i] == DIMS_ONE) {
      proto.ndim = 1;
      proto.shape = (int64_t*)ONE_VALUE;
    } else if (c->dims[i] == DIMS_LEAD) {
      proto.ndim = s->ndim - 1; /* one value a row of src, in the shape of its leading dims */
      proto.shape = s->shape;
    } else if (c->dims[i] == DIMS_FIRST && like_lead) {
      proto.ndim = lead_ndim; /* a value a row, in the shape of x's leading dims */
      proto.shape = ins[0].shape;
    } else {
      proto.ndim = 1;
      proto.shape = c->dims[i] == DIMS_LAST ? s->shape + (s->ndim - 1) : s->shape;
    }
    if (alloc(ctx, &proto, out) != 0) return RUN_NO_MEMORY;
    /* (an output made like an input the kernel takes as it is, a fixed layout's, stays as it is) */
    if (c->dims[i] != DIMS_LAST && c->dims[i] != DIMS_ONE && c->flat[c->src[i]] != FLAT_NONE &&
        flatten(out, c->dims[i] == DIMS_ALL ? FLAT_ROWS : FLAT_VALUES, shapes[c->n_in + i], strides[c->n_in + i]) != 0) {
      *why = "an output that does not flatten";
      return RUN_REFUSED_VALUE;
    }
  }
  for (j = 0; j < c->n_bound; ++j) dl[c->n_in + c->n_out + j] = c->bound_dl[j];
  n_tensors = c->n_in + c->n_out + c->n_bound;
  for (j = 0; j < n_tensors; ++j) {
    packed[j].type_index = kTVMFFIDLTensorPtr;
    packed[j].zero_padding = 0;
    packed[j].v_ptr = &dl[j];
  }
  for (j = 0; j < c->n_vals; ++j) packed[n_tensors + j] = c->vals[j];
  if (dev.device_type != kDLCPU) {
    /* the kernel launches on TVM-FFI's stream for the device: torch's current one, for this call */
    void* stream = NULL;
    if (api->current_work_stream(dev.device_type, dev.device_id, &stream) != 0) {
      *why = "torch gave no current stream";
      return RUN_REFUSED_VALUE;
    }
    if (TVMFFIEnvSetStream(dev.device_type, dev.device_id, stream, &prev) != 0) return RUN_FAILED;
  }
  memset(&ret, 0, sizeof(ret));
  ret.type_index = kTVMFFINone;
  rc = TVMFFIFunctionCall(c->handle, packed, n_tensors + c->n_vals, &ret);
  if (dev.device_type != kDLCPU && TVMFFIEnvSetStream(dev.device_type, dev.device_id, prev, NULL) != 0 && rc == 0)
    return RUN_FAILED;
  if (rc != 0) return RUN_FAILED;
  if (ret.type_index >= kTVMFFIStaticObjectBegin && ret.v_obj != NULL) TVMFFIObjectDecRef(ret.v_obj);
  return RUN_OK;
}

/* The Python call's outputs: torch tensors made by torch's allocator through the exchange API. */
typedef struct {
  PyObject* outs[MAX_TENSORS];
  int32_t made;
} PyOutputs;

static int py_alloc(void* ctx, const void* proto, void* out) {
  PyOutputs* o = (PyOutputs*)ctx;
  DLManagedTensorVersioned* made = NULL;
  void* obj = NULL;
  if (api->managed_tensor_allocator((DLTensor*)proto, &made, NULL, set_alloc_error) != 0 ||
      api->managed_tensor_to_py_object_no_sync(made, &obj) != 0) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_MemoryError, "the output could not be allocated");
    return -1;
  }
  o->outs[o->made++] = (PyObject*)obj;
  return api->dltensor_from_py_object_no_sync((PyObject*)obj, (DLTensor*)out);
}

static PyObject* caller_invoke(Caller* c, PyObject* const* args, Py_ssize_t nargs) {
  DLTensor dl[MAX_TENSORS];
  PyOutputs o;
  const char* why;
  int32_t i;
  int rc;
  if (nargs != c->n_in) return refuse(PyExc_TypeError, "wrong number of inputs for this kernel");
  for (i = 0; i < c->n_in; ++i)
    if (view_of(args[i], &dl[i]) != 0) return NULL;
  o.made = 0;
  rc = caller_run(c, dl, c->n_in, py_alloc, &o, &why);
  if (rc == RUN_OK) {
    PyObject* list;
    if (o.made == 1) return o.outs[0];
    list = PyList_New(o.made);
    if (list != NULL) {
      for (i = 0; i < o.made; ++i) PyList_SET_ITEM(list, i, o.outs[i]); /* the list takes them */
      return list;
    }
  } else if (rc == RUN_REFUSED_TYPE || rc == RUN_REFUSED_VALUE) {
    PyErr_SetString(rc == RUN_REFUSED_TYPE ? PyExc_TypeError : PyExc_ValueError, why);
  } else if (rc == RUN_FAILED) {
    raise_ffi_error();
  } /* (RUN_NO_MEMORY: py_alloc set the error) */
  for (i = 0; i < o.made; ++i) Py_DECREF(o.outs[i]);
  return NULL;
}

static PyObject* caller_vectorcall(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0) return refuse(PyExc_TypeError, "a kernel call takes no keywords");
  return caller_invoke((Caller*)self, args, PyVectorcall_NARGS(nargsf));
}

static int caller_traverse(PyObject* self, visitproc visit, void* arg) {
  Caller* c = (Caller*)self;
  int32_t i;
  Py_VISIT(c->fn);
  Py_VISIT(c->strided);
  Py_VISIT(c->alternate);
  for (i = 0; i < c->n_bound; ++i) Py_VISIT(c->bound[i]);
  return 0;
}

static int caller_clear(PyObject* self) {
  Caller* c = (Caller*)self;
  int32_t i;
  Py_CLEAR(c->fn);
  Py_CLEAR(c->strided);
  Py_CLEAR(c->alternate);
  c->handle = NULL;
  for (i = 0; i < c->n_bound; ++i) Py_CLEAR(c->bound[i]);
  c->n_bound = 0;
  return 0;
}

static void caller_dealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  caller_clear(self);
  Py_TYPE(self)->tp_free(self);
}

static PyTypeObject CallerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "llmcompile_native.Caller",
    .tp_basicsize = sizeof(Caller),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "One kernel's eager call: caller(*inputs) -> output, or a list of outputs.",
    .tp_vectorcall_offset = offsetof(Caller, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_traverse = caller_traverse,
    .tp_clear = caller_clear,
    .tp_dealloc = caller_dealloc,
};

/* torch's exchange API, found once: the caller's allocations and tensor views go through it */
static int find_api(void) {
  PyObject *torch, *type, *capsule;
  const DLPackExchangeAPI* found;
  if (api != NULL) return 0;
  torch = PyImport_ImportModule("torch");
  if (torch == NULL) return -1;
  type = PyObject_GetAttrString(torch, "Tensor");
  Py_DECREF(torch);
  if (type == NULL) return -1;
  capsule = PyObject_GetAttrString(type, "__dlpack_c_exchange_api__");
  if (capsule == NULL) {
    Py_DECREF(type);
    return -1;
  }
  found = (const DLPackExchangeAPI*)PyCapsule_GetPointer(capsule, "dlpack_exchange_api");
  Py_DECREF(capsule);
  if (found == NULL) {
    Py_DECREF(type);
    return -1;
  }
  if (found->header.version.major != DLPACK_MAJOR_VERSION || found->managed_tensor_allocator == NULL ||
      found->managed_tensor_to_py_object_no_sync == NULL || found->dltensor_from_py_object_no_sync == NULL ||
      found->current_work_stream == NULL) {
    Py_DECREF(type);
    PyErr_SetString(PyExc_OSError, "torch's DLPack exchange API is not one this call can use");
    return -1;
  }
  tensor_type = (PyTypeObject*)type; /* held for the process */
  api = found;
  return 0;
}

static int as_int32(PyObject* o, int32_t* out) {
  long v = PyLong_AsLong(o);
  if (v == -1 && PyErr_Occurred()) return -1;
  *out = (int32_t)v;
  return 0;
}

/* bound tensor j's view, kept in the Caller with its own copy of the shape and strides */
static int bind_view(Caller* c, int32_t j) {
  DLTensor* v = &c->bound_dl[j];
  int32_t d;
  if (view_of(c->bound[j], v) != 0) return -1;
  if (v->ndim > MAX_BOUND_DIMS) {
    PyErr_SetString(PyExc_ValueError, "make_caller: a bound tensor of more dims than a Caller keeps");
    return -1;
  }
  for (d = 0; d < v->ndim; ++d) {
    c->bound_shape[j][d] = v->shape[d];
    if (v->strides != NULL) c->bound_strides[j][d] = v->strides[d];
  }
  v->shape = c->bound_shape[j];
  if (v->strides != NULL) v->strides = c->bound_strides[j];
  return 0;
}

static PyObject* make_caller(PyObject* module, PyObject* args) {
  PyObject *fn, *specs, *values, *bound, *chandle, *flat = NULL, *in_dtypes = NULL;
  int n_in;
  Caller* c;
  Py_ssize_t i, n;
  (void)module;
  if (!PyArg_ParseTuple(args, "OiO!O!O!|O!O!", &fn, &n_in, &PyTuple_Type, &specs, &PyTuple_Type, &values, &PyTuple_Type,
                        &bound, &PyTuple_Type, &flat, &PyTuple_Type, &in_dtypes))
    return NULL;
  if (flat != NULL && PyTuple_GET_SIZE(flat) != n_in) return refuse(PyExc_ValueError, "make_caller: a flat kind an input");
  if (in_dtypes != NULL && PyTuple_GET_SIZE(in_dtypes) != n_in)
    return refuse(PyExc_ValueError, "make_caller: a dtype (or None) an input");
  if (find_api() != 0) return NULL;
  chandle = PyObject_CallMethod(fn, "__chandle__", NULL);
  if (chandle == NULL) return NULL;
  {
    void* h = PyLong_AsVoidPtr(chandle);
    Py_DECREF(chandle);
    if (h == NULL || ((TVMFFIObject*)h)->type_index != kTVMFFIFunction)
      return PyErr_Occurred() ? NULL : refuse(PyExc_TypeError, "make_caller: fn must be a TVM-FFI function");
    n = PyTuple_GET_SIZE(specs);
    if (n_in < 1 || n_in > MAX_TENSORS || n < 1 || n > MAX_TENSORS)
      return refuse(PyExc_ValueError, "make_caller: bad tensor counts");
    if (PyTuple_GET_SIZE(bound) > MAX_BOUND) return refuse(PyExc_ValueError, "make_caller: bad bound tensor count");
    if (PyTuple_GET_SIZE(values) > MAX_VALUES) return refuse(PyExc_ValueError, "make_caller: bad scalar count");
    c = PyObject_GC_New(Caller, &CallerType);
    if (c == NULL) return NULL;
    c->vectorcall = caller_vectorcall;
    c->handle = h;
    c->strided = NULL;
    c->any_row_stride = 0;
    c->alternate = NULL;
  }
  Py_INCREF(fn);
  c->fn = fn;
  c->n_in = n_in;
  c->n_out = (int32_t)n;
  c->n_bound = 0;
  c->n_vals = 0;
  for (i = 0; i < n_in; ++i) {
    PyObject* d = in_dtypes != NULL ? PyTuple_GET_ITEM(in_dtypes, i) : Py_None;
    int32_t code = 255, bits = 0;
    if (d != Py_None && (!PyTuple_Check(d) || PyTuple_GET_SIZE(d) != 2 || as_int32(PyTuple_GET_ITEM(d, 0), &code) ||
                         as_int32(PyTuple_GET_ITEM(d, 1), &bits))) {
      PyErr_Clear();
      Py_DECREF(c);
      return refuse(PyExc_ValueError, "make_caller: an input's dtype is (code, bits) or None");
    }
    c->in_dtype[i].code = (uint8_t)code;
    c->in_dtype[i].bits = (uint8_t)bits;
    c->in_dtype[i].lanes = 1;
    c->flat[i] = FLAT_NONE;
    if (flat != NULL && (as_int32(PyTuple_GET_ITEM(flat, i), &c->flat[i]) || c->flat[i] < FLAT_NONE ||
                         c->flat[i] > FLAT_VALUES)) {
      PyErr_Clear();
      Py_DECREF(c);
      return refuse(PyExc_ValueError, "make_caller: bad flat kind");
    }
  }
  for (i = 0; i < n; ++i) {
    PyObject* s = PyTuple_GET_ITEM(specs, i);
    int32_t code, bits;
    if (!PyTuple_Check(s) || PyTuple_GET_SIZE(s) != 4 || as_int32(PyTuple_GET_ITEM(s, 0), &c->src[i]) ||
        as_int32(PyTuple_GET_ITEM(s, 1), &c->dims[i]) || as_int32(PyTuple_GET_ITEM(s, 2), &code) ||
        as_int32(PyTuple_GET_ITEM(s, 3), &bits) || c->src[i] < 0 || c->src[i] >= n_in || c->dims[i] < DIMS_ALL ||
        c->dims[i] > DIMS_LEAD) {
      PyErr_Clear();
      Py_DECREF(c);
      return refuse(PyExc_ValueError, "make_caller: bad output spec");
    }
    c->dtype[i].code = (uint8_t)code;
    c->dtype[i].bits = (uint8_t)bits;
    c->dtype[i].lanes = 1;
  }
  for (i = 0; i < PyTuple_GET_SIZE(bound); ++i) {
    PyObject* t = PyTuple_GET_ITEM(bound, i);
    if (!PyObject_TypeCheck(t, tensor_type)) {
      Py_DECREF(c);
      return refuse(PyExc_TypeError, "make_caller: bound arguments must be torch tensors");
    }
    Py_INCREF(t);
    c->bound[c->n_bound++] = t;
    if (bind_view(c, c->n_bound - 1) != 0) {
      Py_DECREF(c);
      return NULL;
    }
  }
  for (i = 0; i < PyTuple_GET_SIZE(values); ++i) {
    PyObject* v = PyTuple_GET_ITEM(values, i);
    TVMFFIAny* a = &c->vals[i];
    memset(a, 0, sizeof(*a));
    if (PyBool_Check(v)) {
      a->type_index = kTVMFFIBool;
      a->v_int64 = v == Py_True;
    } else if (PyLong_Check(v)) {
      a->type_index = kTVMFFIInt;
      a->v_int64 = PyLong_AsLongLong(v);
    } else if (PyFloat_Check(v)) {
      a->type_index = kTVMFFIFloat;
      a->v_float64 = PyFloat_AS_DOUBLE(v);
    } else {
      Py_DECREF(c);
      return refuse(PyExc_TypeError, "make_caller: scalars must be ints or floats");
    }
    if (PyErr_Occurred()) {
      Py_DECREF(c);
      return NULL;
    }
    c->n_vals = (int32_t)i + 1;
  }
  PyObject_GC_Track((PyObject*)c);
  return (PyObject*)c;
}

/* set_strided(caller, strided): calls of `caller` on a slice of wider rows run `strided`, the same
 * call made for a kernel compiled for x's rows at any aligned stride. */
static PyObject* set_strided(PyObject* module, PyObject* args) {
  PyObject *dense, *strided;
  (void)module;
  if (!PyArg_ParseTuple(args, "O!O!", &CallerType, &dense, &CallerType, &strided)) return NULL;
  if (dense == strided || ((Caller*)strided)->strided != NULL)
    return refuse(PyExc_ValueError, "set_strided: the strided call must be another, without one of its own");
  if (((Caller*)dense)->n_in != ((Caller*)strided)->n_in || ((Caller*)dense)->n_out != ((Caller*)strided)->n_out)
    return refuse(PyExc_ValueError, "set_strided: the two calls must take and make the same tensors");
  ((Caller*)strided)->any_row_stride = 1;
  Py_INCREF(strided);
  /* (one it replaces is not let go: a backward may be running it without the GIL, native_api.h) */
  ((Caller*)dense)->strided = strided;
  Py_RETURN_NONE;
}

/* set_alternate(caller, other): calls of `caller` with an input of another dtype than it was made
 * for run `other`, the same op compiled for those dtypes (which may have an alternate of its own). */
static PyObject* set_alternate(PyObject* module, PyObject* args) {
  PyObject *first, *other;
  (void)module;
  if (!PyArg_ParseTuple(args, "O!O!", &CallerType, &first, &CallerType, &other)) return NULL;
  if (first == other || ((Caller*)other)->alternate == first)
    return refuse(PyExc_ValueError, "set_alternate: the alternate must be another call, not one that leads back");
  if (((Caller*)first)->n_in != ((Caller*)other)->n_in)
    return refuse(PyExc_ValueError, "set_alternate: the two calls must take the same inputs");
  Py_INCREF(other);
  ((Caller*)first)->alternate = other; /* (as set_strided's: one replaced is kept) */
  Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ Entry */

enum { MAX_SHAPES = 32 };

/* A differentiable call made in C++ (autograd_nodes.cpp's `grad_call`): op, then the call's
 * arguments. It returns the output, NULL with an error set, or Py_NotImplemented where it does not
 * take the call (functorch, torch.compile, an argument it does not parse): the Python call does. */
typedef PyObject* (*GradCall)(int op, PyObject* args, PyObject* kwargs);
static const char* const GRAD_CALL = "llmcompile.grad_call";

typedef struct {
  PyObject_HEAD
  int32_t n_calls;
  char grad; /* the op is differentiable: inputs that require grad go to Python */
  GradCall node; /* where set, they go to this C++ autograd node instead (op `node_op`) */
  int node_op;
  int node_ndim; /* calls without grad on an x of this many dims go to it too (the attention's 4-D); 0: none */
  uint64_t keys[MAX_SHAPES];
  PyObject* calls[MAX_SHAPES]; /* the Caller of each planned (dtype, N, dims of x) */
} Entry;

static PyObject* is_grad_enabled = NULL; /* torch.is_grad_enabled */
static PyObject* dunder_call = NULL;     /* "__call__", interned */
static PyObject* requires_grad = NULL;   /* "requires_grad", interned */
static PyObject* checked_call = NULL;    /* "_checked_call", interned */

/* what a Caller is planned for: x's dtype, its number of dims and its last dim */
static uint64_t key_of(uint8_t code, uint8_t bits, int32_t ndim, int64_t n) {
  return ((uint64_t)code << 56) | ((uint64_t)bits << 48) | ((uint64_t)(uint8_t)ndim << 40) | ((uint64_t)n & 0xFFFFFFFFFFull);
}

static int wants_grad(PyObject* args) {
  PyObject* on = PyObject_CallNoArgs(is_grad_enabled);
  Py_ssize_t i;
  if (on == NULL) return -1;
  Py_DECREF(on);
  if (on != Py_True) return 0;
  for (i = 0; i < PyTuple_GET_SIZE(args); ++i) {
    PyObject* r = PyObject_GetAttr(PyTuple_GET_ITEM(args, i), requires_grad);
    int yes;
    if (r == NULL) {
      PyErr_Clear(); /* not a tensor: the Caller refuses it */
      continue;
    }
    yes = PyObject_IsTrue(r);
    Py_DECREF(r);
    if (yes != 0) return yes;
  }
  return 0;
}

/* The Python `__call__` of the instance's class (install() saw that it has one), bound to it. */
static PyObject* entry_python_call(PyObject* self, PyObject* args, PyObject* kwargs) {
  PyObject* call = PyObject_GetAttr(self, dunder_call);
  PyObject* out;
  if (call == NULL) return NULL;
  out = PyObject_Call(call, args, kwargs);
  Py_DECREF(call);
  return out;
}

/* The call's first argument seen in `x`; 0 (no error set) where it is not a tensor torch can show,
 * or no call in C was made yet (torch's exchange API is found by the first): the Python call then. */
static int first_view(PyObject* args, DLTensor* x) {
  if (tensor_type == NULL || PyTuple_GET_SIZE(args) < 1) return 0;
  if (view_of(PyTuple_GET_ITEM(args, 0), x) != 0) {
    PyErr_Clear(); /* the Python call says what is wrong */
    return 0;
  }
  return 1;
}

/* The Caller planned for x's (dtype, dims, N), or NULL. */
static Caller* planned(Entry* e, const DLTensor* x) {
  uint64_t key;
  int32_t i;
  if (x->ndim < 1) return NULL;
  /* rows with leading dims take the Caller of 2-D rows, which flattens them */
  key = key_of(x->dtype.code, x->dtype.bits, x->ndim > 2 ? 2 : x->ndim, x->shape[x->ndim - 1]);
  for (i = 0; i < e->n_calls; ++i)
    if (e->keys[i] == key) return (Caller*)e->calls[i];
  return NULL;
}

/* The Python `_checked_call` with no scalars: what a call the planned Caller refused takes. */
static PyObject* entry_checked_call(PyObject* self, PyObject* args) {
  PyObject* no_scalars = PyDict_New();
  PyObject* out;
  if (no_scalars == NULL) return NULL;
  out = PyObject_CallMethodObjArgs(self, checked_call, args, no_scalars, NULL);
  Py_DECREF(no_scalars);
  return out;
}

/* A call without grad on an x of `node_ndim` dims (the attention's on SDPA's 4-D tensors, whose v
 * the node reads where it lies; a planned Caller takes (M, N, D) only, and its refusal costs more
 * than the call): the node's, else the Python call. */
static PyObject* node_else(PyObject* self, PyObject* args, PyObject* kwargs) {
  Entry* e = (Entry*)self;
  PyObject* out = e->node(e->node_op, args, kwargs);
  if (out != Py_NotImplemented) return out;
  Py_DECREF(out);
  return entry_python_call(self, args, kwargs);
}

static PyObject* entry_call(PyObject* self, PyObject* args, PyObject* kwargs) {
  Entry* e = (Entry*)self;
  DLTensor x;
  Caller* c;
  PyObject* out;
  int grad;
  int keywords = kwargs != NULL && PyDict_GET_SIZE(kwargs) > 0;
  if (is_grad_enabled == NULL) return refuse(PyExc_TypeError, "Entry: no class installed");
  /* a call that wants grad goes to the C++ node where there is one: the Python call and the
   * Python autograd wrapper between them cost a small forward with grad about 2.7 us (CPU) */
  if (e->grad && (e->node != NULL || (e->n_calls > 0 && !keywords))) {
    grad = wants_grad(args);
    if (grad < 0) return NULL;
    if (grad && e->node != NULL) {
      out = e->node(e->node_op, args, kwargs);
      if (out != Py_NotImplemented) return out;
      Py_DECREF(out);
    }
    if (grad) return entry_python_call(self, args, kwargs);
  }
  if (keywords || (e->n_calls == 0 && e->node_ndim == 0) || !first_view(args, &x))
    return entry_python_call(self, args, kwargs);
  if (e->node_ndim > 0 && x.ndim == e->node_ndim) return node_else(self, args, kwargs);
  c = planned(e, &x);
  if (c == NULL) return entry_python_call(self, args, kwargs);
  out = caller_invoke(c, &PyTuple_GET_ITEM(args, 0), PyTuple_GET_SIZE(args));
  if (out != NULL || !(PyErr_ExceptionMatches(PyExc_ValueError) || PyErr_ExceptionMatches(PyExc_TypeError)))
    return out;
  /* the kernel's checks refused what else differs from call to call (dtypes of the other
   * tensors, strides, alignment, one M across them): the checked path takes the call */
  PyErr_Clear();
  return entry_checked_call(self, args);
}

static PyObject* entry_set_call(PyObject* self, PyObject* args) {
  Entry* e = (Entry*)self;
  int code, bits, ndim;
  long long n;
  PyObject* caller;
  uint64_t key;
  int32_t i;
  if (!PyArg_ParseTuple(args, "iiiLO!", &code, &bits, &ndim, &n, &CallerType, &caller)) return NULL;
  key = key_of((uint8_t)code, (uint8_t)bits, ndim, n);
  for (i = 0; i < e->n_calls; ++i) {
    if (e->keys[i] == key) {
      Py_INCREF(caller);
      Py_SETREF(e->calls[i], caller);
      Py_RETURN_TRUE;
    }
  }
  if (e->n_calls == MAX_SHAPES) Py_RETURN_FALSE; /* that (dtype, N) keeps to the Python call */
  Py_INCREF(caller);
  e->keys[e->n_calls] = key;
  e->calls[e->n_calls++] = caller;
  Py_RETURN_TRUE;
}

static PyObject* entry_clear_calls(PyObject* self, PyObject* unused) {
  Entry* e = (Entry*)self;
  (void)unused;
  while (e->n_calls > 0) Py_CLEAR(e->calls[--e->n_calls]);
  Py_RETURN_NONE;
}

static PyObject* entry_set_node(PyObject* self, PyObject* args) {
  Entry* e = (Entry*)self;
  PyObject* capsule;
  int op, ndim = 0;
  void* fn;
  if (!PyArg_ParseTuple(args, "Oi|i", &capsule, &op, &ndim)) return NULL;
  if (capsule == Py_None) {
    e->node = NULL;
    e->node_ndim = 0;
    Py_RETURN_NONE;
  }
  fn = PyCapsule_GetPointer(capsule, GRAD_CALL);
  if (fn == NULL) return NULL;
  /* (the capsule's library stays loaded for the process: Python never unloads an extension) */
  e->node = (GradCall)fn;
  e->node_op = op;
  e->node_ndim = ndim;
  Py_RETURN_NONE;
}

static PyObject* entry_c_calls(PyObject* self, PyObject* unused) {
  (void)unused;
  return PyLong_FromLong(((Entry*)self)->n_calls);
}

static int entry_traverse(PyObject* self, visitproc visit, void* arg) {
  Entry* e = (Entry*)self;
  int32_t i;
  for (i = 0; i < e->n_calls; ++i) Py_VISIT(e->calls[i]);
  return 0;
}

static int entry_clear(PyObject* self) {
  Py_XDECREF(entry_clear_calls(self, NULL));
  return 0;
}

static void entry_dealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  entry_clear(self);
  Py_TYPE(self)->tp_free(self);
}

static PyMemberDef entry_members[] = {
    {"_grad", T_BOOL, offsetof(Entry, grad), 0, "inputs that require grad take the Python call"},
    {NULL, 0, 0, 0, NULL},
};

static PyMethodDef entry_methods[] = {
    {"_set_call", entry_set_call, METH_VARARGS,
     "_set_call(code, bits, ndim, n, caller): calls on an x of that dtype, dims and last dim run caller in C; "
     "False where the table is full"},
    {"_clear_calls", entry_clear_calls, METH_NOARGS, "forget every Caller"},
    {"_c_calls", entry_c_calls, METH_NOARGS, "how many (dtype, dims, N) a call runs in C"},
    {"_set_node", entry_set_node, METH_VARARGS,
     "_set_node(capsule, op, ndim=0): calls that want grad go to that C++ grad_call (None: to Python); "
     "ndim: so do calls without grad on an x of that many dims"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject EntryType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "llmcompile_native.Entry",
    .tp_basicsize = sizeof(Entry),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The C call of a kernel function class; see install().",
    .tp_new = PyType_GenericNew,
    .tp_call = entry_call,
    .tp_members = entry_members,
    .tp_methods = entry_methods,
    .tp_traverse = entry_traverse,
    .tp_clear = entry_clear,
    .tp_dealloc = entry_dealloc,
};

static PyObject* install(PyObject* module, PyObject* args) {
  PyObject *cls, *grad, *call;
  PyTypeObject* type;
  int is_function;
  (void)module;
  if (!PyArg_ParseTuple(args, "O!O", &PyType_Type, &cls, &grad)) return NULL;
  type = (PyTypeObject*)cls;
  if (!PyType_IsSubtype(type, &EntryType) || !(type->tp_flags & Py_TPFLAGS_HEAPTYPE))
    return refuse(PyExc_TypeError, "install: the class must be a Python subclass of Entry");
  call = PyObject_GetAttr(cls, dunder_call);
  if (call == NULL) return NULL;
  is_function = PyFunction_Check(call);
  Py_DECREF(call);
  if (!is_function) return refuse(PyExc_TypeError, "install: the class must define __call__ in Python");
  Py_INCREF(grad);
  Py_XSETREF(is_grad_enabled, grad);
  /* The class's own `__call__` made the slot call that Python function; the slot now runs the C
   * call, which hands to that function what it does not take. Reassigning `cls.__call__` would
   * undo this (and leave a correct, slower class). */
  type->tp_call = entry_call;
  PyType_Modified(type);
  Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ C++ (native_api.h) */

enum { MAX_KEPT = 256 };
static PyObject* kept[MAX_KEPT]; /* the Callers a C++ node may run: held for the process */
static int32_t n_kept = 0;

/* `c`, kept for the process (a node may run it after its kernel function planned anew), or NULL
 * where this many are kept already */
static void* keep(PyObject* c) {
  int32_t i;
  for (i = 0; i < n_kept; ++i)
    if (kept[i] == c) return c;
  if (n_kept == MAX_KEPT) return NULL; /* (a process planning this many shapes keeps the Python path) */
  Py_INCREF(c);
  kept[n_kept++] = c;
  return c;
}

static void* api_caller_for(void* fn, uint8_t code, uint8_t bits, int32_t ndim, int64_t n) {
  Entry* e = (Entry*)fn;
  uint64_t key;
  int32_t i;
  if (fn == NULL || !PyObject_TypeCheck((PyObject*)fn, &EntryType) || ndim < 1) return NULL;
  key = key_of(code, bits, ndim > 2 ? 2 : ndim, n);
  for (i = 0; i < e->n_calls; ++i)
    if (e->keys[i] == key) return keep(e->calls[i]);
  return NULL;
}

static void* api_as_caller(void* obj) {
  return obj != NULL && Py_IS_TYPE((PyObject*)obj, &CallerType) ? keep((PyObject*)obj) : NULL;
}

static int api_run(void* caller, const void* ins, int32_t n_in, NativeAlloc alloc, void* ctx) {
  const char* why;
  return caller_run((Caller*)caller, (const DLTensor*)ins, n_in, alloc, ctx, &why);
}

static const NativeApi native_api = {NATIVE_API_VERSION, api_caller_for, api_run, raise_ffi_error, api_as_caller};

static PyMethodDef methods[] = {
    {"make_caller", make_caller, METH_VARARGS, "make_caller(fn, n_in, specs, values, bound) -> Caller"},
    {"install", install, METH_VARARGS, "install(cls, torch.is_grad_enabled): cls instances call through C"},
    {"set_strided", set_strided, METH_VARARGS, "set_strided(caller, strided): slices of wider rows call strided"},
    {"set_alternate", set_alternate, METH_VARARGS, "set_alternate(caller, other): other dtypes call other"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "llmcompile_native", "The eager call of a compiled kernel, in C.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit_llmcompile_native(void) {
  PyObject* m;
  if (PyType_Ready(&CallerType) < 0 || PyType_Ready(&EntryType) < 0) return NULL;
  requires_grad = PyUnicode_InternFromString("requires_grad");
  checked_call = PyUnicode_InternFromString("_checked_call");
  dunder_call = PyUnicode_InternFromString("__call__");
  if (requires_grad == NULL || checked_call == NULL || dunder_call == NULL) return NULL;
  m = PyModule_Create(&module_def);
  if (m == NULL) return NULL;
  Py_INCREF(&CallerType);
  Py_INCREF(&EntryType);
  if (PyModule_AddObject(m, "Caller", (PyObject*)&CallerType) < 0 ||
      PyModule_AddObject(m, "Entry", (PyObject*)&EntryType) < 0 ||
      PyModule_AddObject(m, "native_api", PyCapsule_New((void*)&native_api, "llmcompile.native_api", NULL)) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
