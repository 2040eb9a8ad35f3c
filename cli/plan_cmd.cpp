// `strata plan`: predicts the step time and the bottleneck of a ZeRO-Infinity style run from
// measured bandwidths (planner.hpp; docs/planner.md).
//
//   strata plan --params N --gpus G --nodes M [--config FILE] [--from-bench FILE ...]
//               [--phase iteration|optimizer|fetch] [--offload optimizer|params|all]
//               [--offload-device nvme|cpu] [--seq S] [--batch B] [--peak-tflops T]
//               [--nvme-read-bw ... measurement overrides] [--json]
//
// Measurements: the configuration file's "measured" section (--config, else STRATA_CONFIG),
// then each --from-bench file in order, then the measurement flags, each replacing the one
// before. A measurement the configuration needs and none of them gives is an error naming
// it and how to measure it; the planner never assumes one.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "command.hpp"
#include "plan_inputs.hpp"
#include "planner.hpp"

namespace strata::cli {
namespace {

namespace pl = planner;

struct PlanArgs {
  std::string params;
  int gpus = -1;
  int nodes = 1;
  int ranks_per_node = 0;
  std::string config;
  std::vector<std::string> from_bench;
  std::string phase = "iteration", offload = "all", device = "nvme";
  std::string seq = "1024", batch = "1", peak_tflops = "70";
  std::string state_bytes = "12", sub_group = "16777216", chunk_bytes = "67108864";
  std::string piece_bytes = "8388608";
  std::string hidden, ci = "1";
  bool overlap = false, offload_activations = false, json = false;
  // Measurement overrides (bytes/s or params/s; "" = not given).
  std::string nvme_read, nvme_write, nvme_mixed, memory, adam, allgather, pcie, drive, gpu_memory;
};

/// A positive number with an optional decimal suffix K/M/G/B/T (1e3 .. 1e12), e.g. "7B",
/// "1.5e9", "2.5G". \error InvalidArgument naming `option` otherwise.
Result<double> parse_number(const std::string& text, const std::string& option) {
  const char* s = text.c_str();
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(s, &end);
  if (end == s) return invalid_argument(option + ": '" + text + "' is not a number");
  std::string suffix(end);
  static const std::pair<const char*, double> kSuffixes[] = {
      {"", 1}, {"K", 1e3}, {"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"B", 1e9}, {"T", 1e12}};
  bool ok = false;
  for (const auto& [name, mul] : kSuffixes) {
    if (suffix == name) {
      v *= mul;
      ok = true;
    }
  }
  if (!ok) {
    return invalid_argument(option + ": '" + text + "' has an unknown suffix '" + suffix +
                            "' (K, M, G or B, T: powers of 10)");
  }
  if (!std::isfinite(v) || !(v > 0)) {
    return invalid_argument(option + " must be a positive number, got '" + text + "'");
  }
  return v;
}

int run_plan(const PlanArgs& a) {
  pl::PlanOptions o;
  auto num = [](const std::string& text, const std::string& opt, double& out) -> Status {
    STRATA_ASSIGN_OR_RETURN(out, parse_number(text, opt));
    return Status::OK();
  };
  for (const auto& [text, opt, out] : std::vector<std::tuple<std::string, std::string, double*>>{
           {a.params, "--params", &o.params},
           {a.seq, "--seq", &o.seq},
           {a.batch, "--batch", &o.batch},
           {a.peak_tflops, "--peak-tflops", &o.peak_tflops},
           {a.state_bytes, "--state-bytes", &o.state_bytes},
           {a.sub_group, "--sub-group", &o.sub_group_numel},
           {a.chunk_bytes, "--chunk-bytes", &o.chunk_bytes},
           {a.piece_bytes, "--piece-bytes", &o.piece_bytes},
           {a.ci, "--ci", &o.ci}}) {
    if (Status st = num(text, opt, *out); !st.ok()) return report_error(st);
  }
  if (!a.hidden.empty()) {
    if (Status st = num(a.hidden, "--hidden", o.hidden); !st.ok()) return report_error(st);
  }
  o.gpus_per_node = a.gpus;
  o.nodes = a.nodes;
  o.ranks_per_node = a.ranks_per_node;
  o.phase = a.phase == "iteration" ? pl::Phase::kIteration
            : a.phase == "optimizer" ? pl::Phase::kOptimizer
                                     : pl::Phase::kFetch;
  o.offload = a.offload == "optimizer" ? pl::Offload::kOptimizer
              : a.offload == "params"  ? pl::Offload::kParams
                                       : pl::Offload::kAll;
  o.device = a.device == "cpu" ? pl::Device::kCpu : pl::Device::kNvme;
  o.overlap = a.overlap;
  o.offload_activations = a.offload_activations;

  pl::Measurements m;
  std::string config = a.config;
  if (config.empty()) {
    if (const char* env = std::getenv("STRATA_CONFIG"); env != nullptr && *env) config = env;
  }
  if (!config.empty()) {
    if (Status st = pl::read_config_measured(config, m); !st.ok()) return report_error(st);
  }
  for (const auto& f : a.from_bench) {
    if (Status st = pl::read_bench_json(f, m); !st.ok()) return report_error(st);
  }
  for (const auto& [text, opt, key] : std::vector<std::tuple<std::string, std::string, const char*>>{
           {a.nvme_read, "--nvme-read-bw", pl::kNvmeRead},
           {a.nvme_write, "--nvme-write-bw", pl::kNvmeWrite},
           {a.nvme_mixed, "--nvme-mixed-bw", pl::kNvmeMixed},
           {a.memory, "--memory-bw", pl::kMemoryCopy},
           {a.adam, "--adam-params-per-s", pl::kAdam},
           {a.allgather, "--allgather-bw", pl::kAllgather},
           {a.pcie, "--pcie-bw", pl::kPcie},
           {a.drive, "--drive-bw", pl::kDriveRead},
           {a.gpu_memory, "--gpu-memory-bw", pl::kGpuMemory}}) {
    if (text.empty()) continue;
    double v = 0;
    if (Status st = num(text, opt, v); !st.ok()) return report_error(st);
    m[key] = pl::Measurement{v, opt};
  }

  auto r = pl::plan(o, m);
  if (!r.ok()) return report_error(r.status());
  const pl::Plan& p = *r;
  if (a.json) {
    std::printf("%s\n", pl::plan_to_json(p, m).dump().c_str());
    return 0;
  }
  std::printf("plan: %.3g params, %d GPU(s)/node x %d node(s), %d rank(s), phase %s, offload %s "
              "to %s\n",
              o.params, o.gpus_per_node, o.nodes, p.ranks, pl::phase_name(o.phase),
              pl::offload_name(o.offload), pl::device_name(o.device));
  for (const auto& ph : p.phases) {
    std::printf("  %-17s %10.3f s   bottleneck %s", ph.name.c_str(), ph.seconds,
                ph.bottleneck.c_str());
    if (ph.name != "forward_backward") std::printf(" (a pipeline of %g items)", ph.items);
    std::printf("\n");
    for (const auto& t : ph.tiers) {
      std::printf("    %-10s %12.4g at %12.4g/s = %10.4f s   (%s)\n", t.tier.c_str(), t.bytes,
                  t.rate, t.seconds, t.source.c_str());
    }
  }
  std::printf("  predicted step:   %10.3f s   bottleneck: %s\n", p.predicted_step_seconds,
              p.bottleneck.c_str());
  if (p.params_grads_efficiency) {
    std::printf("  efficiency (SC21 sec. 4.2): params+grads %.3f at %.4g B/s effective",
                *p.params_grads_efficiency, *p.params_grads_bandwidth);
    if (p.optimizer_efficiency) {
      std::printf(", optimizer states %.3f at %.4g B/s", *p.optimizer_efficiency,
                  *p.optimizer_bandwidth);
    }
    if (p.overall_efficiency) std::printf(", overall %.3f", *p.overall_efficiency);
    std::printf("\n");
  }
  return 0;
}

void register_plan(Registry& r) {
  auto a = std::make_shared<PlanArgs>();
  CLI::App* sub = add_command(r.root(), "plan",
                              "predict step time and bottleneck tier from measured bandwidths "
                              "(ZeRO-Infinity model, docs/planner.md)",
                              a, run_plan);
  sub->add_option("--params", a->params, "model parameters (e.g. 7B, 1.5e9)")->required();
  sub->add_option("--gpus", a->gpus, "GPUs per node (0: CPU-only ranks, --phase optimizer|fetch)")
      ->required();
  add_defaulted(sub, "--nodes", a->nodes, "nodes");
  add_defaulted(sub, "--ranks-per-node", a->ranks_per_node,
                "data-parallel ranks per node (0: one per GPU, or 1 without GPUs)");
  sub->add_option("--config", a->config,
                  "configuration file whose 'measured' section gives the bandwidths "
                  "(default: $STRATA_CONFIG)");
  sub->add_option("--from-bench", a->from_bench,
                  "JSON of `strata bench io|adam|step|allgather|partitioned-read --json` "
                  "(repeatable; later files replace earlier figures)");
  add_defaulted(sub, "--phase", a->phase,
                "iteration (forward/backward + optimizer step), optimizer (the step alone, "
                "as `bench step`), fetch (one partitioned parameter fetch)")
      ->check(CLI::IsMember({"iteration", "optimizer", "fetch"}));
  add_defaulted(sub, "--offload", a->offload, "model states off the GPU: optimizer|params|all")
      ->check(CLI::IsMember({"optimizer", "params", "all"}));
  add_defaulted(sub, "--offload-device", a->device, "where offloaded states live: nvme|cpu")
      ->check(CLI::IsMember({"nvme", "cpu"}));
  add_defaulted(sub, "--seq", a->seq, "sequence length (tokens)");
  add_defaulted(sub, "--batch", a->batch, "micro-batch per GPU (sequences)");
  add_defaulted(sub, "--peak-tflops", a->peak_tflops,
                "achievable peak per GPU (TFLOP/s; 70 is the paper's V100 figure)");
  sub->add_flag("--overlap", a->overlap,
                "assume overlap: forward/backward data movement hidden under compute, the "
                "fetch's reads and all-gather pipelined (default: serial, the paper's "
                "no-overlap model)");
  add_defaulted(sub, "--state-bytes", a->state_bytes,
                "optimizer state bytes per param on the offload tier (Adam: fp32 master, m, v)");
  add_defaulted(sub, "--sub-group", a->sub_group, "optimizer sub-group (elements)");
  add_defaulted(sub, "--chunk-bytes", a->chunk_bytes,
                "store chunk (bytes): a smaller sub-group rewrites whole chunks");
  add_defaulted(sub, "--piece-bytes", a->piece_bytes, "partitioned-fetch piece per rank (bytes)");
  sub->add_option("--hidden", a->hidden, "hidden size (activation-checkpoint terms)");
  add_defaulted(sub, "--ci", a->ci, "transformer blocks per activation checkpoint");
  sub->add_flag("--offload-activations", a->offload_activations,
                "activation checkpoints to host memory over PCIe (needs --hidden)");
  sub->add_option("--nvme-read-bw", a->nvme_read, "node NVMe read, bytes/s (e.g. 3.2G)");
  sub->add_option("--nvme-write-bw", a->nvme_write, "node NVMe write, bytes/s");
  sub->add_option("--nvme-mixed-bw", a->nvme_mixed,
                  "node NVMe concurrent read+write, bytes moved/s (the optimizer step's mix)");
  sub->add_option("--memory-bw", a->memory, "host memory copy, bytes/s");
  sub->add_option("--adam-params-per-s", a->adam, "CPU Adam, fp32 params/s per node");
  sub->add_option("--allgather-bw", a->allgather, "all-gather busbw per rank, bytes/s");
  sub->add_option("--pcie-bw", a->pcie, "host<->GPU per GPU and direction, bytes/s");
  sub->add_option("--drive-bw", a->drive, "one rank's own drive read, bytes/s");
  sub->add_option("--gpu-memory-bw", a->gpu_memory, "GPU memory bandwidth, bytes/s");
  sub->add_flag("--json", a->json, "print one JSON object");
}

STRATA_CLI_COMMAND(register_plan);

}  // namespace
}  // namespace strata::cli
