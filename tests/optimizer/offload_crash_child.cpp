// Child process of test_offload_resume.cpp (built as `offload_crash_child` by extra.cmake
// with STRATA_OFFLOAD_CRASH_CHILD_MAIN defined; in the globbed test_optimizer executable
// this file compiles to nothing).
//
//   offload_crash_child run    DIR OUT N   N steps uninterrupted, then dump to OUT
//   offload_crash_child crash  DIR K       K steps, checkpoint(), one more step, then a
//                                          step_async() killed by SIGKILL mid-flight
//   offload_crash_child resume DIR OUT N   open the checkpoint, steps K+1..N, dump to OUT
//
// The optimizer: AdamW, two param groups, three tensors (NVMe, DRAM, NVMe) in a store with
// 64 KiB chunks, sub-groups of 20000 elements (not chunk-aligned), 3 buffers; lr of group 0
// changes at step 2 (a scheduler). Gradients are grad_for(tensor, step). The dump is, per
// tensor: int64 step counter, then the master and each state as raw fp32.
#ifdef STRATA_OFFLOAD_CRASH_CHILD_MAIN

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "offload_test_util.hpp"

using namespace strata;
using namespace strata::optimizer;
using namespace strata::optimizer::offload_test;

namespace {

const uint64_t kNumel[3] = {100003, 20000, 3 * kChunkNumel};
const Placement kPlace[3] = {Placement::kNvme, Placement::kHost, Placement::kNvme};
const int kGroup[3] = {0, 1, 0};

int fail(const std::string& what, const Status& st) {
  std::fprintf(stderr, "offload_crash_child: %s: %s\n", what.c_str(), st.to_string().c_str());
  return 2;
}

OffloadOptions offload_options() {
  OffloadOptions o;
  o.sub_group_numel = 20000;
  o.num_buffers = 3;
  o.num_threads = 2;
  return o;
}

// Step s (1-based) of the schedule; grads must outlive the call.
Status do_step(OffloadedOptimizer& opt, int s, std::vector<std::vector<float>>& grads) {
  if (s == 2) STRATA_RETURN_IF_ERROR(opt.set_lr(0, 3e-3));
  grads.clear();
  for (uint32_t t = 0; t < 3; ++t) {
    grads.push_back(grad_for(t, s, kNumel[t]));
    STRATA_RETURN_IF_ERROR(opt.set_grad(t, grads.back().data(), DType::kFloat32));
  }
  return opt.step().status();
}

Status dump_to(OffloadedOptimizer& opt, const std::string& out) {
  std::ofstream f(out, std::ios::binary);
  for (uint32_t t = 0; t < 3; ++t) {
    Status st;
    auto streams = dump(opt, t, &st);
    STRATA_RETURN_IF_ERROR(st);
    int64_t step = *opt.step_count(t);
    f.write(reinterpret_cast<const char*>(&step), sizeof step);
    for (auto& v : streams) f.write(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  }
  f.close();
  if (!f) return internal_error("writing " + out);
  return Status::OK();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: offload_crash_child run|crash|resume DIR ...\n");
    return 2;
  }
  const std::string mode = argv[1], dir = argv[2];
  auto so = small_store_options(dir);
  auto store_r = Store::open(so);
  if (!store_r.ok()) return fail("Store::open", store_r.status());
  std::shared_ptr<Store> store = std::move(store_r).value();
  auto factory = *builtin_rule_factory("adamw");
  std::unique_ptr<OffloadedOptimizer> opt;
  int first = 1;
  if (mode == "resume") {
    auto r = OffloadedOptimizer::open(store, nullptr, offload_options());
    if (!r.ok()) return fail("open", r.status());
    opt = std::move(r).value();
    first = static_cast<int>(*opt->step_count(0)) + 1;
    std::printf("resumed at step %d\n", first - 1);
  } else {
    auto r = OffloadedOptimizer::create(store, factory, {{"lr", 1e-2}, {"weight_decay", 0.05}},
                                        offload_options());
    if (!r.ok()) return fail("create", r.status());
    opt = std::move(r).value();
    auto g = opt->add_param_group({{"lr", 2e-2}, {"beta2", 0.99}});
    if (!g.ok()) return fail("add_param_group", g.status());
    for (uint32_t t = 0; t < 3; ++t) {
      auto init = values(t, kNumel[t]);
      auto h = opt->add_param("w" + std::to_string(t), kNumel[t], init.data(), kGroup[t], kPlace[t]);
      if (!h.ok()) return fail("add_param", h.status());
    }
  }
  std::vector<std::vector<float>> grads;
  if (mode == "run" || mode == "resume") {
    const int n = std::atoi(argv[4]);
    for (int s = first; s <= n; ++s) {
      Status st = do_step(*opt, s, grads);
      if (!st.ok()) return fail("step " + std::to_string(s), st);
    }
    Status st = dump_to(*opt, argv[3]);
    if (!st.ok()) return fail("dump", st);
    return 0;
  }
  if (mode == "crash") {
    const int k = std::atoi(argv[3]);
    for (int s = 1; s <= k; ++s) {
      Status st = do_step(*opt, s, grads);
      if (!st.ok()) return fail("step " + std::to_string(s), st);
    }
    Status st = opt->checkpoint();
    if (!st.ok()) return fail("checkpoint", st);
    // A completed but not checkpointed step (its chunks are written, not committed).
    st = do_step(*opt, k + 1, grads);
    if (!st.ok()) return fail("step " + std::to_string(k + 1), st);
    // A step in flight when the process dies.
    grads.clear();
    for (uint32_t t = 0; t < 3; ++t) {
      grads.push_back(grad_for(t, k + 2, kNumel[t]));
      (void)opt->set_grad(t, grads.back().data(), DType::kFloat32);
    }
    auto fut = opt->step_async();
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    std::fflush(stdout);
    ::kill(::getpid(), SIGKILL);
    fut.wait();
    return 3;  // not reached
  }
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}

#endif  // STRATA_OFFLOAD_CRASH_CHILD_MAIN
