/* The differentiable calls of the row ops as C++ autograd nodes (issue 47).
 *
 * A torch.autograd.Function in Python costs a training step tens of microseconds of host time
 * that torch's own ops, C++ nodes, do not: the Python forward, ctx, and above all the backward,
 * which the autograd engine runs through Python. Here each op's node is C++. Its forward and
 * backward run the planned C call (a `Caller`, native_call.c) of our kernel functions
 * (`KernelFunction` instances) from C++ (native_api.h): no Python object is made on a planned
 * shape, outputs come from at::empty, and a backward takes no GIL (native_api.h says why). Where
 * nothing is planned, or the Caller refuses the tensors, the kernel function is called through
 * the CPython API, which plans the shape or says what is wrong.
 *
 * `register_op(op, forward, backward, backward_scalar, eps, kernel_eps)` gives op number `op` its
 * kernel functions (the forward that also writes what the backward reads, the backward, and, where
 * the op has one, the backward for an upstream gradient of one value everywhere), once per
 * process. `grad_call` is the call a kernel function's C call makes for inputs that require grad
 * (native_call.c's Entry, through a capsule), so a forward with grad runs no Python line. The
 * scalars reach a kernel function as keywords only where they differ from its defaults (a call
 * with keywords goes through Python; one without stays in C), and after the first such call of a
 * shape, not at all: the kernel function's fast call with them bound is kept here (`Given`).
 * `cross_entropy_loss`'s node (`LossBackward`) runs a forward call and, in its backward, `scale_`.
 */
#include <ATen/DLConvertor.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/extension.h>

#include <array>
#include <atomic>
#include <cmath>
#include <exception>
#include <optional>
#include <mutex>
#include <type_traits>

#include <vector>

#include "native_api.h"

namespace py = pybind11;
using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

/* torch up to 2.11 holds autograd nodes by std::shared_ptr, made with this deleter (it frees a
 * long chain without deep recursion); later releases by c10::intrusive_ptr, and have no deleter.
 * Declared here so that both compile; only the shared_ptr branch below uses it. */
namespace torch::autograd {
TORCH_API void deleteNode(Node* function);
}

namespace {

// CE_LOSS: no backward kernel; CE_TOTAL: the loss where no gradient is wanted (no backward at all)
enum Op { SOFTMAX = 0, LOG_SOFTMAX, RMSNORM, LAYERNORM, CE_LOSS, CE_TOTAL, N_OPS };

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

/* native_call.c's entry points (native_api.h), set once by `set_native`; null where the C call
 * was not built: every backward then calls its kernel function through Python. */
const NativeApi* native = nullptr;

void set_native(py::object capsule) {
  if (capsule.is_none()) {
    native = nullptr;
    return;
  }
  auto* api = static_cast<const NativeApi*>(PyCapsule_GetPointer(capsule.ptr(), "llmcompile.native_api"));
  if (api == nullptr) throw py::error_already_set();
  TORCH_CHECK(api->version == NATIVE_API_VERSION, "llmcompile autograd node: native_call's API is version ",
              api->version, ", these nodes need ", NATIVE_API_VERSION);
  native = api;
}

/* backward launches: through `native` without the GIL, through Python with it; forwards with grad:
 * through `native`, through Python (tests read these) */
std::atomic<int64_t> gil_free_runs{0}, python_runs{0}, forward_native_runs{0}, forward_python_runs{0};
std::atomic<int64_t> forward_strided_v_runs{0};  // attention forwards through the strided-v call

/* The Caller planned in kernel function `fn` for rows like `t` (GIL held: the forward's thread). */
void* caller_for(const py::object& fn, const at::Tensor& t) {
  if (native == nullptr || !has(fn) || t.dim() < 1) return nullptr;
  const DLDataType d = at::getDLDataType(t);
  return native->caller_for(fn.ptr(), d.code, d.bits, static_cast<int32_t>(t.dim()), t.size(-1));
}

DLTensor view(const at::Tensor& t) {
  DLTensor d{};
  d.data = t.data_ptr();
  d.device = t.is_cuda() ? DLDevice{kDLCUDA, static_cast<int32_t>(t.get_device())} : DLDevice{kDLCPU, 0};
  d.ndim = static_cast<int32_t>(t.dim());
  d.dtype = at::getDLDataType(t);
  d.shape = const_cast<int64_t*>(t.sizes().data());
  d.strides = const_cast<int64_t*>(t.strides().data());
  return d;
}

struct Made {
  std::vector<at::Tensor> outs;
  std::exception_ptr error;
};

int alloc_output(void* ctx, const void* proto, void* out) {
  auto* made = static_cast<Made*>(ctx);
  const auto* p = static_cast<const DLTensor*>(proto);
  try {
    const at::Device device = p->device.device_type == kDLCUDA ? at::Device(at::kCUDA, p->device.device_id) : at::Device(at::kCPU);
    made->outs.push_back(
        at::empty(at::IntArrayRef(p->shape, p->ndim), at::TensorOptions().dtype(at::toScalarType(p->dtype)).device(device)));
    *static_cast<DLTensor*>(out) = view(made->outs.back());
    return 0;
  } catch (...) {
    made->error = std::current_exception();
    return -1;
  }
}

/* Caller `caller`'s kernel on `ins`, no Python object touched (a backward runs it in the autograd
 * engine's thread without the GIL; a forward with grad in the caller's, where its outputs are then
 * torch's own tensors, not DLPack imports): its outputs, or none where it refused them (the caller
 * then calls the kernel function through Python, which takes what this does not, or says what is
 * wrong). A failed launch raises its error. */
std::optional<std::vector<at::Tensor>> run_native(void* caller, const std::vector<at::Tensor>& ins) {
  if (caller == nullptr) return std::nullopt;
  DLTensor views[16];
  TORCH_CHECK(ins.size() <= 16, "llmcompile autograd node: too many inputs");
  for (size_t i = 0; i < ins.size(); ++i) views[i] = view(ins[i]);
  Made made;
  made.outs.reserve(4);
  const int rc = native->run(caller, views, static_cast<int32_t>(ins.size()), alloc_output, &made);
  if (rc == RUN_OK) return std::move(made.outs);
  if (rc == RUN_NO_MEMORY && made.error) std::rethrow_exception(made.error);
  if (rc == RUN_FAILED) {
    py::gil_scoped_acquire gil;
    native->raise_failure();
    throw py::error_already_set();
  }
  return std::nullopt;
}

/* Our nodes are plain `torch::autograd::Node`s, made the way torch's generated ones are: the
 * output's history set, what the backward reads saved. Not `torch::autograd::Function`: its
 * apply (a context, input and output records, wrapped outputs) cost a forward with grad about
 * 2.5 us of host time on the H100 where torch's nodes cost 0.2 (evals/results/host-time). They
 * do not support forward-mode AD or compiled autograd; a call with a forward gradient is refused. */
constexpr bool kSharedNodes =
    std::is_same_v<decltype(torch::autograd::Edge::function), std::shared_ptr<Node>>;

template <class N>
auto new_node() {
  if constexpr (kSharedNodes) {
    return std::shared_ptr<N>(new N(), torch::autograd::deleteNode);
  } else {
    return c10::make_intrusive<N>();
  }
}

void refuse_forward_ad(const at::Tensor& t) {
  TORCH_CHECK(!t.defined() || !t._fw_grad(/*level=*/0).defined(),
              "llmcompile's softmax and norms have no forward-mode AD (jvp)");
}

/* An op's gradients (a softmax's dx; a norm's dx, dw and db) from upstream gradient g and what its
 * forward saved, rows first (a softmax's y; a norm's x, w and statistics): the backward for one
 * value where g is one (`one_value`), else the rows backward with g dense; its Caller (`single`,
 * `dense`) run without the GIL where the forward found one, else the kernel function called with
 * it. (in the autograd engine's thread) */
std::vector<at::Tensor> grads_of(const Kernels& k, const at::Tensor& g, const variable_list& saved, void* dense,
                                 void* single) {
  const at::Tensor& x = saved[0];
  at::Tensor c = one_value(g, x);
  const bool one = c.defined() && has(k.backward_scalar);
  at::Tensor dy = one ? at::Tensor() : rows_like(g, x);
  std::vector<at::Tensor> ins{one ? x : dy, one ? c : x};
  ins.insert(ins.end(), saved.begin() + 1, saved.end());
  if (auto d = run_native(one ? single : dense, ins)) {
    ++gil_free_runs;
    return std::move(*d);
  }
  py::gil_scoped_acquire gil;
  ++python_runs;
  py::list args;
  for (const at::Tensor& t : ins) args.append(t);
  return outputs((one ? k.backward_scalar : k.backward)(*args));
}

/* The forward's fast call where eps is not its kernel's own (KernelFunction.fast_call with eps
 * bound), kept in `k.given` once made; null where none is planned yet. (GIL held) */
Given* given_for(Kernels& k, double eps, const at::Tensor& x) {
  for (Given& g : k.given)
    if (g.dtype == x.scalar_type() && g.n == x.size(-1) && g.dim == x.dim() && g.eps == eps) return &g;
  if (!py::hasattr(k.forward, "fast_call")) return nullptr;
  py::object call = k.forward.attr("fast_call")(x, py::arg("eps") = eps);
  if (call.is_none()) return nullptr;
  if (k.given.size() >= 16) k.given.clear();
  k.given.push_back(Given{x.scalar_type(), x.size(-1), x.dim(), eps, call});
  return &k.given.back();
}

/* The forward's outputs for `ins`, with a norm's `eps` (none for a softmax): the Caller planned for
 * them run from here (no Python object made); where there is none, or it refuses the tensors, the
 * kernel function's own call where there is no eps or it is the kernel's default (where no default
 * was registered every eps is passed), else its fast call with eps bound, else the call with eps by
 * keyword (which plans the shape, or says what is wrong). Runs in the caller's thread, which holds
 * the GIL. */
std::vector<at::Tensor> forward_of(Kernels& k, const std::vector<at::Tensor>& ins,
                                   std::optional<double> eps = std::nullopt) {
  const bool own = !eps || (!std::isnan(k.kernel_eps) && *eps == k.kernel_eps);
  Given* hit = own ? nullptr : given_for(k, *eps, ins[0]);
  void* caller = own ? caller_for(k.forward, ins[0])
                     : (hit != nullptr && native != nullptr ? native->as_caller(hit->call.ptr()) : nullptr);
  if (auto d = run_native(caller, ins)) {
    ++forward_native_runs;
    return std::move(*d);
  }
  ++forward_python_runs;
  py::tuple args(ins.size());
  for (size_t i = 0; i < ins.size(); ++i) args[i] = py::cast(ins[i]);
  if (own) return outputs(k.forward(*args));
  if (hit != nullptr) {
    try {
      return outputs(hit->call(*args));
    } catch (py::error_already_set&) {  // refused before its launch: the checked call takes it
    }
  }
  return outputs(k.forward(*args, py::arg("eps") = *eps));
}

/* (forward runs in the caller's thread, which holds the GIL; a backward in the autograd engine's,
 * which does not. It launches the Caller its forward found without the GIL (`run_native`); only
 * where there is none, or it refuses the tensors, does it take the GIL, first, so that every
 * tensor it hands Python is let go under it, not with a second acquire after.) */
template <int Op>  // SOFTMAX or LOG_SOFTMAX
struct SoftmaxBackward : public Node {
  SavedVariable y_;
  void *dense_ = nullptr, *one_ = nullptr;  // the backward kernels' Callers for y's rows, where planned
  std::string name() const override { return Op == SOFTMAX ? "llmcompile::SoftmaxNode" : "llmcompile::LogSoftmaxNode"; }
  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    y_.reset_data();
  }
  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!grads[0].defined()) return {at::Tensor()};
    return {grads_of(kernels_of(Op), grads[0], {y_.unpack(getptr())}, dense_, one_).at(0)};
  }
};

template <int Op>
at::Tensor softmax_with(const at::Tensor& x) {
  refuse_forward_ad(x);
  Kernels& k = kernels_of(Op);
  at::Tensor y;
  {
    at::AutoGradMode off(false);  // (the kernel function's C call then takes its plain path)
    y = forward_of(k, {x}).at(0);
  }
  if (torch::autograd::compute_requires_grad(x)) {
    auto node = new_node<SoftmaxBackward<Op>>();
    node->set_next_edges(torch::autograd::collect_next_edges(x));
    torch::autograd::set_history(y, node);
    node->y_ = SavedVariable(y, /*is_output=*/true);
    node->dense_ = caller_for(k.backward, y);
    node->one_ = caller_for(k.backward_scalar, y);
  }
  return y;
}

at::Tensor softmax_node(const at::Tensor& x, int64_t op) {
  TORCH_CHECK(op == SOFTMAX || op == LOG_SOFTMAX, "llmcompile autograd node: op ", op, " is not a softmax");
  return op == SOFTMAX ? softmax_with<SOFTMAX>(x) : softmax_with<LOG_SOFTMAX>(x);
}

template <int Op>  // RMSNORM: x, w saved with rstd; LAYERNORM: x, w with mean and rstd
struct NormBackward : public Node {
  std::vector<SavedVariable> saved_;
  void *dense_ = nullptr, *one_ = nullptr;  // as SoftmaxBackward's, for x's rows
  std::string name() const override { return Op == RMSNORM ? "llmcompile::RMSNormNode" : "llmcompile::LayerNormNode"; }
  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (SavedVariable& v : saved_) v.reset_data();
  }
  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    variable_list out(num_outputs());
    if (!grads[0].defined()) return out;
    variable_list saved;
    for (const SavedVariable& v : saved_) saved.push_back(v.unpack());
    auto d = grads_of(kernels_of(Op), grads[0], saved, dense_, one_);
    for (size_t i = 0; i < out.size(); ++i) out[i] = d.at(i);
    return out;
  }
};

/* The norm's forward (x, w[, b]) through autograd: out, with a node where an input requires grad. */
template <int Op>
at::Tensor norm_with(const std::vector<at::Tensor>& ins, double eps) {
  for (const at::Tensor& t : ins) refuse_forward_ad(t);
  at::Tensor x = ins[0].contiguous();
  std::vector<at::Tensor> outs;
  {
    at::AutoGradMode off(false);
    std::vector<at::Tensor> args(ins);
    args[0] = x;
    outs = forward_of(kernels_of(Op), args, eps);
  }
  at::Tensor out = outs.at(0);
  if (torch::autograd::compute_requires_grad(ins)) {
    auto node = new_node<NormBackward<Op>>();
    node->set_next_edges(torch::autograd::collect_next_edges(ins));
    torch::autograd::set_history(out, node);
    node->saved_.emplace_back(x, false);
    node->saved_.emplace_back(ins[1], false);
    for (size_t i = 1; i < outs.size(); ++i) node->saved_.emplace_back(outs[i], false);
    const Kernels& k = kernels_of(Op);
    node->dense_ = caller_for(k.backward, x);
    node->one_ = caller_for(k.backward_scalar, x);
  }
  return out;
}

/* cross_entropy_loss's node: its forward call (cross_entropy_fused_total) wrote dx for an upstream
 * gradient of 1 a row, kept here, and the mean's scale 1/kept; the backward scales dx in place by the
 * upstream gradient and that scale (1 for a sum) with the registered backward (compiled.scale_: one
 * launch, the values read on the device: asking them is a sync, and the step would wait for its
 * forward; torch's mul_ by a device value ran at a quarter of the copy's speed). As the Python
 * Function it replaces (autograd.py's CrossEntropyLossFunction, whose Python forward and backward
 * cost the fused loss most of its host time beyond torch's, issue 47), a second backward of a kept
 * graph rescales a copy, and refuses where the first's gradient was 0. */
struct LossBackward : public Node {
  at::Tensor dx_, by_, applied_;  // by_: 1/kept for a mean, 1 for a sum; applied_: the first upstream gradient
  std::vector<int64_t> shape_;
  std::string name() const override { return "llmcompile::CrossEntropyLossNode"; }
  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    dx_.reset();
    by_.reset();
    applied_.reset();
  }
  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!grads[0].defined()) return {at::Tensor()};
    TORCH_CHECK(dx_.defined(), "Trying to backward through the graph a second time (or directly access saved tensors ",
                "after they have already been freed): cross_entropy_loss keeps its gradient only with retain_graph=True");
    at::AutoGradMode off(false);
    const at::Tensor g = grads[0].reshape({1});
    if (!applied_.defined()) {
      applied_ = g;
      py::gil_scoped_acquire gil;
      kernels_of(CE_LOSS).backward(dx_, g, by_);
      return {dx_.view(shape_)};
    }
    TORCH_CHECK(applied_.ne(0).item<bool>(), "cross_entropy_loss: its first backward had an upstream gradient of 0, ",
                "which erased the gradient it keeps; a second backward of this graph needs a new forward");
    return {(dx_ * (g / applied_)).view(shape_)};
  }
};

/* F.cross_entropy(x, target, reduction='mean' or 'sum') with the fused kernel's own ignore_index
 * (autograd.py sends any other to the Python Function): one call, whose outputs are the rows'
 * losses, dx, the sum, the mean and 1/kept; `one` a (1,) fp32 1 on x's device, a sum's scale.
 * Where no gradient is wanted (an eval loop), the call without dx (CE_TOTAL): the rows' losses,
 * the sum, the mean and 1/kept; the rows are passed as they come (the call says what is wrong). */
at::Tensor loss_with(const at::Tensor& x, const at::Tensor& target, bool mean, const at::Tensor& one) {
  refuse_forward_ad(x);
  const bool grad = torch::autograd::compute_requires_grad(x);
  std::vector<at::Tensor> outs;
  {
    at::AutoGradMode off(false);
    const at::Tensor rows = x.dim() == 2 ? x : x.reshape({-1, x.size(-1)});
    const at::Tensor targets = target.dim() == 1 ? target : target.reshape({-1});
    outs = grad ? forward_of(kernels_of(CE_LOSS), {rows.contiguous(), targets})
                : forward_of(kernels_of(CE_TOTAL), {rows, targets});
  }
  at::Tensor total = outs.at((mean ? 3 : 2) - (grad ? 0 : 1)).view(at::IntArrayRef{});  // 0-d, as torch's loss
  if (grad) {
    auto node = new_node<LossBackward>();
    node->set_next_edges(torch::autograd::collect_next_edges(x));
    torch::autograd::set_history(total, node);
    node->dx_ = outs.at(1);
    node->by_ = mean ? outs.at(4) : one;
    node->shape_ = x.sizes().vec();
  }
  return total;
}

/* The attention's node: our forward kernel (any of the four attention kernel functions, passed with
 * the call) on (b·h, s, d) dense copies, and torch's own attention backward kernel on our o and lse
 * (attention_backward.py; we have no backward kernel yet). The Python Function it replaces
 * (autograd.py's AttentionFunction) cost a Llama layer's attention about 130 us of host time more
 * than SDPA's on an H200 (54 in its forward: Function.apply, the views, v's copy; 80 in its
 * backward: the engine's Python call and attention_backward's Python): the step is host-bound, so
 * that was most of the run's 8-9% under torch's tokens/s. How the backward runs (cuDNN's or
 * flash-attention's kernel, called here without the GIL, or `attention_backward.backward` through
 * Python) is asked of Python's `route` once a layout and set of enabled SDPA backends. The forward
 * runs the kernel function's fixed-layout call in C (`attention_caller`) once one is made. */
enum Route { ROUTE_PYTHON = 0, ROUTE_FLASH = 1, ROUTE_CUDNN = 3 };  // (SDPBackend's values: math, flash, cudnn)

struct AttentionRoute {
  int64_t kind = ROUTE_PYTHON;
  at::Tensor cum_q, cum_k, seed, offset;  // what torch's forward hands its backward (none, no dropout)
  int64_t lse_dims = 3;                   // the rank of the backend's lse ((b, h, s, 1) for cuDNN)
};

struct RouteKey {
  at::Device device;
  at::ScalarType dtype;
  std::vector<int64_t> sizes;
  bool causal;
  double scale;
  int flags;  // which SDPA backends are enabled (sdpa_kernel changes them)
  bool operator==(const RouteKey& o) const {
    return device == o.device && dtype == o.dtype && sizes == o.sizes && causal == o.causal && scale == o.scale &&
           flags == o.flags;
  }
};

/* A kernel function's call in C that Python gave for `key` (what it was made for: dtype, shapes,
 * strides); `run` null where it gave none. */
struct KeptCaller {
  py::object fn;  // (held: an address is not reused for another while its entry stands)
  std::vector<int64_t> key;
  py::object caller;
  void* run;
};

struct AttentionPython {
  py::object route, backward;  // attention_backward.route and .backward
  std::vector<std::pair<RouteKey, AttentionRoute>> routes;  // (a model runs a few shapes)
  std::vector<KeptCaller> callers;          // the fixed-layout calls (callpath's `fixed_caller`)
  std::vector<KeptCaller> strided_callers;  // the strided-v calls (callpath's `strided_v_caller`)
};

AttentionPython& attention_python() {
  static auto* a = new AttentionPython(); /* held for the process, as the registry */
  return *a;
}

int sdpa_flags() {
  const at::Context& c = at::globalContext();
  return c.userEnabledCuDNNSDP() | c.userEnabledFlashSDP() << 1 | c.userEnabledMemEfficientSDP() << 2 |
         c.userEnabledMathSDP() << 3;
}

/* The backward's route for dense 4-D q, k, v, o (GIL held: the forward's thread). */
AttentionRoute route_for(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& o,
                         bool causal, double scale) {
  AttentionPython& a = attention_python();
  TORCH_CHECK(a.route, "llmcompile autograd node: the attention's route is not registered");
  RouteKey key{q.device(), q.scalar_type(), q.sizes().vec(), causal, scale, sdpa_flags()};
  for (const auto& [k_, r] : a.routes)
    if (k_ == key) return r;
  py::tuple got = a.route(q, k, v, o, causal, scale);
  AttentionRoute r;
  r.kind = got[0].cast<int64_t>();
  if (r.kind != ROUTE_PYTHON) {  // (None: no such tensor, as a dense batch has no sequence offsets)
    auto tensor = [&got](int i) { return got[i].is_none() ? at::Tensor() : got[i].cast<at::Tensor>(); };
    r.cum_q = tensor(1);
    r.cum_k = tensor(2);
    r.seed = tensor(3);
    r.offset = tensor(4);
    r.lse_dims = got[5].cast<int64_t>();
  }
  if (a.routes.size() >= 64) a.routes.clear();
  a.routes.emplace_back(std::move(key), r);
  return r;
}

/* `fn`'s call in C kept in `cache` for `key`, else asked of Python (`fn.<method>(args...)`) and kept
 * (64 at most: a model runs a few layouts); null where there is none. `keep_none`: a null answer is
 * kept too (the layout is decided), else asked again (it may be made later). (GIL held) */
template <class... Args>
void* kept_caller(std::vector<KeptCaller>& cache, const py::object& fn, std::vector<int64_t>&& key, bool keep_none,
                  const char* method, const Args&... args) {
  for (const KeptCaller& c : cache)
    if (c.fn.ptr() == fn.ptr() && c.key == key) return c.run;
  if (!py::hasattr(fn, method)) return nullptr;
  py::object caller = fn.attr(method)(args...);
  void* run = caller.is_none() ? nullptr : native->as_caller(caller.ptr());
  if (run == nullptr && !keep_none) return nullptr;
  if (cache.size() >= 64) cache.clear();
  cache.push_back(KeptCaller{fn, std::move(key), std::move(caller), run});
  return run;
}

/* what a call in C is kept by: the dtype, then each tensor's sizes (and strides where asked) */
void append(std::vector<int64_t>& key, c10::IntArrayRef values) { key.insert(key.end(), values.begin(), values.end()); }

/* The Caller of `fn` for dense (M, N, D) q, k and v alike (GIL held), or null: none is made yet (the
 * kernel function's first call of the shape makes it), fn has none (a stand-in), k or v differs. */
void* attention_caller(const py::object& fn, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  if (native == nullptr || k.sizes() != q.sizes() || v.sizes() != q.sizes() || k.scalar_type() != q.scalar_type() ||
      v.scalar_type() != q.scalar_type())
    return nullptr;
  std::vector<int64_t> key{static_cast<int64_t>(q.scalar_type())};
  append(key, q.sizes());
  return kept_caller(attention_python().callers, fn, std::move(key), false, "fixed_caller", q);
}

bool aligned(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

/* The strided-v call in C for dense (b·h, s, d) q and k, a strided (b, h, s, d) v and the (b, h, s,
 * d) o it writes (GIL held: the forward's thread); asked of Python once a layout. Null where there
 * is none or the tensors are not 16-byte aligned. */
void* strided_v_caller(const py::object& fn, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const at::Tensor& o) {
  if (native == nullptr || k.sizes() != q.sizes() || k.scalar_type() != q.scalar_type() ||
      v.scalar_type() != q.scalar_type() || o.scalar_type() != q.scalar_type() || !aligned(q) || !aligned(k) ||
      !aligned(v) || !aligned(o))
    return nullptr;
  std::vector<int64_t> key{static_cast<int64_t>(q.scalar_type())};
  for (c10::IntArrayRef part : {q.sizes(), v.sizes(), v.strides(), o.sizes(), o.strides()}) append(key, part);
  return kept_caller(attention_python().strided_callers, fn, std::move(key), true, "strided_v_caller", q, k, v, o);
}

/* lse of dense (b·h, s, d) q and k and a strided (b, h, s, d) v read where it lies, o written into
 * `o` ((b, h, s, d) at its strides): the strided-v call in C, else through Python
 * (`strided_v_call`); nullopt where neither takes it. A call in C whose kernel refuses the tensors
 * is not this layout's again: the Python call takes it. */
std::optional<at::Tensor> strided_v_forward(const py::object& fn, const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& v, const at::Tensor& o) {
  void* run = strided_v_caller(fn, q, k, v, o);
  try {
    if (auto d = run_native(run, {q, k, v, o})) return d->at(0);
  } catch (const std::exception&) {
    for (KeptCaller& c : attention_python().strided_callers)
      if (c.run == run) c.run = nullptr;
    PyErr_Clear();
  }
  if (!py::hasattr(fn, "strided_v_call")) return std::nullopt;
  py::object made = fn.attr("strided_v_call")(q, k, v, o);
  if (made.is_none()) return std::nullopt;
  return made.cast<at::Tensor>();
}

/* An empty (b, h, s, d) tensor like `like`, laid out as (b, s, h, d): a transposed view */
at::Tensor empty_heads_inner(const at::Tensor& like) {
  return at::empty({like.size(0), like.size(2), like.size(1), like.size(3)}, like.options()).transpose(1, 2);
}

/* t as SDPA's (b, h, ...): itself where it has 4 dims, else one batch of its (b·h) heads */
at::Tensor four(const at::Tensor& t) { return t.dim() == 4 ? t : t.unsqueeze(0); }

struct AttentionBackward : public Node {
  SavedVariable q_, k_, v_, o_, lse_;  // q, k, v: the dense copies, in the caller's shapes
  AttentionRoute route_;
  bool causal_ = false;
  double scale_ = 0.0;
  std::string name() const override { return "llmcompile::AttentionNode"; }
  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (SavedVariable* v : {&q_, &k_, &v_, &o_, &lse_}) v->reset_data();
  }
  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    variable_list out(3);
    if (!grads[0].defined()) return out;
    const at::Tensor q = q_.unpack(), k = k_.unpack(), v = v_.unpack(), o = o_.unpack(getptr()), lse = lse_.unpack();
    // the upstream gradient as it comes: a model's is a transposed view, which torch's kernels read
    const at::Tensor& dout = grads[0];
    if (route_.kind == ROUTE_PYTHON) {
      py::gil_scoped_acquire gil;
      auto d = outputs(attention_python().backward(dout, q, k, v, o, lse, causal_, scale_));
      for (size_t i = 0; i < 3; ++i) out[i] = d.at(i);
      return out;
    }
    at::Tensor lse4 = lse.dim() == 3 ? lse : lse.unsqueeze(0);
    const int64_t n = q.size(-2);
    std::tuple<at::Tensor, at::Tensor, at::Tensor> d;
    if (route_.kind == ROUTE_CUDNN) {
      std::vector<int64_t> shape = lse4.sizes().vec();
      shape.resize(route_.lse_dims, 1);
      d = at::_scaled_dot_product_cudnn_attention_backward(four(dout), four(q), four(k), four(v), four(o),
                                                           lse4.view(shape), route_.seed, route_.offset, at::Tensor(),
                                                           route_.cum_q, route_.cum_k, n, n, 0.0, causal_, scale_);
    } else {
      d = at::_scaled_dot_product_flash_attention_backward(four(dout), four(q), four(k), four(v), four(o), lse4,
                                                           route_.cum_q, route_.cum_k, n, n, 0.0, causal_, route_.seed,
                                                           route_.offset, scale_);
    }
    out[0] = std::get<0>(d).reshape(q.sizes());
    out[1] = std::get<1>(d).reshape(k.sizes());
    out[2] = std::get<2>(d).reshape(v.sizes());
    return out;
  }
};

/* o, lse = fn(q, k, v) through autograd, q, k, v of (b·h, s, d) or SDPA's (b, h, s, d): each made
 * (b·h, s, d) dense for the kernel (a view where the dims merge, a copy where not), but SDPA's 4-D
 * v read where it lies (a model's is a transposed view of its projection's output) and o written in
 * the layout the backward's kernel reads, where the kernel function can (`strided_v_call`); o and
 * lse given back in the caller's shape, lse without a gradient. (The caller's thread, GIL held.) */
std::tuple<at::Tensor, at::Tensor> attention_with(const py::object& fn, bool causal, double scale,
                                                  const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  for (const at::Tensor& t : {q, k, v}) {
    refuse_forward_ad(t);
    TORCH_CHECK(t.dim() >= 2, "llmcompile attention: q, k and v must be (b·h, s, d) or (b, h, s, d), got ", t.sizes());
  }
  const bool grad = torch::autograd::compute_requires_grad(q, k, v);
  at::Tensor flat[3];
  std::vector<at::Tensor> outs;
  std::optional<AttentionRoute> route;  // (asked before the forward where o's layout depends on it)
  {
    at::AutoGradMode off(false);  // (the kernel function's call takes its plain path)
    int i = 0;  // (detached: a view of an input keeps its version counter, not its history)
    for (const at::Tensor& t : {q, k}) flat[i++] = t.reshape({-1, t.size(-2), t.size(-1)}).contiguous().detach();
    if (q.dim() == 4 && k.sizes() == q.sizes() && v.sizes() == q.sizes()) {  // (else the call says what is wrong)
      const at::Tensor lies = v.detach(), q4 = flat[0].view(q.sizes());
      // flash-attention's backward copies an o not laid out as (b, s, h, d), the layout torch's
      // flash forward writes (one more launch a step); cuDNN's reads o laid out as q
      const at::Tensor k4 = flat[1].view(k.sizes());
      if (grad) route = route_for(q4, k4, lies, q4, causal, scale);
      const bool flash = route && route->kind == ROUTE_FLASH;
      if (flash || !v.is_contiguous()) {
        const at::Tensor o = flash ? empty_heads_inner(q4) : at::empty_like(q4);
        if (auto lse = strided_v_forward(fn, flat[0], flat[1], lies, o)) {
          ++forward_strided_v_runs;
          outs = {o, *lse};
          flat[2] = lies;
        }
      }
    }
    if (outs.empty()) {
      flat[2] = v.reshape({-1, v.size(-2), v.size(-1)}).contiguous().detach();
      if (auto d = run_native(attention_caller(fn, flat[0], flat[1], flat[2]), {flat[0], flat[1], flat[2]})) {
        ++forward_native_runs;
        outs = std::move(*d);
      } else {  // (the kernel function's call: it plans the shape, or says what is wrong)
        ++forward_python_runs;
        outs = outputs(fn(flat[0], flat[1], flat[2]));
      }
    }
  }
  TORCH_CHECK(outs.size() == 2, "llmcompile attention: the kernel function gave ", outs.size(), " outputs, not o and lse");
  at::Tensor o = outs[0].view(q.sizes()), lse = outs[1].view(q.sizes().slice(0, q.dim() - 1));
  if (grad) {
    auto node = new_node<AttentionBackward>();
    node->set_next_edges(torch::autograd::collect_next_edges(q, k, v));
    torch::autograd::set_history(o, node);
    at::Tensor q4 = flat[0].view(q.sizes()), k4 = flat[1].view(k.sizes()), v4 = flat[2].view(v.sizes());
    node->q_ = SavedVariable(q4, false);
    node->k_ = SavedVariable(k4, false);
    node->v_ = SavedVariable(v4, false);
    node->o_ = SavedVariable(o, true);
    node->lse_ = SavedVariable(lse, false);
    node->causal_ = causal;
    node->scale_ = scale;
    if (!route && q.dim() <= 4) route = route_for(four(q4), four(k4), four(v4), four(o), causal, scale);
    node->route_ = route.value_or(AttentionRoute{});
  }
  return {o, lse};
}

void set_attention(py::object route, py::object backward) {
  AttentionPython& a = attention_python();
  a.route = std::move(route);
  a.backward = std::move(backward);
  a.routes.clear();
  a.callers.clear();
  a.strided_callers.clear();
}

void register_op(int64_t op, py::object forward, py::object backward, py::object backward_scalar, double eps,
                 double kernel_eps) {
  TORCH_CHECK(op >= 0 && op < N_OPS, "llmcompile autograd node: no op ", op);
  registry()[op] = Kernels{std::move(forward), std::move(backward), std::move(backward_scalar), {}, eps, kernel_eps};
}

/* What sends a call back to the Python Functions, asked as autograd.py's `_nodes` asks it:
 * torch.compile tracing (torch.compiler's `_is_compiling_flag`, what its is_compiling() returns
 * outside TorchScript, read without that function's two Python calls; the function itself where
 * the flag is gone), functorch transforms active, a functorch-wrapped tensor. The last two are
 * asked in C++ (`functorch_active`, `functorch_wrapped`): through torch's pybind11 functions they
 * were two to four Python calls a forward, which with the host's caches cold made our forward
 * with grad 3.3 us slower than torch's (evals/results/training-step/). Set once by `set_guards`;
 * never destroyed (held for the process, as the registry). */
struct Guards {
  PyObject *compiler = nullptr, *is_compiling = nullptr;
  PyObject* flag = nullptr;  // "_is_compiling_flag", interned
};
Guards& guards() {
  static auto* g = new Guards();
  return *g;
}

void set_guards(py::object compiler) {
  Guards& g = guards();
  g.is_compiling = py::object(compiler.attr("is_compiling")).release().ptr();
  g.flag = PyUnicode_InternFromString("_is_compiling_flag");
  g.compiler = compiler.release().ptr();
}

/* torch._C._are_functorch_transforms_active(), asked as torch answers it: a transform's layer keys
 * in this thread's included dispatch keys. */
bool functorch_active() {
  const c10::DispatchKeySet in = c10::impl::tls_local_dispatch_key_set().included_;
  return in.has(c10::DispatchKey::FuncTorchDynamicLayerFrontMode) ||
         in.has(c10::DispatchKey::FuncTorchDynamicLayerBackMode);
}

/* A tensor functorch wraps: batched, a grad transform's wrapper, or a functional wrapper. Wider
 * than torch._C._functorch.is_functorch_wrapped_tensor, which also asks a functional wrapper's
 * level; a call this sends to Python for that is still taken there, only slower. */
bool functorch_wrapped(const at::Tensor& t) {
  constexpr c10::DispatchKeySet wrappers({c10::DispatchKey::FuncTorchBatched, c10::DispatchKey::BatchedNestedTensor,
                                          c10::DispatchKey::FuncTorchGradWrapper, c10::DispatchKey::Functionalize});
  return t.key_set().has_any(wrappers);
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

/* 1 where a guard sends a call back to Python (or one of its first `tensors` arguments is not a
 * tensor), 0 where not, -1 with a Python error set. */
int guarded(PyObject* args, Py_ssize_t tensors) {
  const Guards& g = guards();
  int on;
  if (PyObject* flag = PyObject_GetAttr(g.compiler, g.flag)) {
    on = PyObject_IsTrue(flag);
    Py_DECREF(flag);
  } else {
    PyErr_Clear();
    on = truth(g.is_compiling, nullptr);
  }
  if (on != 0) return on;
  if (functorch_active()) return 1;
  for (Py_ssize_t i = 0; i < tensors; ++i) {
    PyObject* t = PyTuple_GET_ITEM(args, i);
    if (!THPVariable_Check(t) || functorch_wrapped(THPVariable_Unpack(t))) return 1;
  }
  return 0;
}

/* The attention kernel functions whose C calls come here (grad_call's ops ATTENTION + slot), each
 * with its causal flag and default scale: autograd.py's `attention` call, in C++. */
struct AttentionSlot {
  py::object fn;
  bool causal = false;
  double scale = 0.0;
};
constexpr int ATTENTION = 64, MAX_ATTENTION = 8;
std::array<AttentionSlot, MAX_ATTENTION>& attention_slots() {
  static auto* slots = new std::array<AttentionSlot, MAX_ATTENTION>();  // (held for the process)
  return *slots;
}

void register_attention(int64_t slot, py::object fn, bool causal, double scale) {
  TORCH_CHECK(slot >= 0 && slot < MAX_ATTENTION, "llmcompile attention: no slot ", slot);
  attention_slots()[slot] = AttentionSlot{std::move(fn), causal, scale};
}

/* o, lse = fn(q, k, v) from the kernel function's C call: a call with grad, or SDPA's 4-D call
 * without (native_call.c's `node_ndim`): `attention_with`, which reads SDPA's 4-D v where it lies.
 * Py_NotImplemented for a scale by keyword, another rank, or a guard: the Python call takes it. */
PyObject* attention_call(int slot, PyObject* args, PyObject* kwargs) {
  const AttentionSlot& a = attention_slots()[slot];
  if (!a.fn || guards().compiler == nullptr || PyTuple_GET_SIZE(args) != 3) return not_taken();
  if (kwargs != nullptr && PyDict_GET_SIZE(kwargs) > 0) return not_taken();
  const int on = guarded(args, 3);
  if (on != 0) return on < 0 ? nullptr : not_taken();
  const at::Tensor &q = THPVariable_Unpack(PyTuple_GET_ITEM(args, 0)), &k = THPVariable_Unpack(PyTuple_GET_ITEM(args, 1)),
                   &v = THPVariable_Unpack(PyTuple_GET_ITEM(args, 2));
  if (q.dim() != 3 && q.dim() != 4) return not_taken();
  auto [o, lse] = attention_with(a.fn, a.causal, a.scale, q, k, v);
  PyObject* out = PyTuple_New(2);
  if (out == nullptr) return nullptr;
  PyTuple_SET_ITEM(out, 0, THPVariable_Wrap(std::move(o)));
  PyTuple_SET_ITEM(out, 1, THPVariable_Wrap(std::move(lse)));
  return out;
}

/* The differentiable call of `op` from the kernel function's C call (native_call.c's Entry, a
 * call with an input that requires grad): softmax(x); rmsnorm(x, w[, eps]); layernorm(x, w, b[,
 * eps]), eps also by keyword. What autograd.py's Python wrappers did, in C++: the arguments
 * parsed, the guards asked, the node applied. Py_NotImplemented where the Python call must take
 * it (the guards, or arguments it does not parse: that call says what is wrong). */
PyObject* grad_call(int op, PyObject* args, PyObject* kwargs) {
  try {  // (not HANDLE_TH_ERRORS: its warning buffer costs a small call more than the rest of this)
    if (op >= ATTENTION && op < ATTENTION + MAX_ATTENTION) return attention_call(op - ATTENTION, args, kwargs);
    if (op < 0 || op >= N_OPS || op == CE_LOSS) return not_taken();
    const Kernels& k = registry()[op];
    const Guards& g = guards();
    if (!k.forward || g.compiler == nullptr) return not_taken();
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
    const int on = guarded(args, tensors);
    if (on != 0) return on < 0 ? nullptr : not_taken();
    const at::Tensor& x = THPVariable_Unpack(PyTuple_GET_ITEM(args, 0));
    if (!norm) return THPVariable_Wrap(softmax_node(x, op));
    const at::Tensor& w = THPVariable_Unpack(PyTuple_GET_ITEM(args, 1));
    if (op == RMSNORM) return THPVariable_Wrap(norm_with<RMSNORM>({x, w}, eps));
    return THPVariable_Wrap(norm_with<LAYERNORM>({x, w, THPVariable_Unpack(PyTuple_GET_ITEM(args, 2))}, eps));
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
  m.attr("CE_LOSS") = static_cast<int>(CE_LOSS);
  m.attr("CE_TOTAL") = static_cast<int>(CE_TOTAL);
  m.def("register_op", &register_op, py::arg("op"), py::arg("forward"), py::arg("backward"),
        py::arg("backward_scalar") = py::none(), py::arg("eps") = NAN, py::arg("kernel_eps") = NAN,
        "register_op(op, forward, backward, backward_scalar=None, eps=nan, kernel_eps=nan): the op's kernel "
        "functions, and a norm's eps where a call gives none and its forward kernel's own");
  m.def("set_native", &set_native, py::arg("capsule"),
        "set_native(native_call's native_api capsule, or None): backwards launch their planned kernels without the GIL");
  m.def(
      "backward_runs", [] { return py::make_tuple(gil_free_runs.load(), python_runs.load()); },
      "backward_runs() -> (launched without the GIL, called through Python), since the process began");
  m.def(
      "forward_runs", [] { return py::make_tuple(forward_native_runs.load(), forward_python_runs.load()); },
      "forward_runs() -> (forwards launched from C++, called through Python), since the process began: with grad, "
      "and the attention's 4-D calls without");
  m.def(
      "strided_v_runs", [] { return forward_strided_v_runs.load(); },
      "strided_v_runs() -> attention forwards through the strided-v call (v read where it lies), since the process began");
  m.def("set_guards", &set_guards, py::arg("compiler"),
        "set_guards(torch.compiler): what tells grad_call that torch.compile traces (its calls then go back to Python)");
  // native_call.c's Entry calls it (Entry._set_node): a C function pointer, no Python between
  m.attr("grad_call") = py::capsule(reinterpret_cast<void*>(&grad_call), "llmcompile.grad_call");
  m.def(
      "softmax", &softmax_node,
      "softmax(x, op): SOFTMAX or LOG_SOFTMAX through autograd");
  m.def(
      "rmsnorm",
      [](const at::Tensor& x, const at::Tensor& w, double eps) { return norm_with<RMSNORM>({x, w}, eps); },
      "rmsnorm(x, weight, eps) through autograd");
  m.def(
      "layernorm",
      [](const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps) {
        return norm_with<LAYERNORM>({x, w, b}, eps);
      },
      "layernorm(x, weight, bias, eps) through autograd");
  m.def("set_attention", &set_attention, py::arg("route"), py::arg("backward"),
        "set_attention(route, backward): attention_backward's route (asked once a layout) and Python backward");
  m.attr("ATTENTION") = ATTENTION;
  m.def("register_attention", &register_attention, py::arg("slot"), py::arg("fn"), py::arg("causal"),
        py::arg("scale"),
        "register_attention(slot, fn, causal, scale): the kernel function whose C call hands its calls to "
        "grad_call as op ATTENTION + slot");
  m.def("attention", &attention_with, py::arg("fn"), py::arg("causal"), py::arg("scale"), py::arg("q"),
        py::arg("k"), py::arg("v"), "attention(fn, causal, scale, q, k, v) -> (o, lse) through autograd");
  m.def("cross_entropy_loss", &loss_with, py::arg("x"), py::arg("target"), py::arg("mean"), py::arg("one"),
        "cross_entropy_loss(x, target, mean, one): the mean or sum through autograd");
}
