/* The differentiable calls of the row ops as C++ autograd nodes (issue 47).
 *
 * A torch.autograd.Function in Python costs a training step tens of microseconds of host time
 * that torch's own ops, C++ nodes, do not: the Python forward, ctx, and above all the backward,
 * which the autograd engine runs through Python. Here each op's node is C++. Its forward and
 * backward call our kernel functions (`KernelFunction` instances, whose call starts and ends in
 * C, native_call.c) through the CPython API: no Python line runs on a planned shape.
 *
 * `register_op(op, forward, backward)` gives op number `op` its two kernel functions (the
 * forward that also writes what the backward reads, and the backward), once per process. The
 * scalars reach a kernel function as keywords only where they differ from its defaults (a call
 * with keywords goes through Python; one without stays in C).
 */
#include <torch/csrc/autograd/custom_function.h>
#include <torch/extension.h>

#include <vector>

namespace py = pybind11;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

enum Op { SOFTMAX = 0, LOG_SOFTMAX, RMSNORM, LAYERNORM, N_OPS };

struct Kernels {
  py::object forward, backward;
};

std::vector<Kernels>& registry() {
  static auto* ops = new std::vector<Kernels>(N_OPS); /* held for the process: never destroyed after Python */
  return *ops;
}

const Kernels& kernels_of(int64_t op) {
  const Kernels& k = registry().at(op);
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
    at::Tensor dy = rows_like(grads[0], y);
    py::gil_scoped_acquire gil;
    at::Tensor dx = kernels_of(op).backward(dy, y).cast<at::Tensor>();
    return {dx, at::Tensor()};
  }
};

/* `eps` by keyword where it is not the kernel's default, so the default's call stays in C */
py::object call_with_eps(const py::object& fn, double eps, bool given, py::args args) {
  if (!given) return fn(*args);
  return fn(*args, py::arg("eps") = eps);
}

struct RMSNormNode : public torch::autograd::Function<RMSNormNode> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x0, const at::Tensor& w, double eps, bool given) {
    at::Tensor x = x0.contiguous();
    auto outs = outputs(call_with_eps(kernels_of(RMSNORM).forward, eps, given, py::make_tuple(x, w)));
    ctx->save_for_backward({x, w, outs.at(1)});
    return outs.at(0);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    at::Tensor dy = rows_like(grads[0], saved[0]);
    py::gil_scoped_acquire gil;
    auto d = outputs(kernels_of(RMSNORM).backward(dy, saved[0], saved[1], saved[2]));
    return {d.at(0), d.at(1), at::Tensor(), at::Tensor()};
  }
};

struct LayerNormNode : public torch::autograd::Function<LayerNormNode> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x0, const at::Tensor& w, const at::Tensor& b,
                            double eps, bool given) {
    at::Tensor x = x0.contiguous();
    auto outs = outputs(call_with_eps(kernels_of(LAYERNORM).forward, eps, given, py::make_tuple(x, w, b)));
    ctx->save_for_backward({x, w, outs.at(1), outs.at(2)});
    return outs.at(0);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    at::Tensor dy = rows_like(grads[0], saved[0]);
    py::gil_scoped_acquire gil;
    auto d = outputs(kernels_of(LAYERNORM).backward(dy, saved[0], saved[1], saved[2], saved[3]));
    return {d.at(0), d.at(1), d.at(2), at::Tensor(), at::Tensor()};
  }
};

void register_op(int64_t op, py::object forward, py::object backward) {
  TORCH_CHECK(op >= 0 && op < N_OPS, "llmcompile autograd node: no op ", op);
  registry()[op] = Kernels{std::move(forward), std::move(backward)};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "The row ops' autograd nodes in C++ (llmcompile/runtime/autograd_native.py).";
  m.attr("SOFTMAX") = static_cast<int>(SOFTMAX);
  m.attr("LOG_SOFTMAX") = static_cast<int>(LOG_SOFTMAX);
  m.attr("RMSNORM") = static_cast<int>(RMSNORM);
  m.attr("LAYERNORM") = static_cast<int>(LAYERNORM);
  m.def("register_op", &register_op, "register_op(op, forward, backward): the op's kernel functions");
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
