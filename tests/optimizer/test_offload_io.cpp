// The offloaded optimizer's I/O: fp32 parameter copies taken from the pipeline (no second
// read of the masters), small tensors packed into shared pipeline slots (bit-identical to
// the reference for any packing), and the disk-space check of create()/add_param().
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "offload_test_util.hpp"
#include "strata/base/units.hpp"

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

// A sub-group smaller than the store's chunk: the state objects get chunks of one sub-group
// (PutOptions::chunk_bytes), so a step reads and writes each state byte once (no
// verification of neighbouring sub-groups, no read-modify-write); resumed with another
// sub-group size, the objects keep their chunks and the step stays exact.
TEST(OffloadIo, SubGroupsBelowTheStoreChunkAreWholeChunksOfTheirObjects) {
  TempDir dir;
  constexpr uint64_t kStoreChunk = 4ull << 20;
  constexpr uint64_t kSg = (1ull << 20) / 4;  // 1 MiB of fp32: a quarter of the chunk
  const std::vector<uint64_t> sizes = {3 * kSg + 5, 100, 2 * kSg};
  auto so = strata::testing::test_store_options(dir.path(), 4ull << 20, kStoreChunk, 4);
  std::vector<RefTensor> ref;
  auto rule = must(adam()(kHp));
  uint64_t numel = 0;
  for (uint64_t n : sizes) numel += n;
  auto run_steps = [&](OffloadedOptimizer& opt, Store& store, int from, int to) {
    for (int s = from; s <= to; ++s) {
      std::vector<std::vector<float>> grads;  // set_grad() keeps the pointers until step()
      for (uint32_t t = 0; t < sizes.size(); ++t) {
        grads.push_back(grad_for(t, s, sizes[t]));
        OFFLOAD_ASSERT_OK(opt.set_grad(t, grads.back().data(), DType::kFloat32));
        OFFLOAD_ASSERT_OK(ref[t].step(*rule, grads.back().data()));
      }
      const StoreStats before = store.stats();
      auto st = opt.step();
      ASSERT_TRUE(st.ok()) << st.status().to_string();
      EXPECT_EQ(st->bytes_read, numel * 12);
      // What the disk saw: each state byte once (rounded up to 4 KiB per chunk).
      const StoreStats after = store.stats();
      uint64_t disk = 0;
      for (uint64_t n : sizes) {
        for (uint64_t at = 0; at < n * 4; at += kSg * 4) {
          disk += align_up(std::min(kSg * 4, n * 4 - at), 4096);
        }
      }
      EXPECT_EQ(after.nvme.read_bytes - before.nvme.read_bytes, 3 * disk) << "step " << s;
      EXPECT_EQ(after.nvme.write_bytes - before.nvme.write_bytes, 3 * disk) << "step " << s;
      for (uint32_t t = 0; t < sizes.size(); ++t) {
        auto got = dump(opt, t);
        ASSERT_TRUE(bit_equal(got[0], ref[t].param)) << "master of t" << t << " step " << s;
        ASSERT_TRUE(bit_equal(got[2], ref[t].states[1])) << "exp_avg_sq of t" << t;
      }
    }
  };
  {
    std::shared_ptr<Store> store = must(Store::open(so));
    OffloadOptions oo;
    oo.sub_group_numel = kSg;
    auto opt = must(OffloadedOptimizer::create(store, adam(), kHp, oo));
    for (uint32_t t = 0; t < sizes.size(); ++t) {
      auto init = values(t, sizes[t]);
      must(opt->add_param("t" + std::to_string(t), sizes[t], init.data(), 0, Placement::kNvme));
      ref.emplace_back(*rule, init);
    }
    int state_objects = 0;
    for (const auto& info : store->list()) {
      if (info.nbytes < 8192) continue;  // the checkpoint record, the 100-element tensor
      EXPECT_EQ(info.chunk_bytes, kSg * 4) << info.key;
      ++state_objects;
    }
    EXPECT_EQ(state_objects, 6);  // two large tensors x (master, exp_avg, exp_avg_sq)
    run_steps(*opt, *store, 1, 2);
    OFFLOAD_ASSERT_OK(opt->checkpoint());
    OFFLOAD_ASSERT_OK(opt->close());
    OFFLOAD_ASSERT_OK(store->close());
  }
  // Resumed with sub-groups of the store's chunk: 4 of the objects' chunks per sub-group.
  std::shared_ptr<Store> store = must(Store::open(so));
  OffloadOptions oo;
  oo.sub_group_numel = kStoreChunk / 4;
  auto opt = must(OffloadedOptimizer::open(store, adam(), oo));
  run_steps(*opt, *store, 3, 4);
  OFFLOAD_ASSERT_OK(opt->close());
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

// A 20 MiB tmpfs mounted over a temporary directory (needs CAP_SYS_ADMIN): ok() false with
// the reason when it cannot be mounted.
struct SmallFs {
  TempDir dir;
  std::string why;
  bool mounted = false;
  SmallFs() {
    if (::mount("tmpfs", dir.path().c_str(), "tmpfs", 0, "size=20m") == 0) {
      mounted = true;
    } else {
      why = std::string("mount -t tmpfs -o size=20m refused: ") + std::strerror(errno);
    }
  }
  ~SmallFs() {
    if (mounted) ::umount2(dir.path().c_str(), MNT_DETACH);
  }
  std::string path() const { return dir.path(); }
};

// Bytes on disk (st_blocks) of the store's data files under `root`.
uint64_t data_file_blocks(const std::string& root) {
  uint64_t total = 0;
  for (const auto& e : std::filesystem::directory_iterator(root)) {
    if (e.path().extension() != ".data") continue;
    struct stat sb;
    if (::stat(e.path().c_str(), &sb) == 0) total += static_cast<uint64_t>(sb.st_blocks) * 512;
  }
  return total;
}

TEST(OffloadIo, StateThatDoesNotFitIsRefusedNamingNeedFreeSpaceAndPath) {
  SmallFs fs;
  if (!fs.mounted) GTEST_SKIP() << fs.why;
  std::shared_ptr<Store> store = must(Store::open(small_store_options(fs.path() + "/s")));
  auto opt = must(OffloadedOptimizer::create(store, adam(), kHp, {}));
  // 12 MiB of state (1 Mi fp32 x 3 streams): 24 MiB with its copy-on-write copies.
  const uint64_t numel = 1ull << 20;
  auto need = must(opt->disk_space({numel}));
  EXPECT_EQ(need.state_bytes, 3 * numel * 4);
  EXPECT_EQ(need.need_bytes, 2 * need.state_bytes + need.in_flight_bytes + need.margin_bytes);
  EXPECT_EQ(need.short_path, fs.path() + "/s");
  auto h = opt->add_param("big", numel, nullptr, 0, Placement::kNvme);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), StatusCode::kResourceExhausted);
  const std::string msg = h.status().to_string();
  EXPECT_NE(msg.find("add_param 'big'"), std::string::npos) << msg;
  EXPECT_NE(msg.find(fs.path() + "/s"), std::string::npos) << msg;
  EXPECT_NE(msg.find("needs " + std::to_string(need.short_need) + " more bytes"),
            std::string::npos) << msg;
  EXPECT_NE(msg.find("has " + std::to_string(need.short_free) + " bytes"), std::string::npos) << msg;
  EXPECT_EQ(opt->num_params(), 0u);  // nothing was added
  EXPECT_EQ(opt->check_disk_space({numel}).code(), StatusCode::kResourceExhausted);
}

TEST(OffloadIo, DiskSpaceCountsTheGapsThatAlignLargeExtents) {
  TempDir dir;
  // 16 MiB chunks and the engine's default 1 MiB block size: chunks are aligned extents.
  StoreOptions so = strata::testing::test_store_options(dir.path(), 4ull << 20, 16ull << 20, 2);
  std::shared_ptr<Store> store = must(Store::open(so));
  const auto space = must(store->nvme_space());
  ASSERT_EQ(space.size(), 1u);
  EXPECT_EQ(space[0].extent_align_bytes, 1ull << 20);
  OffloadOptions oo;
  oo.num_buffers = 2;
  auto opt = must(OffloadedOptimizer::create(store, adam(), kHp, oo));
  // Two tensors: the master and Adam's two states are 3 objects each, so per copy 6 tails
  // that may end off 1 MiB: 2 copies x 6 + 2 batches x 3 streams + 1 (the checkpoint record)
  // gaps of at most 1 MiB each, beside the catalog's 1 MiB.
  auto need = must(opt->disk_space({5000000, 77}));
  EXPECT_EQ(need.margin_bytes, (1ull << 20) + (2 * 6 + 2 * 3 + 1) * (1ull << 20));
  EXPECT_EQ(need.need_bytes, 2 * need.state_bytes + need.in_flight_bytes + need.margin_bytes);
  OFFLOAD_ASSERT_OK(opt->close());
}

TEST(OffloadIo, DiskSpaceCountsNoAlignmentGapsWhereNoChunkIsAligned) {
  TempDir dir;
  // 64 KiB chunks: below 16 x 1 MiB, no extent of the state is ever aligned.
  std::shared_ptr<Store> store = must(Store::open(small_store_options(dir.path())));
  auto opt = must(OffloadedOptimizer::create(store, adam(), kHp, {}));
  auto need = must(opt->disk_space({5000000}));
  EXPECT_EQ(need.margin_bytes, 1ull << 20);
  OFFLOAD_ASSERT_OK(opt->close());
}

TEST(OffloadIo, StateThatFitsStepsAndTheStoreGivesSpaceBackAfterEachCommit) {
  SmallFs fs;
  if (!fs.mounted) GTEST_SKIP() << fs.why;
  const std::string root = fs.path() + "/s";
  std::shared_ptr<Store> store = must(Store::open(small_store_options(root)));
  auto opt = must(OffloadedOptimizer::create(store, adam(), kHp, {}));
  // ~3.6 MiB of state on a 20 MiB file system that keeps 4 MiB of catalog ballast.
  const std::vector<uint64_t> sizes = {100000, 100000, 99999, 77};
  OFFLOAD_ASSERT_OK(opt->check_disk_space(sizes));
  std::vector<RefTensor> ref;
  auto rule = must(adam()(kHp));
  for (uint32_t t = 0; t < sizes.size(); ++t) {
    auto init = values(t, sizes[t]);
    must(opt->add_param("t" + std::to_string(t), sizes[t], init.data(), 0, Placement::kNvme));
    ref.emplace_back(*rule, init);
  }
  const DiskSpaceNeed need = must(opt->disk_space());
  EXPECT_EQ(need.held_bytes, need.state_bytes);
  const uint64_t T = need.state_bytes;
  const uint64_t record = 4096;  // the checkpoint record's NVMe copy (one block)
  // Between commits the data file also keeps a preallocated tail for its growth (at most a
  // quarter of the free space when it grew: of the 20 MiB), punched out at the commit.
  const uint64_t tail = (20u << 20) / 4;
  for (int s = 1; s <= 40; ++s) {
    std::vector<std::vector<float>> grads;
    for (uint32_t t = 0; t < sizes.size(); ++t) {
      grads.push_back(grad_for(t, s, sizes[t]));
      OFFLOAD_ASSERT_OK(opt->set_grad(t, grads.back().data(), DType::kFloat32));
      OFFLOAD_ASSERT_OK(ref[t].step(*rule, grads.back().data()));
    }
    auto st = opt->step();
    ASSERT_TRUE(st.ok()) << "step " << s << ": " << st.status().to_string();
    // Between commits: at most two copies and the in-flight chunks.
    const auto space = must(store->nvme_space());
    ASSERT_EQ(space.size(), 1u);
    EXPECT_LE(space[0].used_bytes, 2 * T + need.in_flight_bytes + record) << "step " << s;
    EXPECT_LE(data_file_blocks(root), 2 * T + need.in_flight_bytes + record + tail) << "step " << s;
    if (s % 5 == 0) {
      OFFLOAD_ASSERT_OK(opt->checkpoint());
      // After a commit the tail is punched out and the replaced copies are free: one copy
      // in use, plus at most the warm reserve (freed extents kept allocated for the next
      // step's writes: at most the bytes in use, and a quarter of the free space).
      EXPECT_EQ(must(store->nvme_space())[0].used_bytes, T + record) << "checkpoint of step " << s;
      EXPECT_GE(data_file_blocks(root), T + record) << "after the checkpoint of step " << s;
      EXPECT_LE(data_file_blocks(root), 2 * (T + record)) << "after the checkpoint of step " << s;
    }
  }
  for (uint32_t t = 0; t < sizes.size(); ++t) {
    ASSERT_TRUE(bit_equal(dump(*opt, t)[0], ref[t].param)) << "master of t" << t;
  }
  // A closed store holds its state: one copy (close punches the warm reserve too).
  OFFLOAD_ASSERT_OK(opt->checkpoint());
  opt.reset();
  OFFLOAD_ASSERT_OK(store->close());
  EXPECT_EQ(data_file_blocks(root), T + record);
}

}  // namespace
}  // namespace strata::optimizer
