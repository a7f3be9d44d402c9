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
#include <torch/csrc/autograd/custom_function.h>
#include <torch/extension.h>

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

struct SoftmaxNode : public torch::autograd::Function<SoftmaxNode> {
  /* (forward runs in the caller's thread, which holds the GIL; backward in the autograd engine's,
   * which does not: it takes it to call the kernel function) */
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t op) {
    at::Tensor y = kernels_of(op).forward(x).cast<at::Tensor>();
    ctx->save_for_backward({y});
    ctx->saved_data["op"] = op;
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor y = ctx->get_saved_variables()[0];
    const int64_t op = ctx->saved_data["op"].toInt();
    const Kernels& k = kernels_of(op);
    at::Tensor c = one_value(grads[0], y);
    if (c.defined() && has(k.backward_scalar)) {
      py::gil_scoped_acquire gil;
      return {k.backward_scalar(y, c).cast<at::Tensor>(), at::Tensor()};
    }
    at::Tensor dy = rows_like(grads[0], y);
    py::gil_scoped_acquire gil;
    return {k.backward(dy, y).cast<at::Tensor>(), at::Tensor()};
  }
};

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

void register_op(int64_t op, py::object forward, py::object backward, py::object backward_scalar) {
  TORCH_CHECK(op >= 0 && op < N_OPS, "llmcompile autograd node: no op ", op);
  registry()[op] = Kernels{std::move(forward), std::move(backward), std::move(backward_scalar), {}};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "The row ops' autograd nodes in C++ (llmcompile/runtime/autograd_native.py).";
  m.attr("SOFTMAX") = static_cast<int>(SOFTMAX);
  m.attr("LOG_SOFTMAX") = static_cast<int>(LOG_SOFTMAX);
  m.attr("RMSNORM") = static_cast<int>(RMSNORM);
  m.attr("LAYERNORM") = static_cast<int>(LAYERNORM);
  m.def("register_op", &register_op, py::arg("op"), py::arg("forward"), py::arg("backward"),
        py::arg("backward_scalar") = py::none(),
        "register_op(op, forward, backward, backward_scalar=None): the op's kernel functions");
  m.def(
      "softmax", [](const at::Tensor& x, int64_t op) { return SoftmaxNode::apply(x, op); },
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
