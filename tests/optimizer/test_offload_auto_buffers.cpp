// OffloadOptions::num_buffers 0 (auto): the sub-group sized as for 4 slots, then as many
// slots as pinned_budget_bytes holds (4..64; 4 without a budget); results bit-identical to
// an in-memory reference whatever the slot count.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "offload_test_util.hpp"
#include "strata/optimizer/optimizers.hpp"

namespace strata::optimizer {
namespace {

using namespace offload_test;

RuleFactory adam_factory() { return *builtin_rule_factory("adam"); }

// Adds NVMe tensors "t0", "t1", ... of `sizes` elements (initial values(t, n)) to `opt`,
// and their in-memory references.
void add_tensors(OffloadedOptimizer& opt, const UpdateRule& rule,
                 const std::vector<uint64_t>& sizes, std::vector<RefTensor>& ref,
                 std::vector<ParamHandle>& handles) {
  for (uint32_t t = 0; t < sizes.size(); ++t) {
    auto init = values(t, sizes[t]);
    ref.emplace_back(rule, init);
    handles.push_back(
        must(opt.add_param("t" + std::to_string(t), sizes[t], init.data(), 0, Placement::kNvme)));
  }
}

// Bytes of one slot of Adam (master + 2 states) for a sub-group of `sg` elements.
uint64_t adam_slot_bytes(uint64_t sg) { return 3 * ((sg * 4 + 4095) / 4096 * 4096); }

std::unique_ptr<OffloadedOptimizer> create(const std::shared_ptr<Store>& store,
                                           OffloadOptions oo, const std::string& prefix) {
  oo.key_prefix = prefix;
  auto o = OffloadedOptimizer::create(store, adam_factory(), {{"lr", 1e-2}}, oo);
  EXPECT_TRUE(o.ok()) << o.status().to_string();
  return o.ok() ? std::move(o).value() : nullptr;
}

TEST(OffloadAutoBuffers, SlotsFromThePinnedBudget) {
  TempDir dir;
  std::shared_ptr<Store> store = must(Store::open(small_store_options(dir.path())));
  // The default sub-group is one chunk (64 KiB / 4 elements), below 4 MiB: a slot holds
  // as many whole sub-groups as 4 slots of the budget hold, then the slots are as many as
  // the budget holds. 10.5 one-chunk slots of budget (192 KiB each for Adam): 4 slots of 2
  // chunks fit, 4 of 3 do not -> 5 slots of 2 chunks.
  const uint64_t slot = adam_slot_bytes(kChunkNumel);
  OffloadOptions oo;
  oo.num_buffers = 0;
  oo.pinned_budget_bytes = 10 * slot + slot / 2;
  auto five = create(store, oo, "five/");
  ASSERT_NE(five, nullptr);
  EXPECT_EQ(five->sub_group_numel(), kChunkNumel);
  EXPECT_EQ(five->num_buffers(), 5);
  EXPECT_EQ(five->pinned_bytes(), 5 * 2 * slot);
  EXPECT_EQ(five->options().num_buffers, 0);  // the options as given
  // A small sub-group (not a multiple of 1024 elements: a slot of its own): as many slots
  // as the budget holds, at most 64.
  oo.sub_group_numel = 1000;  // 4 KiB per stream, 12 KiB per slot
  oo.pinned_budget_bytes = 1ull << 30;
  auto many = create(store, oo, "many/");
  ASSERT_NE(many, nullptr);
  EXPECT_EQ(many->sub_group_numel(), 1000u);
  EXPECT_EQ(many->num_buffers(), 64);
  EXPECT_EQ(many->pinned_bytes(), 64 * adam_slot_bytes(1000));
  // Without a budget: 4 slots.
  oo.pinned_budget_bytes = 0;
  auto four = create(store, oo, "four/");
  ASSERT_NE(four, nullptr);
  EXPECT_EQ(four->num_buffers(), 4);
  EXPECT_EQ(four->pinned_bytes(), 4 * adam_slot_bytes(1000));
  // A multiple of 1024 elements below 4 MiB shares its slot with the sub-groups after it,
  // as many as 4 slots of the budget hold: here 2 of 1024.
  oo.sub_group_numel = 1024;
  oo.pinned_budget_bytes = 4 * adam_slot_bytes(2048) + 4096;
  auto two = create(store, oo, "two/");
  ASSERT_NE(two, nullptr);
  EXPECT_EQ(two->sub_group_numel(), 1024u);
  EXPECT_EQ(two->num_buffers(), 4);
  EXPECT_EQ(two->pinned_bytes(), 4 * adam_slot_bytes(2048));
  // The auto sub-group shrinks to 4 slots of the budget, then 4 slots it is: 4 x 3 streams
  // within 96 KiB -> 8 KiB per stream (as with num_buffers 4).
  OffloadOptions fit;
  fit.num_buffers = 0;
  fit.pinned_budget_bytes = 96 << 10;
  auto small = create(store, fit, "fit/");
  ASSERT_NE(small, nullptr);
  EXPECT_EQ(small->sub_group_numel(), 2048u);
  EXPECT_EQ(small->num_buffers(), 4);
  EXPECT_EQ(small->pinned_bytes(), 96u << 10);
  // An explicit sub-group that 4 slots of the budget cannot hold is refused, as before.
  OffloadOptions tight;
  tight.num_buffers = 0;
  tight.sub_group_numel = 1 << 20;
  tight.pinned_budget_bytes = 1 << 20;
  tight.key_prefix = "tight/";
  EXPECT_EQ(OffloadedOptimizer::create(store, adam_factory(), {}, tight).status().code(),
            StatusCode::kInvalidArgument);
  OffloadOptions neg;
  neg.num_buffers = -1;
  neg.key_prefix = "neg/";
  EXPECT_EQ(OffloadedOptimizer::create(store, adam_factory(), {}, neg).status().code(),
            StatusCode::kInvalidArgument);
}

// 64 slots of a sub-group that divides no tensor: the masters and states after 3 steps are
// the in-memory reference's, bit for bit.
TEST(OffloadAutoBuffers, ManySlotsMatchTheReference) {
  TempDir dir;
  std::shared_ptr<Store> store = must(Store::open(small_store_options(dir.path())));
  OffloadOptions oo;
  oo.num_buffers = 0;
  oo.sub_group_numel = 3000;  // not page-aligned, divides none of the sizes
  oo.pinned_budget_bytes = 64ull << 20;
  auto opt = create(store, oo, "optim/");
  ASSERT_NE(opt, nullptr);
  ASSERT_EQ(opt->num_buffers(), 64);
  const std::vector<uint64_t> sizes = {100003, 3 * kChunkNumel, 777};
  const Hyperparams hp = {{"lr", 1e-2}};
  auto rule = must(adam_factory()(hp));
  std::vector<RefTensor> ref;
  std::vector<ParamHandle> handles;
  add_tensors(*opt, *rule, sizes, ref, handles);
  for (int s = 1; s <= 3; ++s) {
    std::vector<std::vector<float>> grads;
    for (uint32_t t = 0; t < sizes.size(); ++t) {
      grads.push_back(grad_for(t, s, sizes[t]));
      OFFLOAD_ASSERT_OK(opt->set_grad(handles[t], grads.back().data(), DType::kFloat32));
      OFFLOAD_ASSERT_OK(ref[t].step(*rule, grads.back().data()));
    }
    auto st = opt->step();
    ASSERT_TRUE(st.ok()) << st.status().to_string();
    // Batches: 100003 -> 34 items of <= 3000 (pages of 3072 elements per slot), 49152 ->
    // 17, the last (384) sharing its slot with the 777 of the third tensor.
    EXPECT_EQ(st->sub_groups, 51u);
    for (uint32_t t = 0; t < sizes.size(); ++t) {
      ASSERT_TRUE(matches_reference(*opt, handles[t], ref[t], t, s));
    }
  }
}

// Sub-groups of a quarter chunk under auto buffers: a slot holds a chunk of them per stream
// (as many as 4 slots of the budget hold), and the consecutive sub-groups of a tensor in
// one batch are read and written as one range, so whole chunks are written (no
// read-modify-write: the step reads exactly the master and the states, 12 bytes per
// element, and writes as many). The masters and states after 3 steps are the in-memory
// reference's, bit for bit, with tensors that split across batches inside a chunk too.
TEST(OffloadAutoBuffers, SubGroupsSmallerThanAChunkShareASlot) {
  TempDir dir;
  std::shared_ptr<Store> store = must(Store::open(small_store_options(dir.path())));
  OffloadOptions oo;
  oo.num_buffers = 0;
  oo.sub_group_numel = kChunkNumel / 4;  // 16 KiB per stream, a quarter chunk
  oo.pinned_budget_bytes = 4 * adam_slot_bytes(kChunkNumel);  // 4 slots of a chunk
  auto opt = create(store, oo, "optim/");
  ASSERT_NE(opt, nullptr);
  EXPECT_EQ(opt->num_buffers(), 4);
  EXPECT_EQ(opt->pinned_bytes(), 4 * adam_slot_bytes(kChunkNumel));
  const Hyperparams hp = {{"lr", 1e-2}};
  auto rule = must(adam_factory()(hp));
  // One tensor of 16 chunks first (its batches are whole chunks), then tensors whose
  // batches start and end inside chunks.
  const std::vector<uint64_t> sizes = {16 * kChunkNumel, 100003, 3 * kChunkNumel, 777};
  std::vector<RefTensor> ref;
  std::vector<ParamHandle> handles;
  add_tensors(*opt, *rule, sizes, ref, handles);
  for (int s = 1; s <= 3; ++s) {
    std::vector<std::vector<float>> grads;
    // The first step updates the first tensor alone: whole chunks, so the disk moves its
    // bytes and no more.
    for (uint32_t t = 0; t < (s == 1 ? 1 : sizes.size()); ++t) {
      grads.push_back(grad_for(t, s, sizes[t]));
      OFFLOAD_ASSERT_OK(opt->set_grad(handles[t], grads.back().data(), DType::kFloat32));
      OFFLOAD_ASSERT_OK(ref[t].step(*rule, grads.back().data()));
    }
    store->reset_stats();
    auto st = opt->step();
    ASSERT_TRUE(st.ok()) << st.status().to_string();
    if (s == 1) {
      // 16 chunks in batches of one chunk per stream.
      EXPECT_EQ(st->sub_groups, 16u);
      const StoreStats ss = store->stats();
      EXPECT_EQ(ss.nvme.read_bytes, 12 * sizes[0]);
      EXPECT_EQ(ss.nvme.write_bytes, 12 * sizes[0]);
      continue;
    }
    // Items of at most 4096 elements (4096 in the slot), 64 + 25 + 12 + 1 = 102 of them,
    // 4 to a slot of 16384: 26 batches.
    EXPECT_EQ(st->sub_groups, 26u);
    for (uint32_t t = 0; t < sizes.size(); ++t) {
      ASSERT_TRUE(matches_reference(*opt, handles[t], ref[t], t, s));
    }
  }
}

// The configuration file's optimizer.num_buffers takes 0 (auto) too.
TEST(OffloadAutoBuffers, TheConfigFilesZeroMeansAuto) {
  Config c = must(Config::parse(
      R"({"optimizer": {"num_buffers": 0, "pinned_budget_bytes": 2031616}})", "c.json"));
  EXPECT_EQ(c.optimizer.num_buffers, 0);
  OffloadOptions oo = offload_options_from_config(c);
  EXPECT_EQ(oo.num_buffers, 0);
  TempDir dir;
  std::shared_ptr<Store> store = must(Store::open(small_store_options(dir.path())));
  auto opt = create(store, oo, "cfg/");
  ASSERT_NE(opt, nullptr);
  // 2031616 bytes = 10.33 slots of 192 KiB (one 64 KiB chunk per stream): 4 slots of 2
  // chunks fit, of 3 do not -> 5 slots of 2 chunks (384 KiB).
  EXPECT_EQ(opt->num_buffers(), 5);
  EXPECT_EQ(opt->pinned_bytes(), 5 * adam_slot_bytes(2 * kChunkNumel));
}

}  // namespace
}  // namespace strata::optimizer
