// Checkpoint and resume of the offloaded optimizer: in-process reopen, and a real SIGKILL of
// a child process (offload_crash_child) followed by a resume that must be bit-identical to
// an uninterrupted run; zero-size parameters in the one checkpoint.
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>

#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "offload_test_util.hpp"
#include "strata/optimizer/optimizers.hpp"

extern char** environ;

namespace strata::optimizer {
namespace {

using namespace offload_test;

std::string child_path() {
  if (const char* e = std::getenv("STRATA_OFFLOAD_CRASH_CHILD")) return e;
#ifdef STRATA_OFFLOAD_CRASH_CHILD
  return STRATA_OFFLOAD_CRASH_CHILD;
#else
  return {};
#endif
}

// Runs the child with `args`; returns the raw wait status.
int run_child(const std::vector<std::string>& args) {
  std::vector<std::string> all = {child_path()};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) return -1;
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return status;
}

std::vector<char> slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

TEST(OffloadResume, SigkillThenResumeIsBitIdenticalToAnUninterruptedRun) {
  if (child_path().empty()) GTEST_SKIP() << "offload_crash_child not built";
  TempDir full_dir, crash_dir, out_dir;
  const std::string full_out = out_dir.path() + "/full.bin";
  const std::string resumed_out = out_dir.path() + "/resumed.bin";
  const int n = 6, k = 3;
  int st = run_child({"run", full_dir.path() + "/s", full_out, std::to_string(n)});
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "run child status " << st;
  st = run_child({"crash", crash_dir.path() + "/s", std::to_string(k)});
  ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << "crash child status " << st;
  st = run_child({"resume", crash_dir.path() + "/s", resumed_out, std::to_string(n)});
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "resume child status " << st;
  auto a = slurp(full_out), b = slurp(resumed_out);
  // 3 tensors, each an int64 counter and master + 2 Adam states.
  const uint64_t numel = 100003 + 20000 + 3 * kChunkNumel;
  ASSERT_EQ(a.size(), 3 * 8 + numel * 12);
  ASSERT_EQ(b.size(), a.size());
  EXPECT_TRUE(a == b) << "resumed run differs from the uninterrupted run";
  int64_t step0;
  std::memcpy(&step0, b.data(), 8);
  EXPECT_EQ(step0, n);
}

TEST(OffloadResume, ReopenRestoresTensorsCountersAndHyperparameters) {
  TempDir dir;
  auto factory = *builtin_rule_factory("adam");
  const Hyperparams hp = {{"lr", 1e-2}, {"amsgrad", 1}};
  std::vector<std::vector<std::vector<float>>> saved;
  std::vector<float> ga = grad_for(0, 1, 50000), gb = grad_for(1, 1, 9000);
  {
    std::shared_ptr<Store> store = must(Store::open(small_store_options(dir.path())));
    auto opt = must(OffloadedOptimizer::create(store, factory, hp, {}));
    auto g1 = *opt->add_param_group({{"lr", 0.5}});
    auto ia = values(1, 50000), ib = values(2, 9000);
    auto a = *opt->add_param("a", 50000, ia.data(), 0, Placement::kNvme);
    auto b = *opt->add_param("b", 9000, ib.data(), g1, Placement::kHost);
    OFFLOAD_ASSERT_OK(opt->set_grad(a, ga.data(), DType::kFloat32));
    OFFLOAD_ASSERT_OK(opt->set_grad(b, gb.data(), DType::kFloat32));
    ASSERT_TRUE(opt->step().ok());
    ASSERT_TRUE(opt->step().ok());
    OFFLOAD_ASSERT_OK(opt->set_lr(0, 2e-3));
    OFFLOAD_ASSERT_OK(opt->checkpoint());
    saved.push_back(dump(*opt, a));
    saved.push_back(dump(*opt, b));
    // A second optimizer under the same prefix is refused: while the first is open
    // (FailedPrecondition, see test_offload_prefix.cpp), and once it is closed because the
    // store holds its checkpoint (AlreadyExists).
    EXPECT_EQ(OffloadedOptimizer::create(store, factory, hp, {}).status().code(),
              StatusCode::kFailedPrecondition);
    opt.reset();
    EXPECT_EQ(OffloadedOptimizer::create(store, factory, hp, {}).status().code(),
              StatusCode::kAlreadyExists);
    OFFLOAD_ASSERT_OK(store->close());
  }
  std::shared_ptr<Store> store = must(Store::open(small_store_options(dir.path())));
  // The wrong rule is refused.
  EXPECT_EQ(OffloadedOptimizer::open(store, *builtin_rule_factory("sgd"), {}).status().code(),
            StatusCode::kFailedPrecondition);
  OffloadOptions oo;
  oo.verify_on_open = true;
  auto r = OffloadedOptimizer::open(store, factory, oo);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  auto& opt = **r;
  ASSERT_EQ(opt.num_params(), 2u);
  EXPECT_EQ(opt.num_states(), 3);
  EXPECT_EQ(opt.num_param_groups(), 2);
  EXPECT_EQ(opt.hyperparams(0)->at("lr"), 2e-3);
  EXPECT_EQ(opt.hyperparams(1)->at("lr"), 0.5);
  auto ia = opt.param_info(0), ib = opt.param_info(1);
  EXPECT_EQ(ia->name, "a");
  EXPECT_EQ(ia->placement, Placement::kNvme);
  EXPECT_EQ(ib->placement, Placement::kHost);
  EXPECT_EQ(ib->group, 1);
  EXPECT_EQ(ia->step, 2);
  EXPECT_EQ(ib->step, 2);
  EXPECT_FALSE(ia->has_grad);
  for (uint32_t t = 0; t < 2; ++t) {
    auto got = dump(opt, t);
    ASSERT_EQ(got.size(), 4u);
    for (size_t s = 0; s < got.size(); ++s) EXPECT_TRUE(bit_equal(got[s], saved[t][s])) << t << "/" << s;
  }
}

TEST(OffloadResume, StoreFlushBetweenStepsDoesNotMoveTheResumePoint) {
  // Store::flush() and Store::close() by the store's owner after an un-checkpointed step
  // commit none of the optimizer's objects (they are held): an optimizer that then ends
  // without closing (close(false): as if killed) resumes at its last checkpoint, NVMe and
  // DRAM tensors alike, counters and values.
  TempDir dir;
  auto factory = *builtin_rule_factory("adam");
  std::vector<float> g = grad_for(0, 1, 30000);
  std::vector<std::vector<float>> a_at1, b_at1;
  {
    std::shared_ptr<Store> store = must(Store::open(small_store_options(dir.path())));
    auto opt = must(OffloadedOptimizer::create(store, factory, {}, {}));
    auto a = *opt->add_param("a", 30000, nullptr, 0, Placement::kNvme);
    auto b = *opt->add_param("b", 30000, nullptr, 0, Placement::kHost);
    OFFLOAD_ASSERT_OK(opt->set_grad(a, g.data(), DType::kFloat32));
    OFFLOAD_ASSERT_OK(opt->set_grad(b, g.data(), DType::kFloat32));
    ASSERT_TRUE(opt->step().ok());
    OFFLOAD_ASSERT_OK(opt->checkpoint());
    a_at1 = dump(*opt, a);
    b_at1 = dump(*opt, b);
    ASSERT_TRUE(opt->step().ok());
    OFFLOAD_ASSERT_OK(store->flush());
    OFFLOAD_ASSERT_OK(store->put("other", g.data(), {DType::kFloat32, {30000}}));
    OFFLOAD_ASSERT_OK(opt->close(/*checkpoint=*/false));
    OFFLOAD_ASSERT_OK(store->close());
  }
  std::shared_ptr<Store> store = must(Store::open(small_store_options(dir.path())));
  EXPECT_TRUE(store->contains("other"));  // the owner's own objects were committed
  auto opt = must(OffloadedOptimizer::open(store, nullptr, {}));
  EXPECT_EQ(*opt->step_count(0), 1);
  EXPECT_EQ(*opt->step_count(1), 1);
  auto a = dump(*opt, 0), b = dump(*opt, 1);
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_TRUE(bit_equal(a[s], a_at1[s])) << s;
    EXPECT_TRUE(bit_equal(b[s], b_at1[s])) << s;
  }
}

TEST(OffloadResume, CloseWithoutCheckpointThenOpenOnTheSameStoreResumesTheLastCheckpoint) {
  // close(false) after an un-checkpointed step: the NVMe objects go back to the last
  // checkpoint's version, so an optimizer opened on the same (still open) store resumes
  // there at once -- no store reopen -- and a flush of the store commits nothing of the
  // dropped step. Then the same step again gives the same values as the first time.
  TempDir dir;
  auto factory = *builtin_rule_factory("adam");
  std::vector<float> g1 = grad_for(0, 1, 30000), g2 = grad_for(0, 2, 30000);
  std::shared_ptr<Store> store = must(Store::open(small_store_options(dir.path())));
  std::vector<std::vector<float>> a_at1, b_at1, a_at2, b_at2;
  {
    auto opt = must(OffloadedOptimizer::create(store, factory, {}, {}));
    auto a = *opt->add_param("a", 30000, nullptr, 0, Placement::kNvme);
    auto b = *opt->add_param("b", 30000, nullptr, 0, Placement::kHost);
    OFFLOAD_ASSERT_OK(opt->set_grad(a, g1.data(), DType::kFloat32));
    OFFLOAD_ASSERT_OK(opt->set_grad(b, g1.data(), DType::kFloat32));
    ASSERT_TRUE(opt->step().ok());
    OFFLOAD_ASSERT_OK(opt->checkpoint());
    a_at1 = dump(*opt, a);
    b_at1 = dump(*opt, b);
    OFFLOAD_ASSERT_OK(opt->set_grad(a, g2.data(), DType::kFloat32));
    OFFLOAD_ASSERT_OK(opt->set_grad(b, g2.data(), DType::kFloat32));
    ASSERT_TRUE(opt->step().ok());
    a_at2 = dump(*opt, a);
    b_at2 = dump(*opt, b);
    ASSERT_FALSE(bit_equal(a_at2[0], a_at1[0]));
    OFFLOAD_ASSERT_OK(opt->close(/*checkpoint=*/false));
  }
  OFFLOAD_ASSERT_OK(store->flush());
  auto opt = OffloadedOptimizer::open(store, nullptr, {});
  ASSERT_TRUE(opt.ok()) << opt.status().to_string();
  EXPECT_EQ(*(*opt)->step_count(0), 1);
  EXPECT_EQ(*(*opt)->step_count(1), 1);
  auto a = dump(**opt, 0), b = dump(**opt, 1);
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_TRUE(bit_equal(a[s], a_at1[s])) << s;
    EXPECT_TRUE(bit_equal(b[s], b_at1[s])) << s;
  }
  OFFLOAD_ASSERT_OK((*opt)->set_grad(0, g2.data(), DType::kFloat32));
  OFFLOAD_ASSERT_OK((*opt)->set_grad(1, g2.data(), DType::kFloat32));
  ASSERT_TRUE((*opt)->step().ok());
  a = dump(**opt, 0);
  b = dump(**opt, 1);
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_TRUE(bit_equal(a[s], a_at2[s])) << s;
    EXPECT_TRUE(bit_equal(b[s], b_at2[s])) << s;
  }
  OFFLOAD_ASSERT_OK((*opt)->close());
  opt->reset();
  OFFLOAD_ASSERT_OK(store->close());
  // Reopened from disk: the close above checkpointed step 2.
  store = must(Store::open(small_store_options(dir.path())));
  auto again = must(OffloadedOptimizer::open(store, nullptr, {}));
  EXPECT_EQ(*again->step_count(0), 2);
  a = dump(*again, 0);
  for (size_t s = 0; s < 3; ++s) EXPECT_TRUE(bit_equal(a[s], a_at2[s])) << s;
}

TEST(OffloadResume, ZeroSizeParametersAreHeldAndRestoredFromTheOneCheckpoint) {
  // torch.optim accepts zero-size parameters and counts their steps: the optimizer holds
  // them (empty objects) and keeps their counters in its record, so one checkpoint() (one
  // Store::commit) makes all of them durable with the other tensors; nothing else is written.
  TempDir dir;
  auto factory = *builtin_rule_factory("adamw");
  const std::vector<float> g = grad_for(0, 1, 5000);
  const float dummy = 0.0f;  // a zero-size gradient: any non-null pointer
  std::vector<std::vector<float>> a_saved;
  {
    std::shared_ptr<Store> store = must(Store::open(small_store_options(dir.path())));
    auto opt = must(OffloadedOptimizer::create(store, factory, {}, {}));
    const ParamHandle a = must(opt->add_param("a", 5000, nullptr, 0, Placement::kNvme));
    const ParamHandle z_auto = must(opt->add_param("z_auto", 0, nullptr));
    const ParamHandle z_nvme = must(opt->add_param("z_nvme", 0, nullptr, 0, Placement::kNvme));
    const ParamHandle z_host = must(opt->add_param("z_host", 0, nullptr, 0, Placement::kHost));
    EXPECT_EQ(must(opt->param_info(z_auto)).numel, 0u);
    EXPECT_EQ(opt->host_bytes(), 0u);
    OFFLOAD_ASSERT_OK(opt->set_grad(a, g.data(), DType::kFloat32));
    OFFLOAD_ASSERT_OK(opt->set_grad(z_auto, &dummy, DType::kFloat32));
    OFFLOAD_ASSERT_OK(opt->set_grad(z_host, &dummy, DType::kBFloat16));
    for (int s = 0; s < 2; ++s) {
      auto st = opt->step();
      ASSERT_TRUE(st.ok()) << st.status().to_string();
      EXPECT_EQ(st->tensors_updated, 3u);
      EXPECT_EQ(st->numel_updated, 5000u);
    }
    OFFLOAD_ASSERT_OK(opt->set_grad(z_nvme, &dummy, DType::kFloat16));
    OFFLOAD_ASSERT_OK(opt->set_grad(z_host, nullptr, DType::kFloat32));  // detached: no step
    ASSERT_TRUE(opt->step().ok());
    EXPECT_EQ(must(opt->step_count(a)), 3);
    EXPECT_EQ(must(opt->step_count(z_auto)), 3);
    EXPECT_EQ(must(opt->step_count(z_nvme)), 1);
    EXPECT_EQ(must(opt->step_count(z_host)), 2);
    // A skipped step (non-finite gradient elsewhere) does not count for them either.
    std::vector<float> bad = g;
    bad[7] = std::numeric_limits<float>::infinity();
    OFFLOAD_ASSERT_OK(opt->set_grad(a, bad.data(), DType::kFloat32));
    EXPECT_TRUE(must(opt->step()).skipped);
    EXPECT_EQ(must(opt->step_count(z_auto)), 3);
    OFFLOAD_ASSERT_OK(opt->set_grad(a, g.data(), DType::kFloat32));
    // Ranges of a zero-size tensor: empty is fine, anything else is out of range.
    OFFLOAD_ASSERT_OK(opt->read_param(z_nvme, nullptr));
    OFFLOAD_ASSERT_OK(opt->read_state(z_auto, 1, nullptr));
    OFFLOAD_ASSERT_OK(opt->write_state(z_host, 0, nullptr, 0, 0));
    float one;
    EXPECT_EQ(opt->read_param(z_auto, &one, 0, 1).code(), StatusCode::kOutOfRange);
    OFFLOAD_ASSERT_OK(opt->checkpoint());
    // A step after the checkpoint, then the optimizer's destructor: a close, so a
    // checkpoint (see the contract) of every tensor, whatever its tier.
    ASSERT_TRUE(opt->step().ok());
    a_saved = dump(*opt, a);
    opt.reset();
    OFFLOAD_ASSERT_OK(store->close());
  }
  std::shared_ptr<Store> store = must(Store::open(small_store_options(dir.path())));
  std::vector<std::string> keys;
  for (const auto& info : store->list()) keys.push_back(info.key);
  auto opt = must(OffloadedOptimizer::open(store, nullptr, {}));
  ASSERT_EQ(opt->num_params(), 4u);
  const std::vector<std::string> names = {"a", "z_auto", "z_nvme", "z_host"};
  const std::vector<int64_t> steps = {4, 4, 2, 2};
  for (ParamHandle h = 0; h < 4; ++h) {
    auto info = must(opt->param_info(h));
    EXPECT_EQ(info.name, names[h]);
    EXPECT_EQ(info.numel, h == 0 ? 5000u : 0u);
    EXPECT_EQ(info.step, steps[h]) << names[h];
  }
  EXPECT_EQ(must(opt->param_info(2)).placement, Placement::kNvme);
  EXPECT_EQ(must(opt->param_info(3)).placement, Placement::kHost);
  auto a = dump(*opt, 0);
  for (size_t s = 0; s < a.size(); ++s) EXPECT_TRUE(bit_equal(a[s], a_saved[s])) << s;
  // Only the optimizer's own objects: the record and each tensor's streams.
  for (const auto& k : keys) EXPECT_EQ(k.rfind("optim/", 0), 0u) << k;
  EXPECT_EQ(keys.size(), 1u + 4 * 3);
  // They step on after the reopen.
  const float dummy2 = 0.0f;
  OFFLOAD_ASSERT_OK(opt->set_grad(1, &dummy2, DType::kFloat32));
  ASSERT_TRUE(opt->step().ok());
  EXPECT_EQ(must(opt->step_count(1)), 5);
  EXPECT_EQ(must(opt->step_count(2)), 2);
}

TEST(OffloadResume, RemoveDeletesOnlyTheOptimizersObjects) {
  TempDir dir;
  std::shared_ptr<Store> store = must(Store::open(small_store_options(dir.path())));
  auto factory = *builtin_rule_factory("adamw");
  OffloadOptions outer, nested;
  nested.key_prefix = "optim/nested/";
  for (const auto* o : {&outer, &nested}) {
    auto opt = must(OffloadedOptimizer::create(store, factory, {{"lr", 1e-3}}, *o));
    auto init = values(3, 1000);
    must(opt->add_param("a", 1000, init.data(), 0, Placement::kNvme));
    must(opt->add_param("b", 10, init.data(), 0, Placement::kHost));
    OFFLOAD_ASSERT_OK(opt->checkpoint());
  }
  const std::vector<float> mine(4, 1.0f);
  OFFLOAD_ASSERT_OK(store->put("optim/mine", mine.data(), {DType::kFloat32, {4}}));
  auto keys = [&] {
    std::vector<std::string> k;
    for (const auto& info : store->list()) k.push_back(info.key);
    return k;
  };
  EXPECT_EQ(keys().size(), 2 * (1 + 2 * 3) + 1u);
  OFFLOAD_ASSERT_OK(OffloadedOptimizer::remove(store, factory, outer));
  std::vector<std::string> left = keys();
  for (const auto& k : left) {
    EXPECT_TRUE(k == "optim/mine" || k.rfind("optim/nested/", 0) == 0) << k;
  }
  EXPECT_EQ(left.size(), 1 + 2 * 3 + 1u);
  EXPECT_EQ(OffloadedOptimizer::remove(store, factory, outer).code(), StatusCode::kNotFound);
  // The nested optimizer resumes; a new one can be made under the removed prefix.
  EXPECT_EQ(must(OffloadedOptimizer::open(store, factory, nested))->num_params(), 2u);
  auto fresh = OffloadedOptimizer::create(store, factory, {}, outer);
  EXPECT_TRUE(fresh.ok()) << fresh.status().to_string();
}

}  // namespace
}  // namespace strata::optimizer
