// The crash loop: crash_loop_child runs Workload(seed) (puts, overwrites, write_range,
// removes, flushes, offloaded optimizer steps and checkpoints) and is killed with SIGKILL
// at a random moment; the store is reopened and must hold, whole, the committed state
// after the last operation the child reported (A) or after the one in flight (B): every
// kv/ object bit-exact, no other kv/ key, the optimizer at that state's checkpointed step
// with masters and states bit-exact (the hash the child printed before that checkpoint),
// verify() clean, and the store usable.
//
// Trials: 20 (STRATA_LONG_TESTS=1: 200; STRATA_CRASH_TRIALS=N overrides). Seeds: trial i
// uses base + i, base from STRATA_CRASH_SEED or random; each trial prints its seed, and
// STRATA_CRASH_SEED=<seed> STRATA_CRASH_TRIALS=1 reruns it (the kill delay is drawn from
// the seed too; where the kill lands still depends on timing).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <random>
#include <string>

#include "common/temp_dir.hpp"
#include "reliability/child_process.hpp"
#include "reliability/crash_loop.hpp"
#include "strata/optimizer/offload.hpp"

namespace strata {
namespace {

using namespace crash_loop;
using optimizer::OffloadedOptimizer;
using reliability::ChildProcess;
using Clock = std::chrono::steady_clock;


/// Empty when `s` holds exactly `want`'s committed kv/ objects, else what differs.
std::string compare_kv(Store& s, const State& want) {
  auto l = s.list("kv/");
  std::string why;
  if (l.size() != want.committed.size()) {
    why += "holds " + std::to_string(l.size()) + " kv objects, expected " +
           std::to_string(want.committed.size()) + "; ";
  }
  for (auto& info : l) {
    auto it = want.committed.find(info.key);
    if (it == want.committed.end()) {
      why += info.key + " present, expected absent; ";
      continue;
    }
    if (info.nbytes != it->second.size()) {
      why += info.key + " has " + std::to_string(info.nbytes) + " bytes, expected " +
             std::to_string(it->second.size()) + "; ";
      continue;
    }
    std::vector<uint8_t> got(info.nbytes);
    Status st = s.get_bytes(info.key, got.data(), got.size());
    if (!st.ok()) {
      why += info.key + ": " + st.to_string() + "; ";
    } else if (got != it->second) {
      uint64_t i = 0;
      while (got[i] == it->second[i]) ++i;
      why += info.key + " differs from byte " + std::to_string(i) + "; ";
    }
  }
  return why;
}

struct Totals {
  uint64_t trials = 0, ops = 0, state_b = 0;
  std::map<std::string, uint64_t> in_flight;  // kind of the operation the kill landed in
};

void run_trial(uint64_t seed, Totals& totals) {
  SCOPED_TRACE("crash loop seed " + std::to_string(seed));
  testing::TempDir dir;
  const std::string root = dir.path() + "/store";
  std::mt19937_64 rng(seed ^ 0x5bd1e995);
  const auto kill_after = std::chrono::milliseconds(rng() % 1500);
  std::map<int64_t, uint64_t> hashes;  // step -> hash before its checkpoint
  int64_t last_done = -1;
  bool ready = false;
  std::string err;
  {
    ChildProcess child({STRATA_CRASH_LOOP_CHILD, root, std::to_string(seed)},
                       dir.path() + "/stderr");
    ASSERT_TRUE(child.ok());
    std::string line;
    auto deadline = Clock::now() + std::chrono::seconds(60);  // until "R"
    while (child.read_line(line, deadline)) {
      if (line[0] == 'H') {
        auto sp = line.find(' ', 2);
        hashes[std::stoll(line.substr(2, sp - 2))] = std::stoull(line.substr(sp + 1));
      } else if (line[0] == 'C') {
        last_done = std::stoll(line.substr(2));
      } else if (line == "R") {
        ready = true;
        deadline = Clock::now() + kill_after;
      }
    }
    ASSERT_TRUE(ready) << "the child died before it was ready: " << child.stderr_text();
    ASSERT_TRUE(child.timed_out()) << "the child exited (status " << child.wait()
                                   << "): " << child.stderr_text();
    child.kill9();
    while (child.read_line(line, Clock::now() + std::chrono::seconds(10))) {
      if (line[0] == 'H') {
        auto sp = line.find(' ', 2);
        hashes[std::stoll(line.substr(2, sp - 2))] = std::stoull(line.substr(sp + 1));
      } else if (line[0] == 'C') {
        last_done = std::stoll(line.substr(2));
      }
    }
    err = child.stderr_text();
  }
  // The states after the reported operations (A) and after the one in flight (B).
  Workload w(seed);
  for (int64_t i = 0; i <= last_done; ++i) w.next();
  const State a = w.state();
  const Op in_flight = w.next();
  const State b = w.state();

  auto sr = Store::open(store_options(root));
  ASSERT_TRUE(sr.ok()) << sr.status().to_string() << "\nchild stderr: " << err;
  std::shared_ptr<Store> store = std::move(sr).value();
  auto opt_r = OffloadedOptimizer::open(store, nullptr, offload_options());
  ASSERT_TRUE(opt_r.ok()) << opt_r.status().to_string();
  const int64_t step = *(*opt_r)->step_count(0);
  auto h = optimizer_hash(**opt_r);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  const std::string why_a = compare_kv(*store, a), why_b = compare_kv(*store, b);
  const bool is_a = why_a.empty() && step == a.checkpointed;
  const bool is_b = why_b.empty() && step == b.checkpointed;
  EXPECT_TRUE(is_a || is_b) << "after " << last_done + 1 << " operations, in flight "
                            << op_name(in_flight.kind) << " " << in_flight.key
                            << "\n  vs state A: " << why_a << " checkpoint " << a.checkpointed
                            << "\n  vs state B: " << why_b << " checkpoint " << b.checkpointed
                            << "\n  optimizer at step " << step;
  ASSERT_TRUE(hashes.count(step)) << "no hash printed for step " << step;
  EXPECT_EQ(*h, hashes[step]) << "optimizer state at step " << step << " is not bit-exact";
  auto v = store->verify();
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_TRUE(v->errors.empty()) << v->errors.front().to_string();
  // Still usable: a step of the reopened optimizer and a new object.
  std::vector<std::vector<float>> g(3);
  for (uint32_t t = 0; t < 3; ++t) {
    g[t] = floats_of(kParamNumel[t], 77 + t, 1.0f);
    ASSERT_TRUE((*opt_r)->set_grad(t, g[t].data(), DType::kFloat32).ok());
  }
  ASSERT_TRUE((*opt_r)->step().ok());
  auto x = bytes_of(3 << 20, seed);
  ASSERT_TRUE(store->put("after", x.data(), TensorDesc::bytes(x.size())).ok());
  std::vector<uint8_t> back(x.size());
  ASSERT_TRUE(store->get_bytes("after", back.data(), back.size()).ok());
  EXPECT_EQ(back, x);
  opt_r->reset();
  ASSERT_TRUE(store->close().ok());

  ++totals.trials;
  totals.ops += static_cast<uint64_t>(last_done + 1);
  totals.state_b += (is_b && !is_a) ? 1 : 0;
  ++totals.in_flight[op_name(in_flight.kind)];
  std::printf("[crash loop] seed %llu: killed after %lld ms, %lld operations done, in flight %s %s, "
              "found state %s, optimizer step %lld\n",
              static_cast<unsigned long long>(seed), static_cast<long long>(kill_after.count()),
              static_cast<long long>(last_done + 1), op_name(in_flight.kind),
              in_flight.kind < OpKind::kFlush ? in_flight.key.c_str() : "", is_a && is_b ? "A=B" : is_a ? "A" : "B",
              static_cast<long long>(step));
}

TEST(CrashLoop, SigkillAtRandomPointsLosesNothingCommitted) {
  const bool long_run = env_u64("STRATA_LONG_TESTS", 0) != 0;
  const uint64_t trials = env_u64("STRATA_CRASH_TRIALS", long_run ? 200 : 20);
  const uint64_t base = env_u64("STRATA_CRASH_SEED", std::random_device{}());
  std::printf("[crash loop] %llu trials, seeds %llu..%llu (STRATA_CRASH_SEED=%llu)\n",
              static_cast<unsigned long long>(trials), static_cast<unsigned long long>(base),
              static_cast<unsigned long long>(base + trials - 1),
              static_cast<unsigned long long>(base));
  Totals totals;
  for (uint64_t i = 0; i < trials && !HasFatalFailure(); ++i) run_trial(base + i, totals);
  std::printf("[crash loop] %llu trials, %llu operations before the kills, %llu kills found the "
              "in-flight operation committed; in flight:",
              static_cast<unsigned long long>(totals.trials),
              static_cast<unsigned long long>(totals.ops),
              static_cast<unsigned long long>(totals.state_b));
  for (auto& [k, n] : totals.in_flight) std::printf(" %s %llu", k.c_str(), static_cast<unsigned long long>(n));
  std::printf("\n");
  EXPECT_EQ(totals.trials, trials);
}

}  // namespace
}  // namespace strata
