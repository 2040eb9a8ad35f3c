// `strata bench adam`: throughput of one CPU optimizer step over N parameters, beside the
// memory-bandwidth limit of an update of the same shape measured in the same run.
//
// The limit is the streaming probe (optimizers.hpp: make_streaming_probe): the same
// streams as the optimizer (param, grad and each state read; param and each state written),
// the same size, threads and tiling, with no arithmetic. Kernel and probe steps alternate,
// and each figure is the median of its steps, so machine noise hits both alike.
//
// Memory: numel x (4 B param + the gradient's element size + 4 B per optimizer state), e.g.
// 14 B/param for Adam with an fp16 gradient; refused (ResourceExhausted) beyond MemAvailable.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_adam_cmd.hpp"
#include "bench_limits.hpp"
#include "command.hpp"
#include "strata/base/dtype.hpp"
#include "strata/optimizer/optimizers.hpp"
#include "strata/optimizer/simd.hpp"
#include "strata/optimizer/kernel_pool.hpp"
#include "strata/optimizer/update.hpp"

namespace strata::cli {
namespace {

namespace opt = strata::optimizer;


// Anonymous memory on transparent huge pages when the kernel allows (fewer TLB misses).
class HostBuffer {
 public:
  explicit HostBuffer(size_t nbytes) : nbytes_(std::max<size_t>(nbytes, 1)) {
    void* p = ::mmap(nullptr, nbytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      p_ = nullptr;
      return;
    }
    (void)::madvise(p, nbytes_, MADV_HUGEPAGE);
    p_ = p;
  }
  ~HostBuffer() {
    if (p_ != nullptr) ::munmap(p_, nbytes_);
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  void* data() const { return p_; }

 private:
  size_t nbytes_;
  void* p_ = nullptr;
};

Result<std::unique_ptr<opt::UpdateRule>> make_rule(const std::string& name) {
  if (name == "adam") return opt::make_adam({});
  if (name == "adamw") {
    opt::AdamOptions o;
    o.weight_decay = opt::kAdamWDefaultWeightDecay;
    return opt::make_adamw(o);
  }
  if (name == "adagrad") return opt::make_adagrad({});
  if (name == "sgd") {
    opt::SgdOptions o;
    o.momentum = 0.9;
    return opt::make_sgd(o);
  }
  if (name == "lion") return opt::make_lion({});
  return invalid_argument("unknown optimizer '" + name +
                          "' (expected adam, adamw, adagrad, sgd or lion)");
}

uint16_t bits16_of(float x, DType t) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if (t == DType::kBFloat16) return static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
  // fp16 of small |x| < 2: good enough for benchmark data (exponent 15 +- a few).
  uint16_t h;
  opt::store_converted(&x, DType::kFloat16, &h, 1);
  return h;
}

}  // namespace

Result<AdamMeasurement> measure_adam(const BenchAdamArgs& a) {
  auto gt = parse_dtype(a.grad_dtype);
  if (!gt.ok()) return gt.status();
  if (*gt != DType::kFloat32 && *gt != DType::kFloat16 && *gt != DType::kBFloat16) {
    return invalid_argument("--grad-dtype must be fp32, fp16 or bf16");
  }
  if (a.steps < 1) return invalid_argument("--steps must be >= 1");
  if (!a.simd.empty()) {
    if (auto s = opt::force_simd_target(a.simd); !s.ok()) return s;
  }
  auto rule_r = make_rule(a.optimizer);
  if (!rule_r.ok()) return rule_r.status();
  const auto& rule = **rule_r;
  auto probe = opt::make_streaming_probe(rule.num_states());

  opt::KernelPoolOptions po;
  po.num_threads = a.threads;
  po.numa_node = a.numa_node;
  auto pool_r = opt::make_kernel_pool(po);
  if (!pool_r.ok()) return pool_r.status();
  auto& pool = **pool_r;

  if (a.numel == 0) return invalid_argument("--numel must be >= 1, got 0");
  const size_t n = a.numel;
  const size_t gsize = dtype_size(*gt);
  {
    const uint64_t per_param = 4 + gsize + 4 * static_cast<uint64_t>(rule.num_states());
    auto need = checked_mul(n, per_param,
                            "--numel " + std::to_string(n) + " needs " +
                                std::to_string(per_param) + " bytes per parameter");
    if (!need.ok()) return need.status();
    if (Status st = check_memory(*need, "bench adam --numel " + std::to_string(n) + " (" +
                                            std::to_string(per_param) + " B/param)");
        !st.ok()) {
      return st;
    }
  }
  HostBuffer pbuf(n * 4), gbuf(n * gsize);
  std::vector<std::unique_ptr<HostBuffer>> sbufs;
  for (int k = 0; k < rule.num_states(); ++k) sbufs.push_back(std::make_unique<HostBuffer>(n * 4));
  bool ok = pbuf.data() != nullptr && gbuf.data() != nullptr;
  for (auto& b : sbufs) ok = ok && b->data() != nullptr;
  if (!ok) {
    return resource_exhausted("cannot map " + std::to_string(n) +
                                           " parameters of optimizer state", errno);
  }
  opt::UpdateSpans spans;
  spans.param = static_cast<float*>(pbuf.data());
  spans.grad = gbuf.data();
  spans.grad_type = *gt;
  for (int k = 0; k < rule.num_states(); ++k) spans.states[k] = static_cast<float*>(sbufs[k]->data());
  spans.numel = n;

  // First touch by the pool's threads (pages land on their NUMA node); deterministic data.
  const size_t tiles = (n + opt::kTileNumel - 1) / opt::kTileNumel;
  pool.parallel_for(tiles, [&](size_t t0, size_t t1) {
    const size_t b = t0 * opt::kTileNumel, e = std::min(n, t1 * opt::kTileNumel);
    uint32_t x = static_cast<uint32_t>(b) * 2654435761u + 12345u;
    for (size_t i = b; i < e; ++i) {
      x = x * 1664525u + 1013904223u;
      const float r = static_cast<float>(x >> 8) * (1.0f / 16777216.0f) - 0.5f;  // [-0.5, 0.5)
      spans.param[i] = r;
      const float g = 0.01f * r + 0.001f;
      if (*gt == DType::kFloat32) {
        static_cast<float*>(gbuf.data())[i] = g;
      } else {
        static_cast<uint16_t*>(gbuf.data())[i] = bits16_of(g, *gt);
      }
    }
  });
  if (auto s = opt::init_states(rule, spans, &pool); !s.ok()) return s;

  using clock = std::chrono::steady_clock;
  std::vector<double> t_kernel, t_probe;
  opt::ParamState state;
  for (int i = 0; i < a.warmup + a.steps; ++i) {
    auto t0 = clock::now();
    if (auto s = opt::step(rule, spans, state, &pool); !s.ok()) return s;
    auto t1 = clock::now();
    if (auto s = opt::apply_update(*probe, spans, {1, 1.0f}, &pool); !s.ok()) {
      return s;
    }
    auto t2 = clock::now();
    if (i >= a.warmup) {
      t_kernel.push_back(std::chrono::duration<double>(t1 - t0).count());
      t_probe.push_back(std::chrono::duration<double>(t2 - t1).count());
    }
  }
  // Keep the result observable (and check it is finite).
  if (n > 0 && !std::isfinite(spans.param[n / 2])) {
    return internal_error("parameter " + std::to_string(n / 2) + " is not finite");
  }

  AdamMeasurement m;
  m.numel = n;
  m.threads = pool.num_threads();
  m.numa_node = po.numa_node >= 0 ? po.numa_node : -1;
  m.grad_dtype = *gt;
  m.bytes_per_param = opt::bytes_per_element(rule, *gt, false);
  m.seconds_all = std::move(t_kernel);
  m.probe_seconds_all = std::move(t_probe);
  return m;
}

namespace {

int run_bench_adam(const BenchAdamArgs& a) {
  auto m_r = measure_adam(a);
  if (!m_r.ok()) return report_error(m_r.status());
  const AdamMeasurement& m = *m_r;
  const size_t n = m.numel;
  const auto& t_kernel = m.seconds_all;
  const auto& t_probe = m.probe_seconds_all;
  const int threads = m.threads;
  const DType grad_type = m.grad_dtype;
  const double sec = median(t_kernel);
  const double sec_probe = median(t_probe);
  const size_t bpe = m.bytes_per_param;
  const double bytes = static_cast<double>(bpe) * static_cast<double>(n);
  const double gbps = sec > 0 ? bytes / sec / 1e9 : 0.0;
  const double limit = sec_probe > 0 ? bytes / sec_probe / 1e9 : 0.0;
  const double frac = limit > 0 ? gbps / limit : 0.0;
  const double ns_per_param = n > 0 ? sec * 1e9 / static_cast<double>(n) : 0.0;

  if (a.json) {
    nlohmann::json j;
    j["benchmark"] = "adam";
    j["optimizer"] = a.optimizer;
    j["numel"] = n;
    j["threads"] = threads;
    j["numa_node"] = m.numa_node;
    j["grad_dtype"] = dtype_name(grad_type);
    j["simd"] = opt::active_simd_target();
    j["steps"] = a.steps;
    j["bytes_per_param"] = bpe;
    j["seconds_per_step"] = sec;
    j["ns_per_param"] = ns_per_param;
    j["gbps"] = gbps;
    j["mem_limit_seconds_per_step"] = sec_probe;
    j["mem_limit_gbps"] = limit;
    j["fraction_of_limit"] = frac;
    j["seconds_per_step_all"] = t_kernel;
    j["mem_limit_seconds_all"] = t_probe;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("optimizer %s, %zu params, grad %s, %d threads, SIMD %s, %d steps\n",
                a.optimizer.c_str(), n, std::string(dtype_name(grad_type)).c_str(), threads,
                opt::active_simd_target().c_str(), a.steps);
    std::printf("  step (median):        %10.3f ms  %7.3f ns/param  %7.2f GB/s (%zu B/param)\n",
                sec * 1e3, ns_per_param, gbps, bpe);
    std::printf("  memory limit (probe): %10.3f ms  %25.2f GB/s\n", sec_probe * 1e3, limit);
    std::printf("  fraction of limit:    %10.3f\n", frac);
  }
  return 0;
}

void register_bench_adam(Registry& r) {
  auto args = std::make_shared<BenchAdamArgs>();
  CLI::App* sub = add_command(
      bench_group(r), "adam",
      "CPU optimizer step throughput vs. a streaming kernel of the same shape", args,
      run_bench_adam);
  add_defaulted(sub, "--numel", args->numel,
                "parameters (elements, >= 1; memory: 4 B + gradient + 4 B per state, each)");
  add_defaulted(sub, "--threads", args->threads, "worker threads (0 = one per core)");
  add_defaulted(sub, "--numa-node", args->numa_node, "NUMA node to bind to (-1 = none)");
  add_defaulted(sub, "--grad-dtype", args->grad_dtype, "gradient dtype: fp32, fp16, bf16");
  add_defaulted(sub, "--optimizer", args->optimizer,
                "adam, adamw, adagrad, sgd (momentum 0.9), lion");
  sub->add_option("--simd", args->simd, "force a SIMD target (AVX3, AVX2, SSE4, SSSE3, SCALAR)");
  add_defaulted(sub, "--steps", args->steps, "timed steps (median reported)")
      ->check(CLI::Range(1, 1000000));
  add_defaulted(sub, "--warmup", args->warmup, "untimed steps first")
      ->check(CLI::Range(0, 1000000));
  sub->add_flag("--json", args->json, "print one JSON object");
}

STRATA_CLI_COMMAND(register_bench_adam);

}  // namespace
}  // namespace strata::cli
