// The step overlapped with backward (offload.hpp, OVERLAPPED STEP): begin_step /
// start_update / finish_step give bit-identical results to step() -- with and without
// clipping, with a skipped (inf) step, with changed hyperparameters, with host-tier and
// zero-size tensors -- rolling early updates back when the speculation fails.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "offload_test_util.hpp"

namespace strata::optimizer {
namespace {

using namespace offload_test;

void must_ok(const Status& st) { ASSERT_TRUE(st.ok()) << st.to_string(); }

constexpr uint64_t kNa = 2 * kChunkNumel + 123;
constexpr uint64_t kNb = 3 * kChunkNumel;
constexpr uint64_t kNc = 5000;  // host tier

struct Pair {
  std::shared_ptr<Store> store;
  std::unique_ptr<OffloadedOptimizer> opt;
};

Pair make(const std::string& dir) {
  Pair p;
  p.store = must(Store::open(small_store_options(dir)));
  OffloadOptions oo;
  oo.sub_group_numel = 10000;
  p.opt = must(OffloadedOptimizer::create(p.store, *torch_exact_rule_factory("adamw"),
                                          {{"lr", 1e-2}}, oo));
  auto ia = values(1, kNa), ib = values(2, kNb), ic = values(3, kNc);
  must(p.opt->add_param("a", kNa, ia.data(), 0, Placement::kNvme));
  must(p.opt->add_param("b", kNb, ib.data(), 0, Placement::kNvme));
  must(p.opt->add_param("c", kNc, ic.data(), 0, Placement::kHost));
  must(p.opt->add_param("z", 0, nullptr, 0, Placement::kNvme));
  return p;
}

const uint64_t kNumel[4] = {kNa, kNb, kNc, 0};

struct Grads {
  std::vector<std::vector<float>> g;
  explicit Grads(int s, float scale = 1.0f) {
    for (uint32_t t = 0; t < 4; ++t) {
      g.push_back(grad_for(t, s, kNumel[t]));
      for (float& x : g.back()) x *= scale;
    }
  }
};

/// Reference: step() with every gradient attached.
StepStats plain_step(OffloadedOptimizer& opt, Grads& gr, const StepOptions& so) {
  static float dummy = 0;
  for (uint32_t t = 0; t < 4; ++t) {
    must_ok(opt.set_grad(t, t == 3 ? &dummy : gr.g[t].data(), DType::kFloat32));
  }
  auto r = must(opt.step(so));
  opt.clear_grads();
  return r;
}

/// Overlapped: b then a (then c, z) started early in two batches, copies into `copies`.
StepStats overlapped_step(OffloadedOptimizer& opt, Grads& gr, const StepOptions& so,
                          std::vector<std::vector<float>>& copies,
                          const StepOptions* finish_with = nullptr) {
  static float dummy = 0;
  copies.assign(4, {});
  for (uint32_t t = 0; t < 4; ++t) copies[t].assign(kNumel[t], -7.0f);
  must_ok(opt.begin_step(so));
  auto entry = [&](uint32_t t) {
    EarlyGrad e;
    e.param = t;
    e.grad = t == 3 ? &dummy : gr.g[t].data();
    e.param_copy = t == 3 ? nullptr : copies[t].data();
    return e;
  };
  must_ok(opt.start_update({entry(1)}));
  must_ok(opt.start_update({entry(0), entry(2), entry(3)}));
  auto r = must(opt.finish_step(finish_with ? *finish_with : so));
  opt.clear_grads();
  return r;
}

void expect_same_state(OffloadedOptimizer& x, OffloadedOptimizer& y, const std::string& what) {
  for (ParamHandle h = 0; h < 4; ++h) {
    EXPECT_EQ(must(x.step_count(h)), must(y.step_count(h))) << what << " tensor " << h;
    auto dx = dump(x, h), dy = dump(y, h);
    for (size_t s = 0; s < dx.size(); ++s) {
      EXPECT_TRUE(bit_equal(dx[s], dy[s])) << what << " tensor " << h << " stream " << s;
    }
  }
}

void expect_copies_are_masters(OffloadedOptimizer& opt,
                               const std::vector<std::vector<float>>& copies,
                               const std::string& what) {
  for (ParamHandle h = 0; h < 3; ++h) {
    EXPECT_TRUE(bit_equal(copies[h], dump(opt, h)[0])) << what << " copy of tensor " << h;
  }
}

TEST(OffloadOverlap, BitIdenticalToStepWithoutClippingWithClippingAndOnSkip) {
  TempDir d1, d2;
  Pair ref = make(d1.path()), ovl = make(d2.path());
  std::vector<std::vector<float>> copies;
  StepOptions none;
  StepOptions clip;
  clip.max_grad_norm = 1e6;  // checked, never triggered: the speculation holds
  StepOptions tight;
  tight.max_grad_norm = 0.5;  // triggered: rolled back and redone
  for (int s = 1; s <= 6; ++s) {
    const StepOptions& so = s <= 2 ? none : s <= 4 ? clip : tight;
    Grads g1(s), g2(s);
    auto rs = plain_step(*ref.opt, g1, so);
    auto os = overlapped_step(*ovl.opt, g2, so, copies);
    const std::string what = "step " + std::to_string(s);
    expect_same_state(*ref.opt, *ovl.opt, what);
    expect_copies_are_masters(*ovl.opt, copies, what);
    EXPECT_EQ(os.tensors_updated, 4u) << what;
    EXPECT_EQ(os.tensors_started_early, 2u) << what;  // a and b; c is host, z is empty
    EXPECT_EQ(os.rolled_back, s >= 5) << what;
    EXPECT_EQ(rs.clip_coef, os.clip_coef) << what;
    EXPECT_FALSE(os.skipped) << what;
    // Bytes: the early updates' plus the rest (and the redo after a rollback).
    EXPECT_EQ(os.bytes_read, (s >= 5 ? 2 : 1) * (kNa + kNb) * 3 * 4) << what;
  }
  // An inf gradient: the step is skipped in both, the early updates rolled back.
  Grads g1(7), g2(7);
  g1.g[0][5] = g2.g[0][5] = std::numeric_limits<float>::infinity();
  auto rs = plain_step(*ref.opt, g1, none);
  auto os = overlapped_step(*ovl.opt, g2, none, copies);
  EXPECT_TRUE(rs.skipped);
  EXPECT_TRUE(os.skipped);
  EXPECT_TRUE(os.rolled_back);
  expect_same_state(*ref.opt, *ovl.opt, "skipped step");
  EXPECT_EQ(must(ovl.opt->step_count(0)), 6);
  // And the next step goes on identically.
  Grads g3(8), g4(8);
  plain_step(*ref.opt, g3, none);
  overlapped_step(*ovl.opt, g4, none, copies);
  expect_same_state(*ref.opt, *ovl.opt, "after the skip");
}

TEST(OffloadOverlap, ChangedHyperparametersOrOptionsAreRedone) {
  TempDir d1, d2;
  Pair ref = make(d1.path()), ovl = make(d2.path());
  std::vector<std::vector<float>> copies;
  // The lr changes between start_update() and finish_step() (a scheduler stepping late).
  Grads g1(1), g2(1);
  must_ok(ref.opt->set_lr(0, 0.5));
  plain_step(*ref.opt, g1, {});
  {
    static float dummy = 0;
    copies.assign(4, {});
    must_ok(ovl.opt->begin_step({}));
    EarlyGrad e{1, g2.g[1].data(), DType::kFloat32, nullptr, DType::kFloat32};
    must_ok(ovl.opt->start_update({e}));
    must_ok(ovl.opt->wait_started());  // b was updated with lr 1e-2
    must_ok(ovl.opt->set_lr(0, 0.5));
    must_ok(ovl.opt->set_grad(0, g2.g[0].data(), DType::kFloat32));
    must_ok(ovl.opt->set_grad(2, g2.g[2].data(), DType::kFloat32));
    must_ok(ovl.opt->set_grad(3, &dummy, DType::kFloat32));
    auto os = must(ovl.opt->finish_step({}));
    EXPECT_TRUE(os.rolled_back);
    ovl.opt->clear_grads();
  }
  expect_same_state(*ref.opt, *ovl.opt, "lr changed");
  // finish_step() with other options than begin_step()'s.
  Grads g3(2), g4(2);
  StepOptions scaled;
  scaled.grad_scale = 0.25f;
  plain_step(*ref.opt, g3, scaled);
  auto os = overlapped_step(*ovl.opt, g4, {}, copies, &scaled);
  EXPECT_TRUE(os.rolled_back);
  expect_same_state(*ref.opt, *ovl.opt, "options changed");
  expect_copies_are_masters(*ovl.opt, copies, "options changed");
}

TEST(OffloadOverlap, AGradientEditedAfterItsEarlyUpdateIsRedone) {
  TempDir d1, d2;
  Pair ref = make(d1.path()), ovl = make(d2.path());
  Grads g1(1), g2(1);
  for (float& x : g1.g[1]) x *= 0.5f;  // the reference steps the edited gradient
  plain_step(*ref.opt, g1, {});
  static float dummy = 0;
  std::vector<EarlyGrad> es;
  for (uint32_t t = 0; t < 4; ++t) {
    es.push_back({t, t == 3 ? static_cast<const void*>(&dummy) : g2.g[t].data(),
                  DType::kFloat32, nullptr, DType::kFloat32});
  }
  must_ok(ovl.opt->begin_step({}));
  must_ok(ovl.opt->start_update(es));
  must_ok(ovl.opt->wait_started());  // b's early update read the unedited gradient
  for (float& x : g2.g[1]) x *= 0.5f;  // edited in place after it (no version counter here)
  auto os = must(ovl.opt->finish_step({}));
  EXPECT_TRUE(os.rolled_back);
  expect_same_state(*ref.opt, *ovl.opt, "gradient edited");
}

TEST(OffloadOverlap, AbortRestoresEverythingAndMutationsAreRefusedWhileOpen) {
  TempDir d;
  Pair p = make(d.path());
  std::vector<std::vector<float>> before;
  for (ParamHandle h = 0; h < 4; ++h) before.push_back(dump(*p.opt, h)[0]);
  Grads g(1);
  must_ok(p.opt->begin_step({}));
  EXPECT_TRUE(p.opt->step_open());
  EXPECT_EQ(p.opt->begin_step({}).code(), StatusCode::kFailedPrecondition);
  EarlyGrad e{0, g.g[0].data(), DType::kFloat32, nullptr, DType::kFloat32};
  must_ok(p.opt->start_update({e}));
  EXPECT_EQ(p.opt->start_update({e}).code(), StatusCode::kFailedPrecondition);  // twice
  EarlyGrad bad{1, nullptr, DType::kFloat32, nullptr, DType::kFloat32};
  EXPECT_EQ(p.opt->start_update({bad}).code(), StatusCode::kInvalidArgument);
  EarlyGrad out{9, g.g[0].data(), DType::kFloat32, nullptr, DType::kFloat32};
  EXPECT_EQ(p.opt->start_update({out}).code(), StatusCode::kOutOfRange);
  std::vector<float> one(kNa, 1.0f);
  Status st = p.opt->write_param(0, one.data());
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("overlapped step is open"), std::string::npos) << st.message();
  EXPECT_EQ(p.opt->step().status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(p.opt->checkpoint().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(p.opt->set_step_count(0, 3).code(), StatusCode::kFailedPrecondition);
  must_ok(p.opt->abort_step());
  EXPECT_FALSE(p.opt->step_open());
  for (ParamHandle h = 0; h < 4; ++h) {
    EXPECT_TRUE(bit_equal(dump(*p.opt, h)[0], before[h])) << "tensor " << h;
    EXPECT_EQ(must(p.opt->step_count(h)), 0);
  }
  EXPECT_EQ(p.opt->finish_step({}).status().code(), StatusCode::kFailedPrecondition);
  must_ok(p.opt->abort_step());  // none open: no-op
  // An open step at close: rolled back, not checkpointed.
  must_ok(p.opt->begin_step({}));
  must_ok(p.opt->start_update({e}));
  must_ok(p.opt->close());
  p.opt.reset();
  auto again = must(OffloadedOptimizer::open(p.store, *torch_exact_rule_factory("adamw"), {}));
  EXPECT_TRUE(bit_equal(dump(*again, 0)[0], before[0]));
  EXPECT_EQ(must(again->step_count(0)), 0);
}

// EarlyGrad::master (the master's values given in memory: not read from NVMe) and
// EarlyGrad::transient (buffers released once the early update ran): the same results as
// step(), 4 bytes per element less read; a redo that needs a transient gradient fails after
// the rollback, leaving everything as before the step.
TEST(OffloadOverlap, MasterInMemoryAndTransientGradients) {
  TempDir d1, d2;
  Pair ref = make(d1.path()), ovl = make(d2.path());
  for (int s = 1; s <= 3; ++s) {
    Grads g1(s);
    plain_step(*ref.opt, g1, {});
    must_ok(ovl.opt->begin_step({}));
    uint64_t want_read = 0;
    for (uint32_t t : {1u, 0u}) {  // the NVMe tensors, one at a time, as backward would
      auto g = std::make_unique<std::vector<float>>(grad_for(t, s, kNumel[t]));
      auto m = std::make_unique<std::vector<float>>(dump(*ovl.opt, t)[0]);
      EarlyGrad e;
      e.param = t;
      e.grad = g->data();
      e.master = m->data();
      e.transient = true;
      must_ok(ovl.opt->start_update({e}));
      must_ok(ovl.opt->wait_started());
      std::fill(g->begin(), g->end(), std::numeric_limits<float>::quiet_NaN());  // released
      std::fill(m->begin(), m->end(), std::numeric_limits<float>::quiet_NaN());
      want_read += 2 * kNumel[t] * 4;  // the moments only
    }
    Grads g2(s);
    must_ok(ovl.opt->set_grad(2, g2.g[2].data(), DType::kFloat32));  // host tier: at finish
    StepStats st = must(ovl.opt->finish_step({}));
    ovl.opt->clear_grads();
    EXPECT_FALSE(st.rolled_back);
    EXPECT_EQ(st.tensors_started_early, 2u);
    EXPECT_EQ(st.bytes_read, want_read);
    EXPECT_EQ(st.bytes_written, 3 * (kNa + kNb) * 4);
    for (ParamHandle h : {0u, 1u, 2u}) {
      EXPECT_EQ(must(ovl.opt->step_count(h)), s);
      auto dx = dump(*ref.opt, h), dy = dump(*ovl.opt, h);
      for (size_t k = 0; k < dx.size(); ++k) {
        EXPECT_TRUE(bit_equal(dx[k], dy[k])) << "step " << s << " tensor " << h << " stream " << k;
      }
    }
  }
  // A changed learning rate makes a redo, which needs the transient gradient: refused.
  std::vector<std::vector<float>> before;
  for (ParamHandle h = 0; h < 2; ++h) before.push_back(dump(*ovl.opt, h)[0]);
  must_ok(ovl.opt->begin_step({}));
  auto g = grad_for(0, 9, kNa);
  EarlyGrad e;
  e.param = 0;
  e.grad = g.data();
  e.transient = true;
  must_ok(ovl.opt->start_update({e}));
  must_ok(ovl.opt->wait_started());
  must_ok(ovl.opt->set_hyperparams(0, {{"lr", 5e-3}}));
  Result<StepStats> r = ovl.opt->finish_step({});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("'a' was not kept for a redo"), std::string::npos)
      << r.status().message();
  EXPECT_FALSE(ovl.opt->step_open());
  for (ParamHandle h = 0; h < 2; ++h) {
    EXPECT_TRUE(bit_equal(dump(*ovl.opt, h)[0], before[h])) << "tensor " << h;
    EXPECT_EQ(must(ovl.opt->step_count(h)), 3);
  }
}

}  // namespace
}  // namespace strata::optimizer
