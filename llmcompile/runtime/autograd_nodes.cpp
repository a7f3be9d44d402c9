/* The differentiable calls of the row ops as C++ autograd nodes (issue 47).
 *
 * A torch.autograd.Function in Python costs a training step tens of microseconds of host time
 * that torch's own ops, C++ nodes, do not: the Python forward, ctx, and above all the backward,
 * which the autograd engine runs through Python. Here each op's node is C++. Its forward and
 * backward call our kernel functions (`KernelFunction` instances, whose call starts and ends in
 * C, native_call.c) through the CPython API: no Python line runs on a planned shape.
 *
 * `register_op(op, forward, backward, backward_scalar)` gives op number `op` its kernel functions
 * (the forward that also writes what the backward reads, the backward, and, where the op has one,
 * the backward for an upstream gradient of one value everywhere), once per process. The
 * scalars reach a kernel function as keywords only where they differ from its defaults (a call
 * with keywords goes through Python; one without stays in C), and after the first such call of a
 * shape, not at all: the kernel function's fast call with them bound is kept here (`Given`).
 */
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/extension.h>

#include <cmath>

#include <vector>

namespace py = pybind11;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

enum Op { SOFTMAX = 0, LOG_SOFTMAX, RMSNORM, LAYERNORM, N_OPS };

/* A forward's fast call with a non-default eps bound (KernelFunction.fast_call), by what it was
 * made for: x's dtype, last dim and rank, and eps. */
struct Given {
  at::ScalarType dtype;
  int64_t n, dim;
  double eps;
  py::object call;
};

struct Kernels {
  py::object forward, backward, backward_scalar;  // backward_scalar: None where the op has none
  std::vector<Given> given;                        // (a model passes one or two eps: a short list)
  double eps = NAN, kernel_eps = NAN;  // a norm's eps where the call gives none; the forward kernel's own
};

std::vector<Kernels>& registry() {
  static auto* ops = new std::vector<Kernels>(N_OPS); /* held for the process: never destroyed after Python */
  return *ops;
}

Kernels& kernels_of(int64_t op) {
  Kernels& k = registry().at(op);
  TORCH_CHECK(k.forward && k.backward, "llmcompile autograd node: op ", op, " has no kernels registered");
  return k;
}

/* A kernel function's outputs: one tensor, or a list of them. */
std::vector<at::Tensor> outputs(const py::object& out) {
  if (py::isinstance<py::list>(out) || py::isinstance<py::tuple>(out)) return out.cast<std::vector<at::Tensor>>();
  return {out.cast<at::Tensor>()};
}

/* dy as the backward kernels read it: x's dtype, dense rows (an upstream gradient from .sum()
 * arrives expanded, stride 0). */
at::Tensor rows_like(const at::Tensor& g, const at::Tensor& like) {
  return (g.scalar_type() == like.scalar_type() ? g : g.to(like.scalar_type())).contiguous();
}

/* `.sum()` hands the backward its gradient expanded from one element (every stride
 * 0): that element as a (1,) tensor in `like`'s dtype, or an undefined tensor where g is anything
 * else. Read in place, it saves the dense copy (one more launch, and most of a small step's host
 * time beyond torch's on the H100). */
at::Tensor one_value(const at::Tensor& g, const at::Tensor& like) {
  if (g.numel() < 2) return at::Tensor();
  for (int64_t s : g.strides())
    if (s != 0) return at::Tensor();
  at::Tensor c = g.as_strided({1}, {1});
  return c.scalar_type() == like.scalar_type() ? c : c.to(like.scalar_type());
}

/* (reads a py::object's pointer alone: no GIL needed) */
bool has(const py::object& fn) { return fn && !fn.is_none(); }

/* Op is SOFTMAX or LOG_SOFTMAX: a template argument, not ctx->saved_data, whose string-keyed map
 * cost each call a hash insert and lookup. */
template <int Op>
struct SoftmaxNode : public torch::autograd::Function<SoftmaxNode<Op>> {
  /* (forward runs in the caller's thread, which holds the GIL; backward in the autograd engine's,
   * which does not: it takes it to call the kernel function) */
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    at::Tensor y = kernels_of(Op).forward(x).template cast<at::Tensor>();
    ctx->save_for_backward({y});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor y = ctx->get_saved_variables()[0];
    const Kernels& k = kernels_of(Op);
    at::Tensor c = one_value(grads[0], y);
    if (c.defined() && has(k.backward_scalar)) {
      py::gil_scoped_acquire gil;
      return {k.backward_scalar(y, c).template cast<at::Tensor>()};
    }
    at::Tensor dy = rows_like(grads[0], y);
    py::gil_scoped_acquire gil;
    return {k.backward(dy, y).template cast<at::Tensor>()};
  }
};

at::Tensor softmax_node(const at::Tensor& x, int64_t op) {
  TORCH_CHECK(op == SOFTMAX || op == LOG_SOFTMAX, "llmcompile autograd node: op ", op, " is not a softmax");
  return op == SOFTMAX ? SoftmaxNode<SOFTMAX>::apply(x) : SoftmaxNode<LOG_SOFTMAX>::apply(x);
}

/* The forward with `eps`: the kernel function's own call where eps is its default (it stays in
 * C); else its fast call with eps bound, kept in `k.given` once made, and where there is none yet,
 * or it refuses these tensors, the call with eps by keyword (which plans the shape, or says
 * what is wrong). Runs in the caller's thread, which holds the GIL. */
py::object call_with_eps(Kernels& k, double eps, bool given, py::args args) {
  if (!given) return k.forward(*args);
  const at::Tensor x = args[0].cast<at::Tensor>();
  Given* hit = nullptr;
  for (Given& g : k.given)
    if (g.dtype == x.scalar_type() && g.n == x.size(-1) && g.dim == x.dim() && g.eps == eps) hit = &g;
  if (hit == nullptr && py::hasattr(k.forward, "fast_call")) {
    py::object call = k.forward.attr("fast_call")(args[0], py::arg("eps") = eps);
    if (!call.is_none()) {
      if (k.given.size() >= 16) k.given.clear();
      k.given.push_back(Given{x.scalar_type(), x.size(-1), x.dim(), eps, call});
      hit = &k.given.back();
    }
  }
  if (hit != nullptr) {
    try {
      return hit->call(*args);
    } catch (py::error_already_set&) {  // refused before its launch: the checked call takes it
    }
  }
  return k.forward(*args, py::arg("eps") = eps);
}

/* A norm's dx, dw (and db) from upstream gradient g and what its forward saved, (x, w, statistics):
 * the backward for one value where g is one (`one_value`), else the rows backward with g dense.
 * (in the autograd engine's thread, which takes the GIL only to call the kernel function) */
std::vector<at::Tensor> norm_grads(const Kernels& k, const at::Tensor& g, const variable_list& saved) {
  const at::Tensor& x = saved[0];
  at::Tensor c = one_value(g, x);
  const bool one = c.defined() && has(k.backward_scalar);
  at::Tensor dy = one ? at::Tensor() : rows_like(g, x);
  py::gil_scoped_acquire gil;
  py::list args;
  args.append(one ? x : dy);
  args.append(one ? c : x);
  for (size_t i = 1; i < saved.size(); ++i) args.append(saved[i]);
  return outputs((one ? k.backward_scalar : k.backward)(*args));
}

struct RMSNormNode : public torch::autograd::Function<RMSNormNode> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x0, const at::Tensor& w, double eps, bool given) {
    at::Tensor x = x0.contiguous();
    auto outs = outputs(call_with_eps(kernels_of(RMSNORM), eps, given, py::make_tuple(x, w)));
    ctx->save_for_backward({x, w, outs.at(1)});
    return outs.at(0);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto d = norm_grads(kernels_of(RMSNORM), grads[0], ctx->get_saved_variables());
    return {d.at(0), d.at(1), at::Tensor(), at::Tensor()};
  }
};

struct LayerNormNode : public torch::autograd::Function<LayerNormNode> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x0, const at::Tensor& w, const at::Tensor& b,
                            double eps, bool given) {
    at::Tensor x = x0.contiguous();
    auto outs = outputs(call_with_eps(kernels_of(LAYERNORM), eps, given, py::make_tuple(x, w, b)));
    ctx->save_for_backward({x, w, outs.at(1), outs.at(2)});
    return outs.at(0);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto d = norm_grads(kernels_of(LAYERNORM), grads[0], ctx->get_saved_variables());
    return {d.at(0), d.at(1), d.at(2), at::Tensor(), at::Tensor()};
  }
};

void register_op(int64_t op, py::object forward, py::object backward, py::object backward_scalar, double eps,
                 double kernel_eps) {
  TORCH_CHECK(op >= 0 && op < N_OPS, "llmcompile autograd node: no op ", op);
  registry()[op] = Kernels{std::move(forward), std::move(backward), std::move(backward_scalar), {}, eps, kernel_eps};
}

/* What sends a call back to the Python Functions, asked as autograd.py's `_nodes` asks it:
 * torch.compile tracing (torch.compiler's `_is_compiling_flag`, what its is_compiling() returns
 * outside TorchScript, read without that function's two Python calls; the function itself where
 * the flag is gone), functorch transforms active, a functorch-wrapped tensor. Set once by
 * `set_guards`; never destroyed (held for the process, as the registry). */
struct Guards {
  PyObject *compiler = nullptr, *is_compiling = nullptr, *functorch_active = nullptr, *is_wrapped = nullptr;
  PyObject* flag = nullptr;  // "_is_compiling_flag", interned
};
Guards& guards() {
  static auto* g = new Guards();
  return *g;
}

void set_guards(py::object compiler, py::object functorch_active, py::object is_wrapped) {
  Guards& g = guards();
  g.is_compiling = py::object(compiler.attr("is_compiling")).release().ptr();
  g.compiler = compiler.release().ptr();
  g.functorch_active = functorch_active.release().ptr();
  g.is_wrapped = is_wrapped.release().ptr();
  g.flag = PyUnicode_InternFromString("_is_compiling_flag");
}

/* 1 where fn(arg...) is True, 0 where not, -1 with a Python error set */
int truth(PyObject* fn, PyObject* arg) {
  PyObject* r = arg == nullptr ? PyObject_CallNoArgs(fn) : PyObject_CallOneArg(fn, arg);
  if (r == nullptr) return -1;
  const int yes = PyObject_IsTrue(r);
  Py_DECREF(r);
  return yes;
}

PyObject* not_taken() {
  Py_INCREF(Py_NotImplemented);
  return Py_NotImplemented;
}

/* The differentiable call of `op` from the kernel function's C call (native_call.c's Entry, a
 * call with an input that requires grad): softmax(x); rmsnorm(x, w[, eps]); layernorm(x, w, b[,
 * eps]), eps also by keyword. What autograd.py's Python wrappers did, in C++: the arguments
 * parsed, the guards asked, the node applied. Py_NotImplemented where the Python call must take
 * it (the guards, or arguments it does not parse: that call says what is wrong). */
PyObject* grad_call(int op, PyObject* args, PyObject* kwargs) {
  try {  // (not HANDLE_TH_ERRORS: its warning buffer costs a small call more than the rest of this)
  if (op < 0 || op >= N_OPS) return not_taken();
  const Kernels& k = registry()[op];
  const Guards& g = guards();
  if (!k.forward || g.is_wrapped == nullptr) return not_taken();
  const Py_ssize_t tensors = op == LAYERNORM ? 3 : op == RMSNORM ? 2 : 1;
  const bool norm = tensors > 1;
  const Py_ssize_t n = PyTuple_GET_SIZE(args);
  if (n < tensors || n > tensors + (norm ? 1 : 0)) return not_taken();
  PyObject* eps_arg = n > tensors ? PyTuple_GET_ITEM(args, tensors) : nullptr;
  if (kwargs != nullptr && PyDict_GET_SIZE(kwargs) > 0) {
    if (!norm || eps_arg != nullptr || PyDict_GET_SIZE(kwargs) != 1) return not_taken();
    eps_arg = PyDict_GetItemString(kwargs, "eps");  // (borrowed)
    if (eps_arg == nullptr) return not_taken();
  }
  double eps = k.eps;
  if (norm && eps_arg == nullptr && std::isnan(eps)) return not_taken();  // (no default registered)
  if (eps_arg != nullptr) {
    if (!PyFloat_Check(eps_arg) && !PyLong_Check(eps_arg)) return not_taken();
    eps = PyFloat_AsDouble(eps_arg);
    if (eps == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      return not_taken();
    }
  }
  int on;
  if (PyObject* flag = PyObject_GetAttr(g.compiler, g.flag)) {
    on = PyObject_IsTrue(flag);
    Py_DECREF(flag);
  } else {
    PyErr_Clear();
    on = truth(g.is_compiling, nullptr);
  }
  if (on == 0) on = truth(g.functorch_active, nullptr);
  for (Py_ssize_t i = 0; i < tensors && on == 0; ++i) {
    PyObject* t = PyTuple_GET_ITEM(args, i);
    if (!THPVariable_Check(t)) return not_taken();
    on = truth(g.is_wrapped, t);
  }
  if (on != 0) return on < 0 ? nullptr : not_taken();
  const at::Tensor& x = THPVariable_Unpack(PyTuple_GET_ITEM(args, 0));
  if (!norm) return THPVariable_Wrap(softmax_node(x, op));
  const at::Tensor& w = THPVariable_Unpack(PyTuple_GET_ITEM(args, 1));
  const bool given = std::isnan(k.kernel_eps) || eps != k.kernel_eps;
  if (op == RMSNORM) return THPVariable_Wrap(RMSNormNode::apply(x, w, eps, given));
  return THPVariable_Wrap(LayerNormNode::apply(x, w, THPVariable_Unpack(PyTuple_GET_ITEM(args, 2)), eps, given));
  } catch (py::error_already_set& e) {  // a kernel function's error, as it raised it
    e.restore();
  } catch (...) {
    torch::translate_exception_to_python(std::current_exception());
  }
  return nullptr;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "The row ops' autograd nodes in C++ (llmcompile/runtime/autograd_native.py).";
  m.attr("SOFTMAX") = static_cast<int>(SOFTMAX);
  m.attr("LOG_SOFTMAX") = static_cast<int>(LOG_SOFTMAX);
  m.attr("RMSNORM") = static_cast<int>(RMSNORM);
  m.attr("LAYERNORM") = static_cast<int>(LAYERNORM);
  m.def("register_op", &register_op, py::arg("op"), py::arg("forward"), py::arg("backward"),
        py::arg("backward_scalar") = py::none(), py::arg("eps") = NAN, py::arg("kernel_eps") = NAN,
        "register_op(op, forward, backward, backward_scalar=None, eps=nan, kernel_eps=nan): the op's kernel "
        "functions, and a norm's eps where a call gives none and its forward kernel's own");
  m.def("set_guards", &set_guards, py::arg("compiler"), py::arg("functorch_active"), py::arg("is_wrapped"),
        "set_guards(torch.compiler, functorch_active, is_wrapped): what sends grad_call's calls back to Python");
  // native_call.c's Entry calls it (Entry._set_node): a C function pointer, no Python between
  m.attr("grad_call") = py::capsule(reinterpret_cast<void*>(&grad_call), "llmcompile.grad_call");
  m.def(
      "softmax", &softmax_node,
      "softmax(x, op): SOFTMAX or LOG_SOFTMAX through autograd");
  m.def(
      "rmsnorm",
      [](const at::Tensor& x, const at::Tensor& w, double eps, bool given) {
        return RMSNormNode::apply(x, w, eps, given);
      },
      "rmsnorm(x, weight, eps, eps_given) through autograd");
  m.def(
      "layernorm",
      [](const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps, bool given) {
        return LayerNormNode::apply(x, w, b, eps, given);
      },
      "layernorm(x, weight, bias, eps, eps_given) through autograd");
}
