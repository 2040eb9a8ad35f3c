// Google Benchmark micro-benchmarks of the optimizer kernels (single thread, in cache and
// out of cache) beside the streaming probe of the same shape. Bytes are the bytes an
// update must move (bytes_per_element), so GB/s compares directly with the probe's.
//
//   strata_microbench --benchmark_filter=Optimizer
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <vector>

#include "strata/optimizer/grad_utils.hpp"
#include "strata/optimizer/optimizers.hpp"
#include "strata/optimizer/simd.hpp"
#include "strata/optimizer/update.hpp"

namespace {

namespace opt = strata::optimizer;
using strata::DType;

std::unique_ptr<opt::UpdateRule> rule_for(int which) {
  switch (which) {
    case 0: return opt::make_adam({}).value();
    case 1: {
      opt::AdamOptions o;
      o.weight_decay = opt::kAdamWDefaultWeightDecay;
      return opt::make_adamw(o).value();
    }
    case 2: return opt::make_adagrad({}).value();
    case 3: {
      opt::SgdOptions o;
      o.momentum = 0.9;
      return opt::make_sgd(o).value();
    }
    case 4: return opt::make_lion({}).value();
    default: return opt::make_streaming_probe(2);
  }
}

// args: numel, rule (0 adam, 1 adamw, 2 adagrad, 3 sgd, 4 lion, 5 probe/2 states), grad dtype
void BM_OptimizerStep(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  auto rule = rule_for(static_cast<int>(state.range(1)));
  const auto gt = static_cast<DType>(state.range(2));
  std::vector<float> p(n, 0.5f);
  std::vector<uint32_t> g(n, 0x3C003C00u);  // fp32 ~0.0078, fp16/bf16 small values
  std::vector<std::vector<float>> st(rule->num_states(), std::vector<float>(n));
  opt::UpdateSpans s;
  s.param = p.data();
  s.grad = g.data();
  s.grad_type = gt;
  for (int k = 0; k < rule->num_states(); ++k) s.states[k] = st[k].data();
  s.numel = n;
  (void)opt::init_states(*rule, s, nullptr);
  opt::ParamState ps;
  for (auto _ : state) {
    if (!opt::step(*rule, s, ps, nullptr).ok()) state.SkipWithError("step failed");
    benchmark::DoNotOptimize(p.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(opt::bytes_per_element(*rule, gt, false) * n));
  state.SetLabel(std::string(rule->name()) + " " + std::string(strata::dtype_name(gt)) + " " +
                 opt::active_simd_target());
}

void OptimizerArgs(benchmark::internal::Benchmark* b) {
  for (int64_t n : {int64_t{1} << 14, int64_t{1} << 24}) {
    for (int r = 0; r <= 5; ++r) b->Args({n, r, static_cast<int64_t>(DType::kFloat32)});
    b->Args({n, 0, static_cast<int64_t>(DType::kFloat16)});
    b->Args({n, 0, static_cast<int64_t>(DType::kBFloat16)});
  }
}
BENCHMARK(BM_OptimizerStep)->Apply(OptimizerArgs)->Unit(benchmark::kMicrosecond);

/// One pass of `pass(view)` per iteration over range(0) gradient elements of type T, all
/// `fill`, viewed as `dtype`; bytes processed are the gradient's.
template <class T, class Pass>
void grad_pass(benchmark::State& state, T fill, DType dtype, Pass pass) {
  const size_t n = static_cast<size_t>(state.range(0));
  std::vector<T> g(n, fill);
  const opt::GradView v{g.data(), dtype, n};
  for (auto _ : state) benchmark::DoNotOptimize(pass(v));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * sizeof(T)));
}

void BM_OptimizerGradNorm(benchmark::State& state) {
  grad_pass(state, 0.25f, DType::kFloat32,
            [](const opt::GradView& v) { return opt::global_l2_norm({&v, 1}).value(); });
}
BENCHMARK(BM_OptimizerGradNorm)->Arg(1 << 14)->Arg(1 << 24)->Unit(benchmark::kMicrosecond);

void BM_OptimizerInfNanCheck(benchmark::State& state) {
  grad_pass(state, uint16_t{0x3C00}, DType::kFloat16,
            [](const opt::GradView& v) { return opt::has_inf_or_nan({&v, 1}).value(); });
}
BENCHMARK(BM_OptimizerInfNanCheck)->Arg(1 << 14)->Arg(1 << 24)->Unit(benchmark::kMicrosecond);

}  // namespace
