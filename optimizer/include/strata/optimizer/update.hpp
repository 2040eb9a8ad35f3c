// strata::optimizer — the element-wise update interface shared by every optimizer.
//
// An optimizer step on one parameter tensor is an element-wise function of the fp32
// master parameter, the gradient and N fp32 state streams (Adam: exp_avg, exp_avg_sq).
// `UpdateRule` is that function; `apply_update()` runs it over a tensor or any chunk of a
// tensor, split into fixed-size tiles across a ThreadPool. Because the update of element i
// depends only on element i of the streams, the result is bit-identical for any thread
// count and any split of a tensor into chunks (sub-groups), which is what lets the NVMe
// pipeline update a tensor one sub-group at a time.
//
// Built-in rules (optimizers.hpp) and custom rules (make_elementwise_rule below) go through
// the same apply_update(), so they get the same threading, tiling and pipelining.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "strata/base/status.hpp"
#include "strata/base/dtype.hpp"

namespace strata {
class ThreadPool;  // strata/base/thread_pool.hpp; the optimizer's: make_kernel_pool()
}  // namespace strata

namespace strata::optimizer {

/// Most state streams a rule may have (Adam with amsgrad has 3).
inline constexpr int kMaxStateStreams = 4;

/// Elements per tile: apply_update() hands each worker whole tiles of this many elements
/// (tile t covers [t * kTileNumel, (t+1) * kTileNumel) of the spans). 16384 fp32 = 64 KiB.
inline constexpr size_t kTileNumel = 16384;

/// Below this many elements apply_update() runs on the calling thread (waking workers
/// costs more than the update).
inline constexpr size_t kMinParallelNumel = 65536;

/// The streams of one update: `numel` consecutive elements of a parameter tensor (a whole
/// tensor or a chunk of it). All pointers are host memory; none needs any alignment beyond
/// that of its element type. The streams must not overlap one another.
struct UpdateSpans {
  float* param = nullptr;          ///< fp32 master parameters, read and written
  const void* grad = nullptr;      ///< gradients, `grad_type` elements, read only
  DType grad_type = DType::kFloat32;  ///< kFloat32, kFloat16 or kBFloat16
  /// fp32 state streams 0..rule.num_states()-1 (e.g. Adam: exp_avg, exp_avg_sq,
  /// max_exp_avg_sq); entries past num_states() are ignored.
  std::array<float*, kMaxStateStreams> states{};
  /// Optional copy of the updated parameters (the weights of the next forward pass);
  /// nullptr = none. kFloat16 / kBFloat16: written by the rule with round-to-nearest-even.
  /// kFloat32: apply_update() copies the updated master there tile by tile (the rule's
  /// update() never sees an fp32 copy).
  void* param_copy = nullptr;
  DType param_copy_type = DType::kBFloat16;  ///< kFloat16, kBFloat16 or kFloat32
  size_t numel = 0;                          ///< elements in every stream

  /// The sub-spans of elements [begin, begin + count). Precondition: begin + count <= numel.
  UpdateSpans slice(size_t begin, size_t count) const;
};

/// Per-call inputs of an update besides the streams.
struct StepInfo {
  StepInfo() = default;
  /// `{step, grad_scale}`: the other fields at their defaults.
  StepInfo(int64_t step_number, float scale = 1.0f) : step(step_number), grad_scale(scale) {}
  /// 1-based step number of the parameter tensor being updated (after this step: torch's
  /// state["step"]). Drives bias correction (Adam), lr decay (Adagrad) and SGD's first
  /// momentum step. Must be >= 1.
  int64_t step = 1;
  /// Every gradient is multiplied by this fp32 factor before use (default 1): the
  /// gradient-clipping coefficient (see clip_coefficient()) times 1/loss_scale.
  float grad_scale = 1.0f;
  /// Where the spans are, for rules that keep data per tensor or report errors (a Python
  /// rule): the tensor's handle and name in the OffloadedOptimizer and the element offset
  /// of spans.param[0] within the tensor. The offloaded optimizer sets them for every
  /// call; other callers may leave them (0, "", 0). `param_name` is valid during the call.
  uint32_t param = 0;
  std::string_view param_name{};
  uint64_t offset = 0;
};

/// An element-wise optimizer update. Implementations are immutable after construction.
/// \threadsafety update() is called concurrently from several threads on disjoint spans.
class UpdateRule {
 public:
  virtual ~UpdateRule() = default;
  /// Short name ("adam", "adamw", ...).
  virtual std::string_view name() const = 0;
  /// Number of fp32 state streams (0..kMaxStateStreams).
  virtual int num_states() const = 0;
  /// Name of state stream i (torch's state-dict key, e.g. "exp_avg"). 0 <= i < num_states().
  virtual std::string_view state_name(int i) const = 0;
  /// Value every element of state stream i starts from (Adagrad: initial_accumulator_value).
  virtual float state_init_value(int /*i*/) const { return 0.0f; }
  /// Updates elements [0, spans.numel) of `spans` for step `info.step`. The spans have been
  /// validated by the caller (apply_update); numel may be any value including 0.
  virtual void update(const UpdateSpans& spans, const StepInfo& info) const = 0;
  /// True: apply_update() hands update_or_fail() all of its spans in ONE call, on the
  /// calling thread, instead of tiles of kTileNumel spread over its pool -- for rules that
  /// run their own parallelism over a whole slice (a Python callable running torch ops,
  /// whose cost is per call). Then it also copies an fp32 param_copy after the call, and
  /// the rule writes an fp16/bf16 one. Default false.
  virtual bool whole_spans() const { return false; }
  /// True when update_or_fail() can fail (a callable that raises): the offloaded
  /// optimizer then makes its step transactional -- a failed step leaves every tensor as
  /// before it (offload.hpp, "A rule that fails"). Default false. A rule that says false
  /// but whose update_or_fail() fails anyway fails the step with that status, without a
  /// transaction: tensors may be partly updated, so checkpoint() and close() refuse
  /// (FailedPrecondition) and a reopen resumes the last checkpoint (offload.hpp).
  virtual bool may_fail() const { return false; }
  /// update() for rules whose update can fail; apply_update() calls this one. On error
  /// the spans may be partly updated (the caller restores them). Default: update(), OK.
  /// \threadsafety as update().
  virtual Status update_or_fail(const UpdateSpans& spans, const StepInfo& info) const {
    update(spans, info);
    return Status::OK();
  }
};

/// Checks `spans` against `rule`: non-null param/grad/states (when numel > 0), a supported
/// grad_type and param_copy_type, no null state stream below num_states().
/// \error InvalidArgument naming the offending field.
Status validate_spans(const UpdateRule& rule, const UpdateSpans& spans);

/// Applies `rule` for step `info` to all elements of `spans`, in tiles of kTileNumel
/// elements spread over `pool` (nullptr, a 1-thread pool or fewer than kMinParallelNumel
/// elements: the calling thread). Blocks until done. Does NOT advance any step counter:
/// call it once per chunk with the same `info` to update a tensor in sub-groups.
/// Results are bit-identical for any pool size and any split of a tensor into chunks (for
/// a given SIMD target, see simd.hpp).
/// A rule with whole_spans() gets one update_or_fail() call on the calling thread instead.
/// \error InvalidArgument from validate_spans(), or when info.step < 1; the error of
///     rule.update_or_fail() (the first one, when tiles fail on several threads).
/// \threadsafety safe to call concurrently on disjoint spans; calls sharing a pool are
///     serialized by the pool.
Status apply_update(const UpdateRule& rule, const UpdateSpans& spans, const StepInfo& info,
                    ThreadPool* pool);

/// Fills state stream i of `spans` (i < rule.num_states()) with rule.state_init_value(i).
/// \error InvalidArgument from validate_spans() (grad may be null here).
Status init_states(const UpdateRule& rule, const UpdateSpans& spans, ThreadPool* pool);

/// The per-tensor step counter (torch's state["step"]). One per parameter tensor, not per
/// call: a tensor updated in sub-groups advances once per optimizer step.
/// \threadsafety not synchronized; owned by whoever steps the tensor.
class ParamState {
 public:
  /// Steps taken so far (0 before the first step).
  int64_t step() const { return step_; }
  /// Restores a counter (e.g. from a checkpoint). Precondition: step >= 0.
  void set_step(int64_t step) { step_ = step; }
  /// Advances the counter and returns the new step number (>= 1).
  int64_t advance() { return ++step_; }

 private:
  int64_t step_ = 0;
};

/// One optimizer step of a whole tensor: advances `state`, then apply_update() with the
/// new step number. On error the counter is left unchanged.
/// \error as apply_update().
Status step(const UpdateRule& rule, const UpdateSpans& spans, ParamState& state,
            ThreadPool* pool, float grad_scale = 1.0f);

/// Converts `numel` gradients of type `type` (kFloat32/kFloat16/kBFloat16) at `src` to fp32
/// multiplied by `scale` into `dst` (SIMD, run-time dispatched). Precondition: valid type.
/// \threadsafety pure function of its buffers.
void load_scaled_grad(const void* src, DType type, float scale, float* dst, size_t numel);

/// Converts `numel` fp32 values to `type` (kFloat16 or kBFloat16, round to nearest even;
/// NaN stays NaN, overflow becomes infinity) at `dst`. Precondition: valid type.
void store_converted(const float* src, DType type, void* dst, size_t numel);

/// A custom element-wise rule from two callables (the C++ way to plug in an optimizer):
///   prepare(int64_t step) -> Scalars              (once per call: bias corrections, ...)
///   element(const Scalars&, float& param, float grad, float* state)   (per element)
/// `grad` is already converted to fp32 and multiplied by StepInfo::grad_scale; `state`
/// points at NumStates floats (this element's value of each state stream), which
/// `element` updates in place. The optional fp16/bf16 parameter copy is written by the
/// engine. Elements are processed in blocks of 1024 in element order; the callables are
/// compiled with the caller's flags (no run-time SIMD dispatch), and must be thread-safe.
/// Example (plain SGD with momentum 0.9):
///   auto rule = make_elementwise_rule<1>("my_sgd", {"momentum"},
///       [lr](int64_t) { return lr; },
///       [](float lr, float& p, float g, float* s) { s[0] = 0.9f * s[0] + g; p -= lr * s[0]; });
template <int NumStates, class Prepare, class Element>
std::unique_ptr<UpdateRule> make_elementwise_rule(
    std::string name, std::array<std::string, NumStates> state_names, Prepare prepare,
    Element element, std::array<float, NumStates> init_values = {});

// ---- implementation of make_elementwise_rule -------------------------------------------

namespace detail {

template <int NumStates, class Prepare, class Element>
class ElementwiseRule final : public UpdateRule {
  static_assert(NumStates >= 0 && NumStates <= kMaxStateStreams, "0..4 state streams");

 public:
  ElementwiseRule(std::string name, std::array<std::string, NumStates> state_names,
                  Prepare prepare, Element element, std::array<float, NumStates> init)
      : name_(std::move(name)), state_names_(std::move(state_names)),
        prepare_(std::move(prepare)), element_(std::move(element)), init_(init) {}

  std::string_view name() const override { return name_; }
  int num_states() const override { return NumStates; }
  std::string_view state_name(int i) const override { return state_names_[i]; }
  float state_init_value(int i) const override { return init_[i]; }

  void update(const UpdateSpans& s, const StepInfo& info) const override {
    constexpr size_t kBlock = 1024;
    const auto scalars = prepare_(info.step);
    alignas(64) float g[kBlock];
    for (size_t b = 0; b < s.numel; b += kBlock) {
      const size_t n = std::min(kBlock, s.numel - b);
      const size_t gsize = dtype_size(s.grad_type);
      load_scaled_grad(static_cast<const char*>(s.grad) + b * gsize, s.grad_type,
                       info.grad_scale, g, n);
      float* p = s.param + b;
      for (size_t i = 0; i < n; ++i) {
        float st[NumStates > 0 ? NumStates : 1];
        for (int k = 0; k < NumStates; ++k) st[k] = s.states[k][b + i];
        element_(scalars, p[i], g[i], st);
        for (int k = 0; k < NumStates; ++k) s.states[k][b + i] = st[k];
      }
      if (s.param_copy != nullptr) {
        store_converted(p, s.param_copy_type,
                        static_cast<char*>(s.param_copy) + b * dtype_size(s.param_copy_type),
                        n);
      }
    }
  }

 private:
  std::string name_;
  std::array<std::string, NumStates> state_names_;
  Prepare prepare_;
  Element element_;
  std::array<float, NumStates> init_;
};

}  // namespace detail

template <int NumStates, class Prepare, class Element>
std::unique_ptr<UpdateRule> make_elementwise_rule(std::string name,
                                                  std::array<std::string, NumStates> state_names,
                                                  Prepare prepare, Element element,
                                                  std::array<float, NumStates> init_values) {
  return std::make_unique<detail::ElementwiseRule<NumStates, Prepare, Element>>(
      std::move(name), std::move(state_names), std::move(prepare), std::move(element),
      init_values);
}

}  // namespace strata::optimizer
