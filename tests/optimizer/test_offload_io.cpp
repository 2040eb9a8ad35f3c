// The offloaded optimizer's I/O: fp32 parameter copies taken from the pipeline (no second
// read of the masters), small tensors packed into shared pipeline slots (bit-identical to
// the reference for any packing), and the disk-space check of create()/add_param().
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "offload_test_util.hpp"

namespace strata::optimizer {
namespace {

using namespace offload_test;

RuleFactory adam() { return *builtin_rule_factory("adam"); }
const Hyperparams kHp = {{"lr", 1e-2}, {"weight_decay", 0.01}};

struct Model {
  TempDir dir;
  std::shared_ptr<Store> store;
  std::unique_ptr<OffloadedOptimizer> opt;
  std::vector<uint64_t> sizes;
  std::vector<RefTensor> ref;
  std::unique_ptr<UpdateRule> rule;
};

// An optimizer over tensors of `sizes` at `placement`, and the in-memory reference.
std::unique_ptr<Model> make_model(std::vector<uint64_t> sizes, OffloadOptions oo,
                                  Placement placement) {
  auto m = std::make_unique<Model>();
  m->store = must(Store::open(small_store_options(m->dir.path())));
  m->opt = must(OffloadedOptimizer::create(m->store, adam(), kHp, oo));
  m->rule = must(adam()(kHp));
  m->sizes = std::move(sizes);
  for (uint32_t t = 0; t < m->sizes.size(); ++t) {
    auto init = values(t, m->sizes[t]);
    EXPECT_EQ(must(m->opt->add_param("t" + std::to_string(t), m->sizes[t], init.data(), 0,
                                     placement)),
              t);
    m->ref.emplace_back(*m->rule, init);
  }
  return m;
}

// Many small tensors (several per slot), a zero-size one, and two larger than a sub-group
// whose tails share a slot with the next tensors.
const std::vector<uint64_t> kMixed = {100, 1, 0, 1023, 1024, 1025, 30001, 7, 4096, 100003,
                                      100, 100, 100, 100, 100, 100, 100, 100, 100, 100};

TEST(OffloadIo, PackedSmallTensorsMatchReferenceForEverySlotLayout) {
  for (uint64_t sg : std::vector<uint64_t>{1000, 4099, kChunkNumel, 20000, 0}) {
    for (int b : {1, 2, 4}) {
      SCOPED_TRACE("sub_group_numel " + std::to_string(sg) + " num_buffers " + std::to_string(b));
      OffloadOptions oo;
      oo.sub_group_numel = sg;
      oo.num_buffers = b;
      auto m = make_model(kMixed, oo, Placement::kNvme);
      for (int s = 1; s <= 3; ++s) {
        std::vector<std::vector<float>> grads;
        uint64_t numel = 0;
        for (uint32_t t = 0; t < kMixed.size(); ++t) {
          grads.push_back(grad_for(t, s, kMixed[t]));
          OFFLOAD_ASSERT_OK(m->opt->set_grad(t, grads.back().empty() ? static_cast<const void*>(&numel)
                                                                 : grads.back().data(),
                                             DType::kFloat32));
          OFFLOAD_ASSERT_OK(m->ref[t].step(*m->rule, grads.back().data()));
          numel += kMixed[t];
        }
        auto st = m->opt->step();
        ASSERT_TRUE(st.ok()) << st.status().to_string();
        EXPECT_EQ(st->numel_updated, numel);
        EXPECT_EQ(st->bytes_read, numel * 12);
        EXPECT_EQ(st->bytes_written, numel * 12);
        for (uint32_t t = 0; t < kMixed.size(); ++t) {
          auto got = dump(*m->opt, t);
          ASSERT_TRUE(bit_equal(got[0], m->ref[t].param)) << "master of t" << t << " step " << s;
          ASSERT_TRUE(bit_equal(got[1], m->ref[t].states[0])) << "exp_avg of t" << t;
          ASSERT_TRUE(bit_equal(got[2], m->ref[t].states[1])) << "exp_avg_sq of t" << t;
          EXPECT_EQ(*m->opt->step_count(t), s);
        }
      }
    }
  }
}

TEST(OffloadIo, Fp32CopyReceivesTheUpdatedMasterOnBothTiers) {
  for (Placement pl : {Placement::kNvme, Placement::kHost}) {
    SCOPED_TRACE(std::string(placement_name(pl)));
    OffloadOptions oo;
    oo.sub_group_numel = 20000;
    auto m = make_model(kMixed, oo, pl);
    std::vector<std::vector<float>> copies;
    for (uint32_t t = 0; t < kMixed.size(); ++t) copies.emplace_back(kMixed[t], -7.0f);
    for (uint32_t t = 0; t < kMixed.size(); ++t) {
      if (kMixed[t] > 0) OFFLOAD_ASSERT_OK(m->opt->set_param_copy(t, copies[t].data(), DType::kFloat32));
    }
    for (int s = 1; s <= 2; ++s) {
      std::vector<std::vector<float>> grads;
      for (uint32_t t = 0; t < kMixed.size(); ++t) {
        grads.push_back(grad_for(t, s, kMixed[t]));
        if (kMixed[t] > 0) OFFLOAD_ASSERT_OK(m->opt->set_grad(t, grads.back().data(), DType::kFloat32));
        OFFLOAD_ASSERT_OK(m->ref[t].step(*m->rule, grads.back().data()));
      }
      auto st = m->opt->step();
      ASSERT_TRUE(st.ok()) << st.status().to_string();
      for (uint32_t t = 0; t < kMixed.size(); ++t) {
        if (kMixed[t] == 0) continue;
        ASSERT_TRUE(bit_equal(copies[t], m->ref[t].param)) << "copy of t" << t << " step " << s;
        ASSERT_TRUE(bit_equal(dump(*m->opt, t)[0], m->ref[t].param)) << "master of t" << t;
      }
    }
    // A skipped step (a NaN gradient) writes no copy.
    auto before = copies;
    std::vector<float> bad(kMixed[0], 0.0f);
    bad[3] = std::nanf("");
    OFFLOAD_ASSERT_OK(m->opt->set_grad(0, bad.data(), DType::kFloat32));
    auto st = m->opt->step();
    ASSERT_TRUE(st.ok());
    EXPECT_TRUE(st->skipped);
    for (uint32_t t = 0; t < kMixed.size(); ++t) EXPECT_TRUE(bit_equal(copies[t], before[t]));
  }
}

}  // namespace
}  // namespace strata::optimizer
