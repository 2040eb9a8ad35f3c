// The update engine: validation, tiling over the thread pool, step counting.
#include "strata/optimizer/update.hpp"

#include <cstring>
#include <mutex>
#include <string>

#include "kernels.hpp"
#include "strata/base/thread_pool.hpp"

namespace strata::optimizer {

UpdateSpans UpdateSpans::slice(size_t begin, size_t count) const {
  UpdateSpans s = *this;
  s.param = param + begin;
  s.grad = static_cast<const char*>(grad) + begin * dtype_size(grad_type);
  for (auto& st : s.states) {
    if (st != nullptr) st += begin;
  }
  if (param_copy != nullptr) {
    s.param_copy = static_cast<char*>(param_copy) + begin * dtype_size(param_copy_type);
  }
  s.numel = count;
  return s;
}

namespace {

bool is_grad_type(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat16 || t == DType::kBFloat16;
}

Status validate_impl(const UpdateRule& rule, const UpdateSpans& s, bool need_grad) {
  const int ns = rule.num_states();
  if (ns < 0 || ns > kMaxStateStreams) {
    return invalid_argument("update rule '" + std::string(rule.name()) + "' has " +
                            std::to_string(ns) + " state streams (at most " +
                            std::to_string(kMaxStateStreams) + ")");
  }
  if (!is_grad_type(s.grad_type)) {
    return invalid_argument("grad_type " + std::string(dtype_name(s.grad_type)) +
                            " is not supported (fp32, fp16 or bf16)");
  }
  if (s.param_copy != nullptr && s.param_copy_type != DType::kFloat16 &&
      s.param_copy_type != DType::kBFloat16 && s.param_copy_type != DType::kFloat32) {
    return invalid_argument("param_copy_type " + std::string(dtype_name(s.param_copy_type)) +
                            " is not supported (fp16, bf16 or fp32)");
  }
  if (s.numel == 0) return Status::OK();
  if (s.param == nullptr) return invalid_argument("param is null with numel " + std::to_string(s.numel));
  if (need_grad && s.grad == nullptr) {
    return invalid_argument("grad is null with numel " + std::to_string(s.numel));
  }
  for (int k = 0; k < ns; ++k) {
    if (s.states[k] == nullptr) {
      return invalid_argument("state stream " + std::to_string(k) + " ('" +
                              std::string(rule.state_name(k)) + "') of rule '" +
                              std::string(rule.name()) + "' is null");
    }
  }
  return Status::OK();
}

}  // namespace

Status validate_spans(const UpdateRule& rule, const UpdateSpans& spans) {
  return validate_impl(rule, spans, true);
}

Status apply_update(const UpdateRule& rule, const UpdateSpans& spans, const StepInfo& info,
                    ThreadPool* pool) {
  STRATA_RETURN_IF_ERROR(validate_spans(rule, spans));
  if (info.step < 1) {
    return invalid_argument("step must be >= 1, got " + std::to_string(info.step));
  }
  const size_t n = spans.numel;
  // An fp32 copy is the updated master itself: the rule updates without it, and each tile
  // is copied right after its update (still in cache).
  float* f32_copy = nullptr;
  UpdateSpans s = spans;
  if (s.param_copy != nullptr && s.param_copy_type == DType::kFloat32) {
    f32_copy = static_cast<float*>(s.param_copy);
    s.param_copy = nullptr;
  }
  // The first error of a tile. update_or_fail() for every rule: a rule that says it never
  // fails (may_fail() false: no transaction around the step) but does (a C rule with
  // may_fail = 0 returning an error) fails the step part-way (checkpoint and close refuse
  // then; a reopen resumes the last checkpoint) instead of being ignored, its update partly
  // applied and checkpointed later as if it had succeeded.
  std::mutex error_mu;
  Status error;
  auto run = [&](size_t begin, size_t count) {
    StepInfo at = info;
    at.offset = info.offset + begin;
    Status st = rule.update_or_fail(s.slice(begin, count), at);
    if (!st.ok()) {
      std::lock_guard<std::mutex> lk(error_mu);
      if (error.ok()) error = std::move(st);
      return;
    }
    if (f32_copy != nullptr && count > 0) {
      std::memcpy(f32_copy + begin, s.param + begin, count * sizeof(float));
    }
  };
  if (rule.whole_spans() || pool == nullptr || pool->num_threads() <= 1 ||
      n < kMinParallelNumel) {
    run(0, n);
    return error;
  }
  const size_t tiles = (n + kTileNumel - 1) / kTileNumel;
  pool->parallel_for(tiles, [&](size_t t0, size_t t1) {
    const size_t begin = t0 * kTileNumel;
    const size_t end = std::min(n, t1 * kTileNumel);
    run(begin, end - begin);
  });
  return error;
}

Status init_states(const UpdateRule& rule, const UpdateSpans& spans, ThreadPool* pool) {
  STRATA_RETURN_IF_ERROR(validate_impl(rule, spans, false));
  const size_t n = spans.numel;
  const int ns = rule.num_states();
  auto fill = [&](size_t begin, size_t end) {
    for (int k = 0; k < ns; ++k) {
      std::fill(spans.states[k] + begin, spans.states[k] + end, rule.state_init_value(k));
    }
  };
  if (pool == nullptr || pool->num_threads() <= 1 || n < kMinParallelNumel) {
    fill(0, n);
    return Status::OK();
  }
  const size_t tiles = (n + kTileNumel - 1) / kTileNumel;
  pool->parallel_for(tiles, [&](size_t t0, size_t t1) {
    fill(t0 * kTileNumel, std::min(n, t1 * kTileNumel));
  });
  return Status::OK();
}

Status step(const UpdateRule& rule, const UpdateSpans& spans, ParamState& state,
            ThreadPool* pool, float grad_scale) {
  StepInfo info;
  info.step = state.step() + 1;
  info.grad_scale = grad_scale;
  STRATA_RETURN_IF_ERROR(apply_update(rule, spans, info, pool));
  state.advance();
  return Status::OK();
}

void load_scaled_grad(const void* src, DType type, float scale, float* dst, size_t numel) {
  kernels::load_scaled_grad(src, type, scale, dst, numel);
}

void store_converted(const float* src, DType type, void* dst, size_t numel) {
  kernels::store_converted(src, type, dst, numel);
}

}  // namespace strata::optimizer
