// The bandwidth planner (cli/planner.cpp, cli/plan_inputs.cpp): the ZeRO-Infinity paper's
// required-bandwidth figures (SC21 sec. 4.2, Fig. 3), the model's times on known inputs, and
// its inputs (configuration "measured" section, bench JSON) with their errors.
#include "planner.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "plan_inputs.hpp"
#include "common/temp_dir.hpp"

namespace strata::cli::planner {
namespace {

using strata::testing::TempDir;

constexpr double kPeak = 70e12;  // the paper's achievable V100 peak (Fig. 3)

// Fig. 3a: "with a bandwidth over 70 GB/s for parameter and gradients, we can achieve over
// 50% efficiency for even the smallest batch size" (bsz 1, seq 1024).
TEST(PlannerPaper, ParamsGradsSeventyGBsGiveOverHalfAtBatchOne) {
  const double ait = ait_params_grads(1024, 1);
  EXPECT_EQ(ait, 1024.0);
  EXPECT_DOUBLE_EQ(efficiency(ait, 70e9, kPeak), 1024.0 / 2024.0);  // 0.5059
  EXPECT_GT(efficiency(ait, 70e9, kPeak), 0.5);
  // The exact 50% point: 70e12 / 1024 B/s = 68.36 GB/s, which the paper rounds up to 70.
  EXPECT_DOUBLE_EQ(required_bandwidth(ait, 0.5, kPeak), 68359375000.0);
  EXPECT_EQ(std::round(required_bandwidth(ait, 0.5, kPeak) / 1e10) * 10, 70.0);
}

// Fig. 3b: optimizer states need 4x the parameter/gradient bandwidth for the same
// efficiency (ait seq x bsz / 4), and "achieving 90% efficiency with batch size of 2 per GPU
// requires nearly 1.5 TB/s".
TEST(PlannerPaper, OptimizerStatesNeedFourTimesAndAboutOnePointFiveTBsForNinetyPercent) {
  for (double bsz : {1.0, 2.0, 4.0, 8.0, 16.0}) {
    EXPECT_DOUBLE_EQ(required_bandwidth(ait_optimizer_states(1024, bsz), 0.5, kPeak),
                     4 * required_bandwidth(ait_params_grads(1024, bsz), 0.5, kPeak));
  }
  const double ait = ait_optimizer_states(1024, 2);
  EXPECT_EQ(ait, 512.0);
  // The formula's 90% point is 0.9 x 70e12 / (512 x 0.1) = 1.23 TB/s; at the paper's 1.5 TB/s
  // the efficiency is 768 / 838 = 0.916 (the paper reads its curve at ~1.5 TB/s).
  EXPECT_DOUBLE_EQ(required_bandwidth(ait, 0.9, kPeak), 1.23046875e12);
  EXPECT_DOUBLE_EQ(efficiency(ait, 1.5e12, kPeak), 768.0 / 838.0);
  EXPECT_GE(efficiency(ait, 1.5e12, kPeak), 0.9);
  EXPECT_LT(efficiency(ait, 1.0e12, kPeak), 0.9);
}

// Fig. 3c: activation checkpoints (ait 24 x hd x ci): "even with a hidden size of 2K, a
// meager bandwidth of 2 GB/s is able to sustain over 50% efficiency", and the requirement
// "drops below 1 GB/s once the hidden size becomes larger than 8K".
TEST(PlannerPaper, ActivationCheckpointsNeedOnlyAFewGBs) {
  EXPECT_EQ(ait_activation_checkpoints(2048, 1), 49152.0);
  EXPECT_DOUBLE_EQ(efficiency(49152, 2e9, kPeak), 98.304 / 168.304);  // 0.584
  EXPECT_GT(efficiency(49152, 2e9, kPeak), 0.5);
  EXPECT_DOUBLE_EQ(required_bandwidth(ait_activation_checkpoints(8192, 1), 0.5, kPeak),
                   70e12 / 196608);  // 0.356 GB/s
  EXPECT_LT(required_bandwidth(ait_activation_checkpoints(8192, 1), 0.5, kPeak), 1e9);
}

// Total computation per iteration: 2 x 4 x bsz x seq x params.
TEST(PlannerPaper, ComputePerIteration) {
  EXPECT_EQ(flops_per_iteration(1e12, 1024, 2), 16384e12);
}

Measurements meas(std::initializer_list<std::pair<const char*, double>> kv) {
  Measurements m;
  for (const auto& [k, v] : kv) m[k] = Measurement{v, "test"};
  return m;
}

// The offloaded optimizer step alone (what `strata bench step` measures): NVMe reads and
// writes one after the other, Adam overlapped, one sub-group of fill; with --offload all the
// updated fp16 parameters are written to the drive too.
TEST(PlannerModel, OptimizerStepFromReadWriteAndAdam) {
  PlanOptions o;
  o.params = 1e8;
  o.gpus_per_node = 0;
  o.phase = Phase::kOptimizer;
  o.offload = Offload::kOptimizer;  // the states only: no fp16 parameter copy on the drive
  auto p = plan(o, meas({{kNvmeRead, 1e9}, {kNvmeWrite, 2e9}, {kAdam, 2e8}}));
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  ASSERT_EQ(p->phases.size(), 1u);
  const PhasePlan& st = p->phases[0];
  EXPECT_EQ(st.name, "optimizer_step");
  EXPECT_EQ(st.items, 6.0);  // ceil(1e8 / 16777216)
  ASSERT_EQ(st.tiers.size(), 2u);
  EXPECT_EQ(st.tiers[0].tier, "nvme");
  EXPECT_DOUBLE_EQ(st.tiers[0].seconds, 1.2 + 0.6);  // 1.2 GB at 1 GB/s + 1.2 GB at 2 GB/s
  EXPECT_EQ(st.tiers[1].tier, "cpu_adam");
  EXPECT_DOUBLE_EQ(st.tiers[1].seconds, 0.5);
  EXPECT_DOUBLE_EQ(p->predicted_step_seconds, 1.8 + 0.5 / 6);
  EXPECT_EQ(p->bottleneck, "nvme");
  EXPECT_FALSE(p->optimizer_efficiency.has_value());  // no GPU: no compute to compare with
  // A measured mixed rate replaces the two directions.
  auto q = plan(o, meas({{kNvmeMixed, 3e9}, {kAdam, 2e8}}));
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_DOUBLE_EQ(q->predicted_step_seconds, 0.8 + 0.5 / 6);
  // Adam slower than the drive: cpu_adam.
  auto c = plan(o, meas({{kNvmeMixed, 3e9}, {kAdam, 1e8}}));
  ASSERT_TRUE(c.ok());
  EXPECT_DOUBLE_EQ(c->predicted_step_seconds, 1.0 + 0.8 / 6);
  EXPECT_EQ(c->bottleneck, "cpu_adam");
  o.offload = Offload::kAll;
  auto a = plan(o, meas({{kNvmeMixed, 3e9}, {kAdam, 2e8}}));
  ASSERT_TRUE(a.ok());
  EXPECT_DOUBLE_EQ(a->phases[0].tiers[0].seconds, 2.6e9 / 3e9);
  // Sub-groups of a quarter chunk: the state objects have chunks of one sub-group, so the
  // state is read and written once, as with whole-chunk sub-groups.
  o.offload = Offload::kOptimizer;
  o.sub_group_numel = 4194304;
  auto s = plan(o, meas({{kNvmeRead, 1e9}, {kNvmeWrite, 2e9}, {kAdam, 2e8}}));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->phases[0].items, 24.0);
  EXPECT_DOUBLE_EQ(s->phases[0].tiers[0].seconds, 1.2 + 0.6);
  EXPECT_DOUBLE_EQ(s->predicted_step_seconds, 1.8 + 0.5 / 24);
  // Sub-groups of 64 Ki elements (256 KiB) get chunks of 4 sub-groups (1 MiB, the least):
  // every read_range reads its whole chunk and every write_range rewrites it
  // (copy-on-write): 8x the state read, 4x written.
  o.sub_group_numel = 65536;
  auto t = plan(o, meas({{kNvmeRead, 1e9}, {kNvmeWrite, 2e9}, {kAdam, 2e8}}));
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->phases[0].items, 1526.0);  // ceil(1e8 / 65536)
  EXPECT_DOUBLE_EQ(t->phases[0].tiers[0].seconds, 8 * 1.2 + 4 * 0.6);
}

// A full iteration: 8 GPUs, one node, everything offloaded to NVMe.
TEST(PlannerModel, IterationOnOneNodeOfEightGpus) {
  PlanOptions o;
  o.params = 1e9;
  o.gpus_per_node = 8;
  o.batch = 4;
  o.peak_tflops = 100;
  auto p = plan(o, meas({{kNvmeRead, 25e9}, {kNvmeWrite, 20e9}, {kPcie, 12e9},
                         {kAllgather, 100e9}, {kAdam, 1e9}}));
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  ASSERT_EQ(p->phases.size(), 2u);
  const PhasePlan& fb = p->phases[0];
  ASSERT_EQ(fb.tiers.size(), 4u);
  EXPECT_EQ(fb.tiers[0].tier, "compute");
  EXPECT_DOUBLE_EQ(fb.tiers[0].seconds, 0.32768);  // 8 x 4 x 1024 x 1e9 / 1e14
  EXPECT_EQ(fb.tiers[1].tier, "nvme");
  EXPECT_DOUBLE_EQ(fb.tiers[1].seconds, 0.24);     // 3 x 2 GB / 25 GB/s
  EXPECT_EQ(fb.tiers[2].tier, "pcie");
  EXPECT_DOUBLE_EQ(fb.tiers[2].seconds, 0.0625);   // 3 x 2 GB / 8 up, at 12 GB/s
  EXPECT_EQ(fb.tiers[3].tier, "network");
  EXPECT_DOUBLE_EQ(fb.tiers[3].seconds, 0.07);     // 4 x 2 GB x 7/8 / 100 GB/s
  EXPECT_DOUBLE_EQ(fb.seconds, 0.32768 + 0.24);
  EXPECT_EQ(fb.bottleneck, "compute");
  const PhasePlan& st = p->phases[1];
  EXPECT_EQ(st.items, 8.0);  // ceil(1.25e8 / 16777216)
  EXPECT_DOUBLE_EQ(st.tiers[0].seconds, 12e9 / 25e9 + 14e9 / 20e9);  // + fp16 params written
  EXPECT_DOUBLE_EQ(st.tiers[1].seconds, 1.0);
  EXPECT_DOUBLE_EQ(st.seconds, 1.18 + 1.0 / 8);
  EXPECT_DOUBLE_EQ(p->predicted_step_seconds, 0.56768 + 1.305);
  EXPECT_EQ(p->bottleneck, "nvme");  // 0.24 + 1.305 s against compute's 0.328 s
  EXPECT_DOUBLE_EQ(p->bottleneck_seconds.at("compute"), 0.32768);
  EXPECT_DOUBLE_EQ(p->bottleneck_seconds.at("nvme"), 0.24 + 1.305);
  // The paper's efficiencies are compute / (compute + movement).
  EXPECT_DOUBLE_EQ(*p->params_grads_bandwidth, 8e9 / 0.24);
  EXPECT_NEAR(*p->params_grads_efficiency, 0.32768 / 0.56768, 1e-15);
  EXPECT_NEAR(*p->optimizer_efficiency, 0.32768 / (0.32768 + 1.305), 1e-15);
  EXPECT_NEAR(*p->overall_efficiency, 0.32768 / 1.87268, 1e-15);
  // With overlap the forward/backward phase is max(compute, movement).
  o.overlap = true;
  auto q = plan(o, meas({{kNvmeRead, 25e9}, {kNvmeWrite, 20e9}, {kPcie, 12e9},
                         {kAllgather, 100e9}, {kAdam, 1e9}}));
  ASSERT_TRUE(q.ok());
  EXPECT_DOUBLE_EQ(q->predicted_step_seconds, 0.32768 + 1.305);
}

// One partitioned fetch over 4 ranks of one node, each on its own throttled drive.
TEST(PlannerModel, PartitionedFetchOverFourDrives) {
  PlanOptions o;
  o.params = 64 * 1048576.0;  // 128 MiB of fp16
  o.gpus_per_node = 0;
  o.ranks_per_node = 4;
  o.phase = Phase::kFetch;
  o.overlap = true;  // pipelined pieces
  auto p = plan(o, meas({{kNvmeRead, 1e9}, {kDriveRead, 2e8}, {kAllgather, 2e9}}));
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  const PhasePlan& f = p->phases[0];
  EXPECT_EQ(f.items, 4.0);  // 32 MiB slices in 8 MiB pieces
  // The reads: the node's 128 MiB at 1 GB/s (0.134 s) or each rank's 32 MiB from its own
  // drive at 0.2 GB/s (0.168 s), whichever is slower.
  ASSERT_EQ(f.tiers.size(), 2u);
  EXPECT_EQ(f.tiers[0].tier, "drive");
  EXPECT_DOUBLE_EQ(f.tiers[0].seconds, 33554432 / 2e8);
  EXPECT_DOUBLE_EQ(f.tiers[1].seconds, 134217728 * 0.75 / 2e9);
  EXPECT_DOUBLE_EQ(p->predicted_step_seconds,
                   33554432 / 2e8 + (134217728 * 0.75 / 2e9) / 4);
  EXPECT_EQ(p->bottleneck, "drive");
  // Without overlap: the sum of the links.
  o.overlap = false;
  auto q = plan(o, meas({{kNvmeRead, 1e9}, {kDriveRead, 2e8}, {kAllgather, 2e9}}));
  ASSERT_TRUE(q.ok());
  EXPECT_DOUBLE_EQ(q->predicted_step_seconds, 33554432 / 2e8 + 134217728 * 0.75 / 2e9);
  // Faster drives: the node's aggregate limits.
  auto n = plan(o, meas({{kNvmeRead, 1e9}, {kDriveRead, 1e9}, {kAllgather, 2e9}}));
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->phases[0].tiers[0].tier, "nvme");
  // One rank: the gather is a local copy, at the memory bandwidth when it is known.
  o.ranks_per_node = 1;
  auto one = plan(o, meas({{kNvmeRead, 1e9}, {kMemoryCopy, 4e9}}));
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->phases[0].tiers.size(), 2u);
  EXPECT_EQ(one->phases[0].tiers[1].tier, "memory");
  EXPECT_DOUBLE_EQ(one->predicted_step_seconds, 134217728 / 1e9 + 134217728 / 4e9);
  EXPECT_EQ(one->bottleneck, "nvme");
}

TEST(PlannerModel, MissingMeasurementsAreNamed) {
  PlanOptions o;
  o.params = 1e9;
  o.gpus_per_node = 8;
  auto p = plan(o, meas({{kNvmeRead, 25e9}, {kAdam, 1e9}}));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kNotFound);
  const std::string msg = p.status().to_string();
  EXPECT_NE(msg.find("missing measurements: pcie_bytes_per_s"), std::string::npos) << msg;
  EXPECT_NE(msg.find("allgather_bytes_per_s"), std::string::npos) << msg;
  EXPECT_NE(msg.find("nvme_write_bytes_per_s"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("adam_params_per_s ("), std::string::npos) << msg;  // given
}

TEST(PlannerModel, BadOptionsAreNamed) {
  const Measurements m = meas({{kNvmeMixed, 1e9}, {kAdam, 1e9}});
  PlanOptions o;
  o.phase = Phase::kOptimizer;
  o.params = 0;
  EXPECT_NE(plan(o, m).status().to_string().find("--params must be a positive"), std::string::npos);
  o.params = -5;
  EXPECT_EQ(plan(o, m).status().code(), StatusCode::kInvalidArgument);
  o.params = 1e9;
  o.nodes = 0;
  EXPECT_NE(plan(o, m).status().to_string().find("--nodes must be >= 1"), std::string::npos);
  o.nodes = 1;
  o.phase = Phase::kIteration;
  EXPECT_NE(plan(o, m).status().to_string().find("--gpus must be >= 1 for --phase iteration"),
            std::string::npos);
  o.gpus_per_node = 1;
  o.offload_activations = true;
  EXPECT_NE(plan(o, m).status().to_string().find("--offload-activations needs --hidden"),
            std::string::npos);
}

std::string write_file(TempDir& d, const std::string& name, const std::string& text) {
  const std::string path = d.path() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(PlannerInputs, ConfigMeasuredSection) {
  TempDir d;
  Measurements m;
  const std::string ok = write_file(
      d, "ok.json",
      R"({"strata_config": 1, "io": {"block_size": 1048576},
          "measured": {"nvme_read_bytes_per_s": 3.2e9, "nvme_write_bytes_per_s": 2e9,
                       "memory_copy_bytes_per_s": 1e10, "adam_params_per_s": 5e8,
                       "paths": ["/a", "/b"]}})");
  ASSERT_TRUE(read_config_measured(ok, m).ok());
  EXPECT_EQ(m.size(), 4u);
  EXPECT_EQ(m.at(kNvmeRead).value, 3.2e9);
  EXPECT_EQ(m.at(kAdam).source, "config " + ok);
  Measurements none;
  ASSERT_TRUE(read_config_measured(write_file(d, "none.json", R"({"strata_config": 1})"), none).ok());
  EXPECT_TRUE(none.empty());

  // The store's data path wins over the raw engine's for the NVMe rates, each on its own:
  // here the read comes from store_*, the write (no store_write) from nvme_*.
  Measurements ms;
  const std::string st_file = write_file(
      d, "store.json",
      R"({"measured": {"nvme_read_bytes_per_s": 3.2e9, "nvme_write_bytes_per_s": 2e9,
                       "store_read_bytes_per_s": 2.25e9}})");
  ASSERT_TRUE(read_config_measured(st_file, ms).ok());
  EXPECT_EQ(ms.size(), 2u);
  EXPECT_EQ(ms.at(kNvmeRead).value, 2.25e9);
  EXPECT_EQ(ms.at(kNvmeRead).source, "config " + st_file);
  EXPECT_EQ(ms.at(kNvmeWrite).value, 2e9);
  const std::string both = write_file(
      d, "both.json",
      R"({"measured": {"nvme_read_bytes_per_s": 3.2e9, "nvme_write_bytes_per_s": 2e9,
                       "store_read_bytes_per_s": 2.25e9, "store_write_bytes_per_s": 1.25e9}})");
  ASSERT_TRUE(read_config_measured(both, ms).ok());
  EXPECT_EQ(ms.at(kNvmeRead).value, 2.25e9);
  EXPECT_EQ(ms.at(kNvmeWrite).value, 1.25e9);
  // a zero store rate is refused under its own name (not nvme_*'s)
  Status zs = read_config_measured(
      write_file(d, "zs.json", R"({"measured": {"store_write_bytes_per_s": 0}})"), ms);
  EXPECT_NE(zs.to_string().find("'measured.store_write_bytes_per_s' must be a positive number, got 0"),
            std::string::npos) << zs.to_string();

  const std::string typo = write_file(d, "typo.json", R"({"measured": {"nvme_read_bytes_per_sec": 1}})");
  Status st = read_config_measured(typo, m);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.to_string().find("config file '" + typo +
                                 "': unknown key 'measured.nvme_read_bytes_per_sec' (did you mean "
                                 "'measured.nvme_read_bytes_per_s'?)"),
            std::string::npos) << st.to_string();
  // the shared parser refuses a negative value; a zero passes it (a file may record an
  // unmeasured 0) and the planner refuses it
  st = read_config_measured(write_file(d, "neg.json", R"({"measured": {"adam_params_per_s": -1}})"), m);
  EXPECT_NE(st.to_string().find("measured.adam_params_per_s: expected a finite number >= 0, got -1"),
            std::string::npos) << st.to_string();
  st = read_config_measured(write_file(d, "zero.json", R"({"measured": {"adam_params_per_s": 0}})"), m);
  EXPECT_NE(st.to_string().find("'measured.adam_params_per_s' must be a positive number, got 0"),
            std::string::npos) << st.to_string();
  st = read_config_measured(write_file(d, "bad.json", R"({"measured": {)"), m);
  EXPECT_NE(st.to_string().find("parse error at line 1, column 15"), std::string::npos)
      << st.to_string();
  st = read_config_measured(d.path() + "/absent.json", m);
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.to_string();
  EXPECT_NE(st.to_string().find("absent.json"), std::string::npos);
}

TEST(PlannerInputs, BenchJson) {
  TempDir d;
  Measurements m;
  ASSERT_TRUE(read_bench_json(write_file(d, "r.json", "progress\n{\"op\": \"read\", \"gbps\": 1.5}\n"), m).ok());
  ASSERT_TRUE(read_bench_json(write_file(d, "w.json", R"({"op": "write", "gbps": 2})"), m).ok());
  ASSERT_TRUE(read_bench_json(write_file(d, "a.json", R"({"benchmark": "adam", "numel": 1e8, "seconds_per_step": 0.25})"), m).ok());
  ASSERT_TRUE(read_bench_json(write_file(d, "g.json", R"({"collective": "allgather", "nproc": 4, "busbw_gbps": 3})"), m).ok());
  EXPECT_EQ(m.at(kNvmeRead).value, 1.5e9);
  EXPECT_EQ(m.at(kNvmeWrite).value, 2e9);
  EXPECT_EQ(m.at(kAdam).value, 4e8);
  EXPECT_EQ(m.at(kAllgather).value, 3e9);
  ASSERT_TRUE(read_bench_json(write_file(d, "s.json", R"({"benchmark": "step", "params": 1e8, "io_seconds": 2, "compute_seconds": 0.5})"), m).ok());
  EXPECT_EQ(m.at(kNvmeMixed).value, 1.2e9);
  EXPECT_EQ(m.at(kAdam).value, 2e8);  // replaced by the later file
  ASSERT_TRUE(read_bench_json(write_file(d, "p.json", R"({"bench": "partitioned-read", "nproc": 4, "allgather_algbw_gbps": 4, "per_drive_gbps": 0.2, "emulated": true})"), m).ok());
  EXPECT_EQ(m.at(kAllgather).value, 3e9);
  EXPECT_EQ(m.at(kDriveRead).value, 2e8);
  Measurements sm;  // bench store prints its object over several lines
  ASSERT_TRUE(read_bench_json(write_file(d, "st.json", "{\n \"object_bytes\": 1,\n \"put_gbps\": 0.5,\n \"get_gbps\": 0.75\n}\n"), sm).ok());
  EXPECT_EQ(sm.at(kNvmeWrite).value, 0.5e9);
  EXPECT_EQ(sm.at(kNvmeRead).value, 0.75e9);
  Measurements shared;  // ranks sharing one disk: no per-drive figure
  ASSERT_TRUE(read_bench_json(write_file(d, "q.json", R"({"bench": "partitioned-read", "nproc": 2, "allgather_algbw_gbps": 4, "per_drive_gbps": 0.2, "emulated": false})"), shared).ok());
  EXPECT_EQ(shared.count(kDriveRead), 0u);
  EXPECT_EQ(shared.at(kAllgather).value, 2e9);

  Status st = read_bench_json(write_file(d, "x.json", R"({"hello": 1})"), m);
  EXPECT_NE(st.to_string().find("not the --json result of a strata bench command"), std::string::npos);
  st = read_bench_json(write_file(d, "y.json", R"({"op": "read", "gbps": "fast"})"), m);
  EXPECT_NE(st.to_string().find("field 'gbps' must be a positive number, got \"fast\""), std::string::npos)
      << st.to_string();
  st = read_bench_json(write_file(d, "z.json", R"({"benchmark": "adam", "numel": 5})"), m);
  EXPECT_NE(st.to_string().find("field 'seconds_per_step' is missing"), std::string::npos);
  st = read_bench_json(write_file(d, "t.json", "{\"op\": "), m);
  EXPECT_NE(st.to_string().find("not valid JSON"), std::string::npos);
}

}  // namespace
}  // namespace strata::cli::planner
