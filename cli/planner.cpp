// The bandwidth planner's model (planner.hpp; derivation and figures in docs/planner.md).
#include "planner.hpp"

#include <algorithm>
#include <cmath>

namespace strata::cli::planner {

double flops_per_iteration(double params, double seq, double bsz) {
  return 2.0 * 4.0 * bsz * seq * params;
}

double ait_params_grads(double seq, double bsz) { return seq * bsz; }

double ait_optimizer_states(double seq, double bsz) { return seq * bsz / 4.0; }

double ait_activation_checkpoints(double hidden, double ci) { return 24.0 * hidden * ci; }

double efficiency(double ait, double bw, double peak_tp) {
  const double x = ait * bw;
  return x > 0 ? x / (x + peak_tp) : 0.0;
}

double required_bandwidth(double ait, double eff, double peak_tp) {
  return eff * peak_tp / (ait * (1.0 - eff));
}

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::kIteration: return "iteration";
    case Phase::kOptimizer: return "optimizer";
    case Phase::kFetch: return "fetch";
  }
  return "?";
}

const char* offload_name(Offload o) {
  switch (o) {
    case Offload::kOptimizer: return "optimizer";
    case Offload::kParams: return "params";
    case Offload::kAll: return "all";
  }
  return "?";
}

const char* device_name(Device d) { return d == Device::kNvme ? "nvme" : "cpu"; }

namespace {

// How a user obtains each measurement (the NotFound message).
const std::map<std::string, std::string>& hints() {
  static const std::map<std::string, std::string> h = {
      {kNvmeRead, "`strata tune` (measured section of --config), `strata bench io --op read "
                  "--json` (--from-bench), or --nvme-read-bw"},
      {kNvmeWrite, "`strata tune` (measured section of --config), `strata bench io --op write "
                   "--json` (--from-bench), or --nvme-write-bw"},
      {kMemoryCopy, "`strata tune` (measured section of --config) or --memory-bw"},
      {kAdam, "`strata tune` (measured section of --config), `strata bench adam --json` "
              "(--from-bench), or --adam-params-per-s"},
      {kAllgather, "`strata bench allgather --nproc N --json` (--from-bench), "
                   "measured.allgather_bytes_per_s in --config, or --allgather-bw"},
      {kPcie, "measured.pcie_bytes_per_s in --config (`strata tune` on a machine with a GPU) "
              "or --pcie-bw"},
      {kGpuMemory, "--gpu-memory-bw (the GPU's memory bandwidth)"},
  };
  return h;
}

// Collects the measurements a configuration needs; missing() lists those absent.
class Needs {
 public:
  explicit Needs(const Measurements& m) : m_(m) {}
  // The measurement `key`, or 0 (recorded as missing) when absent.
  const Measurement* get(const std::string& key) {
    auto it = m_.find(key);
    if (it != m_.end() && it->second.value > 0) return &it->second;
    if (std::find(missing_.begin(), missing_.end(), key) == missing_.end()) missing_.push_back(key);
    return nullptr;
  }
  const Measurement* optional(const std::string& key) const {
    auto it = m_.find(key);
    return it != m_.end() && it->second.value > 0 ? &it->second : nullptr;
  }
  Status status() const {
    if (missing_.empty()) return Status::OK();
    std::string msg = missing_.size() == 1 ? "missing measurement: " : "missing measurements: ";
    for (size_t i = 0; i < missing_.size(); ++i) {
      if (i) msg += "; ";
      auto h = hints().find(missing_[i]);
      msg += missing_[i] + " (" + (h != hints().end() ? h->second : "no source known") + ")";
    }
    return not_found(msg);
  }

 private:
  const Measurements& m_;
  std::vector<std::string> missing_;
};

// A tier moving `bytes` at the rate of `meas` (null: missing; the tier is then skipped, the
// plan fails with Needs::status()).
void add_tier(std::vector<TierTime>& tiers, const std::string& name, double bytes,
              const Measurement* meas) {
  if (meas == nullptr || bytes <= 0) return;
  tiers.push_back({name, bytes, meas->value, bytes / meas->value, meas->source});
}

const TierTime* slowest(const std::vector<TierTime>& tiers) {
  const TierTime* s = nullptr;
  for (const auto& t : tiers) {
    if (s == nullptr || t.seconds > s->seconds) s = &t;
  }
  return s;
}

// max_i t_i + (sum_i t_i - max_i t_i) / items (PhasePlan).
void finish_pipeline(PhasePlan& ph) {
  double sum = 0;
  for (const auto& t : ph.tiers) sum += t.seconds;
  const TierTime* s = slowest(ph.tiers);
  const double mx = s ? s->seconds : 0.0;
  ph.seconds = mx + (sum - mx) / std::max(1.0, ph.items);
  ph.bottleneck = s ? s->tier : "";
}

Status validate(const PlanOptions& o) {
  auto positive = [](double v) { return std::isfinite(v) && v > 0; };
  if (!positive(o.params)) {
    return invalid_argument("--params must be a positive number of parameters, got " +
                            std::to_string(o.params));
  }
  if (o.nodes < 1) return invalid_argument("--nodes must be >= 1, got " + std::to_string(o.nodes));
  if (o.gpus_per_node < 0) {
    return invalid_argument("--gpus must be >= 0, got " + std::to_string(o.gpus_per_node));
  }
  if (o.ranks_per_node < 0) {
    return invalid_argument("--ranks-per-node must be >= 0, got " +
                            std::to_string(o.ranks_per_node));
  }
  if (o.phase == Phase::kIteration && o.gpus_per_node < 1) {
    return invalid_argument("--gpus must be >= 1 for --phase iteration (forward and backward "
                            "run on GPUs); --phase optimizer or fetch model CPU-only ranks");
  }
  if (o.offload == Offload::kParams && o.phase != Phase::kFetch && o.gpus_per_node < 1) {
    return invalid_argument("--offload params keeps the optimizer step on the GPU: it needs "
                            "--gpus >= 1");
  }
  if (!positive(o.seq)) return invalid_argument("--seq must be > 0");
  if (!positive(o.batch)) return invalid_argument("--batch must be > 0");
  if (!positive(o.peak_tflops)) return invalid_argument("--peak-tflops must be > 0");
  if (!positive(o.state_bytes)) return invalid_argument("--state-bytes must be > 0");
  if (!positive(o.sub_group_numel)) return invalid_argument("--sub-group must be > 0");
  if (!positive(o.piece_bytes)) return invalid_argument("--piece-bytes must be > 0");
  if (!positive(o.chunk_bytes)) return invalid_argument("--chunk-bytes must be > 0");
  if (!positive(o.ci)) return invalid_argument("--ci must be > 0");
  if (o.offload_activations && !positive(o.hidden)) {
    return invalid_argument("--offload-activations needs --hidden (the model's hidden size)");
  }
  return Status::OK();
}

}  // namespace

Result<Plan> plan(const PlanOptions& o, const Measurements& m) {
  STRATA_RETURN_IF_ERROR(validate(o));
  Plan p;
  p.options = o;
  const int rpn = o.ranks_per_node > 0 ? o.ranks_per_node : std::max(1, o.gpus_per_node);
  p.ranks = rpn * o.nodes;
  const double P = p.ranks, M = o.nodes, N = o.params;
  const double per_node = N / M, per_rank = N / P;
  const bool gpus = o.gpus_per_node > 0;
  const bool params_off = o.offload != Offload::kOptimizer;
  const bool opt_off = o.offload != Offload::kParams;
  const bool nvme = o.device == Device::kNvme;
  Needs need(m);
  Measurement peak{o.peak_tflops * 1e12, "--peak-tflops"};
  const double compute_s = gpus ? flops_per_iteration(N, o.seq, o.batch) / peak.value : 0.0;
  if (gpus) p.flops_per_gpu = flops_per_iteration(N, o.seq, o.batch);

  auto credit = [&](const std::string& tier, double s) { p.bottleneck_seconds[tier] += s; };

  if (o.phase == Phase::kIteration) {
    // Forward + backward (+ recomputation): fp16 parameters fetched three times, fp16
    // gradients stored once (SC21 sec. 4.2), by layer, so the fill of one layer is ignored.
    PhasePlan fb;
    fb.name = "forward_backward";
    std::vector<TierTime> move;
    const double param_bytes = 2 * N;
    double pcie_up = 0, pcie_down = 0;
    if (params_off) {
      add_tier(move, nvme ? "nvme" : "memory", 3 * param_bytes / M,
               need.get(nvme ? kNvmeRead : kMemoryCopy));
      pcie_up += 3 * param_bytes / P;
    }
    if (opt_off) pcie_down += param_bytes / P;  // each rank's gradient slice to the host
    if (o.offload_activations) {
      // One fp16 checkpoint of batch x seq x hidden per ci blocks of 12 hidden^2 params,
      // written in forward, read in backward.
      const double blocks = N / (12.0 * o.hidden * o.hidden);
      const double ckpt = blocks / o.ci * 2 * o.batch * o.seq * o.hidden;
      pcie_up += ckpt;
      pcie_down += ckpt;
    }
    // PCIe is full duplex: the busier direction.
    add_tier(move, "pcie", std::max(pcie_up, pcie_down), pcie_up + pcie_down > 0 ? need.get(kPcie) : nullptr);
    if (P > 1) {
      // Three all-gathers of the parameters and one reduce-scatter of the gradients, each
      // moving (P - 1) / P of 2 B/param through every rank at the collective's busbw.
      add_tier(move, "network", 4 * param_bytes * (P - 1) / P, need.get(kAllgather));
    }
    fb.tiers.push_back({"compute", p.flops_per_gpu, peak.value, compute_s, peak.source});
    const TierTime* mv = slowest(move);
    const double move_s = mv ? mv->seconds : 0.0;
    if (mv) {
      p.params_grads_bandwidth = 8 * N / move_s;
      p.params_grads_efficiency = efficiency(ait_params_grads(o.seq, o.batch),
                                             *p.params_grads_bandwidth, peak.value);
    }
    const std::string move_tier = mv ? mv->tier : "";
    for (auto& t : move) fb.tiers.push_back(t);
    if (o.overlap) {
      fb.seconds = std::max(compute_s, move_s);
      fb.bottleneck = compute_s >= move_s ? "compute" : move_tier;
      credit(fb.bottleneck, fb.seconds);
    } else {
      fb.seconds = compute_s + move_s;
      fb.bottleneck = compute_s >= move_s ? "compute" : move_tier;
      credit("compute", compute_s);
      if (mv) credit(move_tier, move_s);
    }
    p.phases.push_back(std::move(fb));
  }

  if (o.phase != Phase::kFetch) {
    // The optimizer step: each rank updates its 1/P of the parameters, sub-group by
    // sub-group, reads, update and writes overlapping (optimizer/src/offload_pipeline.cpp).
    PhasePlan st;
    st.name = "optimizer_step";
    st.items = std::ceil(per_rank / o.sub_group_numel);
    if (opt_off) {
      if (nvme) {
        // A sub-group smaller than its object's chunk touches part of a chunk: its
        // read_range reads (and verifies) the whole chunk, and its write_range is a
        // copy-on-write of the whole chunk (read the old one, write a fresh one;
        // store/src/store_ops.cpp). With k = chunk / (4 B x sub-group) sub-groups per chunk
        // the drive reads 2k and writes k times the state; k = 1 (whole chunks) reads and
        // writes it once. The optimizer's state objects have chunks of whole sub-groups of
        // at least 1 MiB (optimizer/src/offload_impl.hpp, kMinStateChunk), so k > 1 only
        // for sub-groups under 1 MiB.
        const double sg_bytes = 4 * o.sub_group_numel;
        double object_chunk = o.chunk_bytes;
        if (sg_bytes < o.chunk_bytes && std::fmod(sg_bytes, 4096.0) == 0) {
          const double per_chunk = std::ceil((1 << 20) / sg_bytes);
          if (per_chunk * sg_bytes <= o.chunk_bytes) object_chunk = per_chunk * sg_bytes;
        }
        const double k = std::max(1.0, std::ceil(object_chunk / sg_bytes));
        double rd = o.state_bytes * per_node * (k > 1 ? 2 * k : 1.0);
        double wr = o.state_bytes * per_node * k;
        if (params_off) wr += 2 * per_node;  // the updated fp16 parameters
        // Reads and writes share the node's drives: mixed throughput when measured, else
        // each direction at its own rate, one after the other.
        if (const Measurement* mix = need.optional(kNvmeMixed)) {
          add_tier(st.tiers, "nvme", rd + wr, mix);
        } else {
          const Measurement* r = need.get(kNvmeRead);
          const Measurement* w = need.get(kNvmeWrite);
          if (r && w) {
            const double s = rd / r->value + wr / w->value;
            st.tiers.push_back({"nvme", rd + wr, (rd + wr) / s, s, r->source + " + " + w->source});
          }
        }
      }
      add_tier(st.tiers, "cpu_adam", per_node, need.get(kAdam));
      // The updated fp16 parameters back to a GPU that keeps them.
      if (gpus && !params_off) add_tier(st.tiers, "pcie", 2 * per_rank, need.get(kPcie));
    } else {
      // Adam on the GPU: 2 x 16 B/param of states through its memory (SC21 sec. 4.2), the
      // updated fp16 parameters out to the offload tier.
      add_tier(st.tiers, "gpu_memory", 32 * per_rank, need.get(kGpuMemory));
      add_tier(st.tiers, "pcie", 2 * per_rank, need.get(kPcie));
      add_tier(st.tiers, nvme ? "nvme" : "memory", 2 * per_node,
               need.get(nvme ? kNvmeWrite : kMemoryCopy));
    }
    finish_pipeline(st);
    credit(st.bottleneck, st.seconds);
    if (st.seconds > 0) {
      p.optimizer_bandwidth = 32 * N / st.seconds;
      if (gpus) {
        p.optimizer_efficiency = efficiency(ait_optimizer_states(o.seq, o.batch),
                                            *p.optimizer_bandwidth, peak.value);
      }
    }
    p.phases.push_back(std::move(st));
  }

  if (o.phase == Phase::kFetch) {
    // One fetch of the fp16 parameters, bandwidth-centric: every rank reads its slice from
    // its own drive(s) and the slices are all-gathered (store/partitioned.hpp), in pieces.
    PhasePlan f;
    f.name = "parameter_fetch";
    const double total = 2 * N, slice = total / P;
    f.items = std::ceil(slice / o.piece_bytes);
    // The reads are bounded by the node's aggregate and, when known, by each rank's own
    // drive: one stage, limited by the slower of the two.
    std::vector<TierTime> reads;
    add_tier(reads, nvme ? "nvme" : "memory", total / M, need.get(nvme ? kNvmeRead : kMemoryCopy));
    if (nvme) add_tier(reads, "drive", slice, need.optional(kDriveRead));
    if (const TierTime* r = slowest(reads)) f.tiers.push_back(*r);
    if (gpus) add_tier(f.tiers, "pcie", slice, need.get(kPcie));
    if (P > 1) {
      add_tier(f.tiers, "network", total * (P - 1) / P, need.get(kAllgather));
    } else if (nvme) {
      // One rank: the gather is a copy of the slice into the destination.
      add_tier(f.tiers, "memory", total, need.optional(kMemoryCopy));
    }
    if (o.overlap) {
      finish_pipeline(f);
    } else {  // the links one after the other (see PlanOptions::overlap)
      f.seconds = 0;
      for (const auto& t : f.tiers) f.seconds += t.seconds;
      const TierTime* s = slowest(f.tiers);
      f.bottleneck = s ? s->tier : "";
    }
    credit(f.bottleneck, f.seconds);
    p.phases.push_back(std::move(f));
  }

  STRATA_RETURN_IF_ERROR(need.status());
  for (const auto& ph : p.phases) p.predicted_step_seconds += ph.seconds;
  double best = -1;
  for (const auto& [tier, s] : p.bottleneck_seconds) {
    if (s > best) {
      best = s;
      p.bottleneck = tier;
    }
  }
  if (gpus && o.phase == Phase::kIteration && p.predicted_step_seconds > 0) {
    p.overall_efficiency = compute_s / p.predicted_step_seconds;
  }
  return p;
}

nlohmann::json plan_to_json(const Plan& p, const Measurements& m) {
  const PlanOptions& o = p.options;
  nlohmann::json j;
  j["predicted_step_seconds"] = p.predicted_step_seconds;
  j["bottleneck"] = p.bottleneck;
  j["bottleneck_seconds"] = p.bottleneck_seconds;
  nlohmann::json phases = nlohmann::json::array();
  for (const auto& ph : p.phases) {
    nlohmann::json tiers = nlohmann::json::array();
    for (const auto& t : ph.tiers) {
      tiers.push_back({{"tier", t.tier}, {"amount", t.bytes}, {"rate", t.rate},
                       {"seconds", t.seconds}, {"source", t.source}});
    }
    phases.push_back({{"phase", ph.name}, {"seconds", ph.seconds}, {"bottleneck", ph.bottleneck},
                      {"pipeline_items", ph.items}, {"tiers", tiers}});
  }
  j["phases"] = phases;
  auto opt = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(); };
  const double peak = o.peak_tflops * 1e12;
  j["efficiencies"] = {{"params_grads", opt(p.params_grads_efficiency)},
                       {"params_grads_effective_bytes_per_s", opt(p.params_grads_bandwidth)},
                       {"optimizer_states", opt(p.optimizer_efficiency)},
                       {"optimizer_effective_bytes_per_s", opt(p.optimizer_bandwidth)},
                       {"overall", opt(p.overall_efficiency)}};
  const double ait_pg = ait_params_grads(o.seq, o.batch), ait_os = ait_optimizer_states(o.seq, o.batch);
  j["requirements"] = {
      {"ait_params_grads", ait_pg},
      {"ait_optimizer_states", ait_os},
      {"params_grads_bytes_per_s_for_50pct", required_bandwidth(ait_pg, 0.5, peak)},
      {"params_grads_bytes_per_s_for_90pct", required_bandwidth(ait_pg, 0.9, peak)},
      {"optimizer_bytes_per_s_for_50pct", required_bandwidth(ait_os, 0.5, peak)},
      {"optimizer_bytes_per_s_for_90pct", required_bandwidth(ait_os, 0.9, peak)}};
  if (o.hidden > 0) {
    const double ait_ac = ait_activation_checkpoints(o.hidden, o.ci);
    j["requirements"]["ait_activation_checkpoints"] = ait_ac;
    j["requirements"]["activation_bytes_per_s_for_50pct"] = required_bandwidth(ait_ac, 0.5, peak);
  }
  j["inputs"] = {{"params", o.params},           {"gpus_per_node", o.gpus_per_node},
                 {"nodes", o.nodes},             {"ranks", p.ranks},
                 {"seq", o.seq},                 {"batch_per_gpu", o.batch},
                 {"peak_tflops", o.peak_tflops}, {"phase", phase_name(o.phase)},
                 {"offload", offload_name(o.offload)}, {"device", device_name(o.device)},
                 {"overlap", o.overlap},         {"state_bytes_per_param", o.state_bytes},
                 {"sub_group_numel", o.sub_group_numel}, {"chunk_bytes", o.chunk_bytes},
                 {"piece_bytes", o.piece_bytes},
                 {"flops_per_gpu", p.flops_per_gpu}};
  nlohmann::json meas = nlohmann::json::object();
  for (const auto& [k, v] : m) meas[k] = {{"value", v.value}, {"source", v.source}};
  j["measurements"] = meas;
  return j;
}

}  // namespace strata::cli::planner
