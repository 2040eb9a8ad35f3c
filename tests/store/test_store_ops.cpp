// Store operations: put/get in each tier, errors, odd sizes and keys, ranges, tiers, pins.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "strata/base/units.hpp"
#include "test_store_util.hpp"

namespace strata {
namespace {

using namespace store_test;

TEST(StoreOps, PutGetNvmeAndHostBitExact) {
  TempDir d;
  auto s = open_or_die(small_options(d.path()));
  ASSERT_TRUE(s);
  // 3.5 chunks, fp32 [7, 131072] = 3,670,016 bytes.
  TensorDesc desc{DType::kFloat32, {7, 131072}};
  auto a = pattern(desc.nbytes(), 1);
  auto b = pattern(desc.nbytes(), 2);
  ASSERT_OK(s->put("w/a", a.data(), desc));
  ASSERT_OK(s->put("w/b", b.data(), desc, {Tier::kHost}));
  std::vector<uint8_t> out(desc.nbytes());
  ASSERT_OK(s->get("w/a", out.data(), desc));
  EXPECT_EQ(out, a);
  ASSERT_OK(s->get("w/b", out.data(), desc));
  EXPECT_EQ(out, b);
  auto ia = s->stat("w/a");
  ASSERT_OK(ia);
  EXPECT_EQ(ia->tier, Tier::kNvme);
  EXPECT_EQ(ia->nbytes, 3670016u);
  EXPECT_EQ(ia->num_chunks, 4u);
  EXPECT_FALSE(ia->dirty);
  auto ib = s->stat("w/b");
  ASSERT_OK(ib);
  EXPECT_EQ(ib->tier, Tier::kHost);
  EXPECT_TRUE(ib->dirty);
  EXPECT_FALSE(ib->on_nvme);
}

TEST(StoreOps, ErrorsAreDistinctAndStoreStaysUsable) {
  TempDir d;
  auto s = open_or_die(small_options(d.path()));
  ASSERT_TRUE(s);
  TensorDesc desc{DType::kInt32, {10}};
  auto a = pattern(40, 3);
  std::vector<uint8_t> out(40);
  // NotFound
  auto st = s->get("nope", out.data(), desc);
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_NE(st.message().find("'nope'"), std::string::npos);
  EXPECT_EQ(s->remove("nope").code(), StatusCode::kNotFound);
  EXPECT_EQ(s->stat("nope").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(s->move("nope", Tier::kHost).code(), StatusCode::kNotFound);
  ASSERT_OK(s->put("k", a.data(), desc));
  // AlreadyExists, then overwrite works.
  st = s->put("k", a.data(), desc);
  EXPECT_EQ(st.code(), StatusCode::kAlreadyExists);
  auto a2 = pattern(40, 4);
  ASSERT_OK(s->put("k", a2.data(), desc, {Tier::kNvme, /*overwrite=*/true}));
  // dtype / shape / size mismatch
  st = s->get("k", out.data(), TensorDesc{DType::kFloat32, {10}});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("the object is " + std::string(dtype_name(DType::kInt32)) + "[10]"),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("the destination is " + std::string(dtype_name(DType::kFloat32)) +
                              "[10]"),
            std::string::npos)
      << st.message();
  st = s->get("k", out.data(), TensorDesc{DType::kInt32, {2, 5}});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  st = s->get_bytes("k", out.data(), 39);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  // OutOfRange
  EXPECT_EQ(s->read_range("k", 30, 11, out.data()).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(s->write_range("k", 41, 0, a.data()).code(), StatusCode::kOutOfRange);
  // The messages give offset and length (offset + length may not fit 64 bits).
  EXPECT_EQ(s->read_range("k", 5, UINT64_MAX, out.data()).to_string(),
            "OutOfRange: read_range 'k': 18446744073709551615 bytes at offset 5 go past the end "
            "of the object (40 bytes)");
  EXPECT_EQ(s->write_range("k", UINT64_MAX, 2, a.data()).to_string(),
            "OutOfRange: write_range 'k': 2 bytes at offset 18446744073709551615 go past the "
            "end of the object (40 bytes)");
  // A null buffer for a non-empty range.
  EXPECT_EQ(s->read_range("k", 0, 4, nullptr).to_string(),
            "InvalidArgument: read_range 'k': dst is null");
  EXPECT_EQ(s->write_range("k", 0, 4, nullptr).to_string(),
            "InvalidArgument: write_range 'k': src is null");
  // Unpin of an unpinned object; evict of a pinned one.
  EXPECT_EQ(s->unpin("k").code(), StatusCode::kFailedPrecondition);
  // Empty key.
  EXPECT_EQ(s->put("", a.data(), desc).code(), StatusCode::kInvalidArgument);
  // Still usable: the overwritten value reads back.
  ASSERT_OK(s->get("k", out.data(), desc));
  EXPECT_EQ(out, a2);
}

TEST(StoreOps, ZeroByteOddSizesAndUnusualKeys) {
  TempDir d;
  auto s = open_or_die(small_options(d.path()));
  ASSERT_TRUE(s);
  const std::vector<std::string> keys = {"a/b/c", "with space", "ünïcødé/权重/🙂", "x"};
  const std::vector<uint64_t> sizes = {0, 1, 4095, 4097, (1u << 20) + 1, 3 * (1u << 20) - 7};
  uint64_t seed = 10;
  for (const auto& k : keys) {
    for (uint64_t n : sizes) {
      for (Tier t : {Tier::kNvme, Tier::kHost}) {
        std::string key = k + "#" + std::to_string(n) + "@" + std::string(tier_name(t));
        auto data = pattern(n, ++seed);
        ASSERT_OK(s->put(key, data.data(), TensorDesc::bytes(n), {t}));
        std::vector<uint8_t> out(n + 1, 0xAB);
        ASSERT_OK(s->get_bytes(key, out.data(), n));
        EXPECT_TRUE(std::equal(data.begin(), data.end(), out.begin())) << key;
        EXPECT_EQ(out[n], 0xAB) << "wrote past the end: " << key;
        // Unaligned destination: streams through the staging buffers.
        std::vector<uint8_t> out2(n + 3);
        ASSERT_OK(s->get_bytes(key, out2.data() + 3, n));
        EXPECT_TRUE(std::equal(data.begin(), data.end(), out2.begin() + 3)) << key;
      }
    }
  }
  // 0-d scalar.
  double pi = 3.25;
  ASSERT_OK(s->put("scalar", &pi, TensorDesc{DType::kFloat64, {}}));
  double got = 0;
  ASSERT_OK(s->get("scalar", &got, TensorDesc{DType::kFloat64, {}}));
  EXPECT_EQ(got, 3.25);
  auto l = s->list("ünïcødé/");
  EXPECT_EQ(l.size(), sizes.size() * 2);
  for (auto& i : l) EXPECT_EQ(i.key.rfind("ünïcødé/权重/🙂#", 0), 0u);
  EXPECT_EQ(s->list().size(), keys.size() * sizes.size() * 2 + 1);
}

TEST(StoreOps, ReadRangeAndWriteRangeAcrossChunks) {
  TempDir d;
  auto s = open_or_die(small_options(d.path()));
  ASSERT_TRUE(s);
  const uint64_t n = 3 * (1u << 20) + 1000;
  auto data = pattern(n, 7);
  ASSERT_OK(s->put("obj", data.data(), TensorDesc::bytes(n)));
  // Ranged reads: inside a chunk, across a boundary, the tail.
  for (auto [off, len] : std::vector<std::pair<uint64_t, uint64_t>>{
           {0, 1}, {5, 4096}, {(1u << 20) - 10, 20}, {n - 1000, 1000}, {0, n}, {n, 0}}) {
    std::vector<uint8_t> out(len);
    ASSERT_OK(s->read_range("obj", off, len, out.data()));
    EXPECT_TRUE(std::equal(out.begin(), out.end(), data.begin() + off)) << off << "+" << len;
  }
  // Ranged writes: partial chunk, whole chunk (aligned source), across chunks.
  auto w1 = pattern(100, 8);
  ASSERT_OK(s->write_range("obj", 10, 100, w1.data()));
  std::copy(w1.begin(), w1.end(), data.begin() + 10);
  std::vector<uint8_t, std::allocator<uint8_t>> whole;
  void* aligned = std::aligned_alloc(4096, 1u << 20);
  auto w2 = pattern(1u << 20, 9);
  std::memcpy(aligned, w2.data(), w2.size());
  ASSERT_OK(s->write_range("obj", 1u << 20, 1u << 20, aligned));
  std::copy(w2.begin(), w2.end(), data.begin() + (1u << 20));
  std::free(aligned);
  auto w3 = pattern(5000, 10);
  ASSERT_OK(s->write_range("obj", 2 * (1u << 20) - 2500, 5000, w3.data()));
  std::copy(w3.begin(), w3.end(), data.begin() + 2 * (1u << 20) - 2500);
  std::vector<uint8_t> out(n);
  ASSERT_OK(s->get_bytes("obj", out.data(), n));
  EXPECT_EQ(out, data);
  auto info = s->stat("obj");
  ASSERT_OK(info);
  EXPECT_TRUE(info->dirty);  // not yet flushed
  ASSERT_OK(s->flush());
  EXPECT_FALSE(s->stat("obj")->dirty);
  // Host-resident object: write_range goes to memory.
  ASSERT_OK(s->put("h", data.data(), TensorDesc::bytes(n), {Tier::kHost}));
  ASSERT_OK(s->write_range("h", n - 3, 3, w1.data()));
  ASSERT_OK(s->read_range("h", n - 3, 3, out.data()));
  EXPECT_TRUE(std::equal(out.begin(), out.begin() + 3, w1.begin()));
}

TEST(StoreOps, MovePrefetchEvictPin) {
  TempDir d;
  auto s = open_or_die(small_options(d.path()));
  ASSERT_TRUE(s);
  const uint64_t n = 1500000;
  auto data = pattern(n, 11);
  ASSERT_OK(s->put("m", data.data(), TensorDesc::bytes(n)));
  EXPECT_EQ(s->stat("m")->tier, Tier::kNvme);
  ASSERT_OK(s->prefetch("m"));
  auto i = s->stat("m");
  EXPECT_EQ(i->tier, Tier::kHost);
  EXPECT_TRUE(i->on_nvme);
  EXPECT_FALSE(i->dirty);
  EXPECT_EQ(s->usage().host_bytes, align_up(n, 4096));
  ASSERT_OK(s->prefetch("m", Tier::kNvme));  // no-op: already faster
  EXPECT_EQ(s->stat("m")->tier, Tier::kHost);
  ASSERT_OK(s->pin("m"));
  EXPECT_TRUE(s->stat("m")->pinned);
  EXPECT_EQ(s->evict("m").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s->move("m", Tier::kNvme).code(), StatusCode::kFailedPrecondition);
  ASSERT_OK(s->unpin("m"));
  ASSERT_OK(s->evict("m"));
  EXPECT_EQ(s->stat("m")->tier, Tier::kNvme);
  EXPECT_EQ(s->usage().host_bytes, 0u);
  // Pinning an NVMe object promotes it.
  ASSERT_OK(s->pin("m"));
  EXPECT_EQ(s->stat("m")->tier, Tier::kHost);
  ASSERT_OK(s->unpin("m"));
  // A dirty host object demoted to NVMe is committed.
  auto data2 = pattern(n, 12);
  ASSERT_OK(s->put("m", data2.data(), TensorDesc::bytes(n), {Tier::kHost, true}));
  EXPECT_TRUE(s->stat("m")->dirty);
  ASSERT_OK(s->move("m", Tier::kNvme));
  i = s->stat("m");
  EXPECT_EQ(i->tier, Tier::kNvme);
  EXPECT_FALSE(i->dirty);
  std::vector<uint8_t> out(n);
  ASSERT_OK(s->get_bytes("m", out.data(), n));
  EXPECT_EQ(out, data2);
  // Device tier without a GPU.
  if (!s->has_device()) {
    auto st = s->move("m", Tier::kDevice);
    EXPECT_TRUE(st.code() == StatusCode::kUnimplemented || st.code() == StatusCode::kInvalidArgument)
        << st.to_string();
    EXPECT_EQ(s->stat("m")->tier, Tier::kNvme);
  }
  ASSERT_OK(s->remove("m"));
  EXPECT_FALSE(s->contains("m"));
  EXPECT_EQ(s->usage().nvme_bytes, 0u);
}

TEST(StoreOps, LruEvictionToNvmeAndPinnedNeverEvicted) {
  TempDir d;
  auto o = small_options(d.path());
  o.host_budget_bytes = 4ull << 20;  // room for 3 objects of 1.2 MiB
  auto s = open_or_die(o);
  ASSERT_TRUE(s);
  const uint64_t n = 1200 * 1024;
  std::vector<std::vector<uint8_t>> data;
  for (int i = 0; i < 8; ++i) {
    data.push_back(pattern(n, 100 + i));
    ASSERT_OK(s->put("h" + std::to_string(i), data.back().data(), TensorDesc::bytes(n),
                          {Tier::kHost, false, /*pin=*/i == 0}));
  }
  // h0 is pinned: still in host. The most recent ones are in host; the others went to NVMe.
  EXPECT_EQ(s->stat("h0")->tier, Tier::kHost);
  EXPECT_EQ(s->stat("h7")->tier, Tier::kHost);
  EXPECT_EQ(s->stat("h1")->tier, Tier::kNvme);
  EXPECT_FALSE(s->stat("h1")->dirty);  // evicted = written back and committed
  int in_host = 0;
  for (auto& i : s->list("h")) in_host += i.tier == Tier::kHost;
  EXPECT_EQ(in_host, 3);
  EXPECT_LE(s->usage().host_bytes, s->usage().host_budget_bytes);
  for (int i = 0; i < 8; ++i) {
    std::vector<uint8_t> out(n);
    ASSERT_OK(s->get_bytes("h" + std::to_string(i), out.data(), n));
    EXPECT_EQ(out, data[i]) << i;
  }
  // Pin everything in host: a further host put has nothing to evict.
  for (auto& i : s->list("h")) {
    if (i.tier == Tier::kHost && !i.pinned) {
      ASSERT_OK(s->pin(i.key));
    }
  }
  auto st = s->put("more", data[1].data(), TensorDesc::bytes(n), {Tier::kHost});
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.to_string();
  EXPECT_FALSE(s->contains("more"));
  // Larger than the whole host budget.
  std::vector<uint8_t> big(5u << 20, 1);
  st = s->put("big", big.data(), TensorDesc::bytes(big.size()), {Tier::kHost});
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("exceeds the host budget"), std::string::npos);
  // Usable: an NVMe put still works.
  ASSERT_OK(s->put("more", data[1].data(), TensorDesc::bytes(n)));
}

TEST(StoreOps, ObjectLargerThanHostBudgetStreamsFromNvme) {
  TempDir d;
  auto o = small_options(d.path());
  o.host_budget_bytes = 2ull << 20;
  o.staging_bytes = 1ull << 20;  // 128 KiB pieces
  auto s = open_or_die(o);
  ASSERT_TRUE(s);
  const uint64_t n = (6ull << 20) + 12345;
  auto data = pattern(n, 21);
  ASSERT_OK(s->put("large", data.data(), TensorDesc::bytes(n)));
  std::vector<uint8_t> out(n + 1);
  ASSERT_OK(s->get_bytes("large", out.data() + 1, n));  // unaligned: staged
  EXPECT_TRUE(std::equal(data.begin(), data.end(), out.begin() + 1));
  EXPECT_EQ(s->move("large", Tier::kHost).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(s->stat("large")->tier, Tier::kNvme);
}

TEST(StoreOps, NvmeBudgetExhausted) {
  TempDir d;
  auto o = small_options(d.path());
  o.nvme_budget_bytes = 1ull << 20;
  auto s = open_or_die(o);
  ASSERT_TRUE(s);
  auto a = pattern(700000, 1);
  ASSERT_OK(s->put("a", a.data(), TensorDesc::bytes(a.size())));
  auto st = s->put("b", a.data(), TensorDesc::bytes(a.size()));
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("nvme tier budget"), std::string::npos);
  EXPECT_FALSE(s->contains("b"));
  ASSERT_OK(s->remove("a"));
  ASSERT_OK(s->put("b", a.data(), TensorDesc::bytes(a.size())));
}

TEST(StoreOps, ConcurrentAsyncPutsAndGets) {
  TempDir d;
  auto s = open_or_die(small_options(d.path()));
  ASSERT_TRUE(s);
  const int k = 64;
  std::vector<std::vector<uint8_t>> data;
  std::vector<Future<void>> futs;
  for (int i = 0; i < k; ++i) data.push_back(pattern(10000 + 3000 * i, 300 + i));
  for (int i = 0; i < k; ++i) {
    futs.push_back(s->put_async("c" + std::to_string(i), data[i].data(), TensorDesc::bytes(data[i].size()),
                          {i % 2 ? Tier::kHost : Tier::kNvme}));
  }
  ASSERT_OK(when_all(futs).result());
  std::vector<std::vector<uint8_t>> out(k);
  futs.clear();
  for (int i = 0; i < k; ++i) {
    out[i].resize(data[i].size());
    futs.push_back(s->get_bytes_async("c" + std::to_string(i), out[i].data(), out[i].size()));
  }
  ASSERT_OK(when_all(futs).result());
  for (int i = 0; i < k; ++i) EXPECT_EQ(out[i], data[i]) << i;
}

// get_alloc reads one version whole while another thread overwrites the key with other
// shapes: version i is int32[10 + i % 2] filled with i, so a torn read cannot pass.
TEST(StoreOps, GetAllocReadsOneVersionWholeUnderOverwrites) {
  for (Tier tier : {Tier::kHost, Tier::kNvme}) {
    SCOPED_TRACE(tier_name(tier));
    TempDir d;
    auto s = open_or_die(small_options(d.path()));
    ASSERT_TRUE(s);
    auto version = [](int32_t i) { return std::vector<int32_t>(10 + i % 2, i); };
    auto desc_of = [](int32_t i) { return TensorDesc{DType::kInt32, {10 + i % 2}}; };
    ASSERT_OK(s->put("k", version(0).data(), desc_of(0), {tier}));
    std::atomic<bool> stop{false};
    std::atomic<int32_t> last{0};
    Status writer_status;
    std::thread writer([&] {
      for (int32_t i = 1; !stop.load(); ++i) {
        auto v = version(i);
        PutOptions po{tier};
        po.overwrite = true;
        Status st = s->put("k", v.data(), desc_of(i), po);
        if (!st.ok()) {
          writer_status = st;
          last.store(-1);  // ends the reader's wait
          return;
        }
        last.store(i);
      }
    });
    struct StopAndJoin {  // also when an ASSERT below returns early
      std::atomic<bool>& stop;
      std::thread& t;
      ~StopAndJoin() {
        stop.store(true);
        if (t.joinable()) t.join();
      }
    } stop_and_join{stop, writer};
    // Read while the writer is running: from its first overwrite to at least its 200th
    // (and at least 500 reads), so the reads race a stream of overwrites.
    while (last.load() == 0) std::this_thread::yield();
    int seen[2] = {0, 0};
    for (int j = 0; (j < 500 || last.load() < 200) && j < 1000000; ++j) {
      std::vector<int32_t> out;
      TensorDesc got;
      ASSERT_OK(s->get_alloc_async("k", [&](const TensorDesc& desc) -> Result<void*> {
                   got = desc;
                   out.resize(desc.numel());
                   return static_cast<void*>(out.data());
                 }).result());
      ASSERT_EQ(got.dtype, DType::kInt32);
      ASSERT_EQ(got.shape.size(), 1u);
      ASSERT_FALSE(out.empty());
      ASSERT_EQ(out, version(out[0])) << j;
      ASSERT_EQ(got.shape[0], 10 + out[0] % 2);
      ++seen[out[0] % 2];
    }
    stop.store(true);
    writer.join();
    ASSERT_OK(writer_status);
    EXPECT_GE(seen[0] + seen[1], 500);
    EXPECT_GE(last.load(), 200);
  }
}

TEST(StoreOps, GetAllocErrors) {
  TempDir d;
  auto s = open_or_die(small_options(d.path()));
  ASSERT_TRUE(s);
  int calls = 0;
  auto never = [&](const TensorDesc&) -> Result<void*> {
    ++calls;
    return static_cast<void*>(nullptr);
  };
  EXPECT_EQ(s->get_alloc_async("absent", never).result().status().code(), StatusCode::kNotFound);
  EXPECT_EQ(calls, 0);
  auto v = pattern(5000, 7);
  ASSERT_OK(s->put("k", v.data(), TensorDesc::bytes(v.size())));
  // A null destination for a non-empty object, and an allocator's own error, are returned.
  Status st = s->get_alloc_async("k", never).result().status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'k'"), std::string::npos) << st.to_string();
  EXPECT_EQ(calls, 1);
  st = s->get_alloc_async("k", [](const TensorDesc& desc) -> Result<void*> {
          return resource_exhausted("no room for " + std::to_string(desc.nbytes()));
        }).result().status();
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(st.message(), "no room for 5000");
  // A 0-byte object may get a null destination.
  ASSERT_OK(s->put("empty", nullptr, TensorDesc{DType::kFloat32, {0, 3}}));
  TensorDesc got;
  ASSERT_OK(s->get_alloc("empty", [&](const TensorDesc& desc) -> Result<void*> {
    got = desc;
    return static_cast<void*>(nullptr);
  }));
  EXPECT_EQ(got.dtype, DType::kFloat32);
  EXPECT_EQ(got.shape, (std::vector<int64_t>{0, 3}));
  // The store is still usable.
  expect_reads_back(*s, "k", v);
}

// A prefetch or pin that promotes a version while another thread overwrites the key (to
// NVMe) must not leave that replaced version's host memory allocated. Was: the replaced
// version stayed in the host LRU, its memory counted against the budget for good, and
// every later host put failed with "nothing is evictable".
TEST(StoreOps, PromotionRacingAnOverwriteLeavesNoHostMemoryBehind) {
  TempDir d;
  auto o = small_options(d.path());
  o.host_budget_bytes = 256u << 10;
  auto s = open_or_die(o);
  ASSERT_TRUE(s);
  const auto v = pattern(64u << 10, 51);
  const auto desc = TensorDesc::bytes(v.size());
  ASSERT_OK(s->put("k", v.data(), desc));
  std::atomic<bool> stop{false};
  std::atomic<int> puts{0}, promotions{0};
  std::thread writer([&] {
    PutOptions po;
    po.overwrite = true;
    while (!stop.load()) {
      if (s->put("k", v.data(), desc, po).ok()) ++puts;
    }
  });
  std::thread promoter([&] {
    for (int i = 0; !stop.load(); ++i) {
      bool ok = i % 2 ? s->prefetch("k").ok()
                      : s->pin("k").ok() && s->unpin("k").ok();
      if (ok) ++promotions;
    }
  });
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  while (std::chrono::steady_clock::now() < until && (puts < 2000 || promotions < 2000)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  stop = true;
  writer.join();
  promoter.join();
  EXPECT_GT(puts.load(), 0);
  EXPECT_GT(promotions.load(), 0);
  ASSERT_OK(s->evict("k"));
  EXPECT_EQ(s->usage().host_bytes, 0u);
  // The whole host budget is usable again.
  auto big = pattern(256u << 10, 52);
  ASSERT_OK(s->put("fresh", big.data(), TensorDesc::bytes(big.size()), {Tier::kHost}));
  std::vector<uint8_t> out(big.size());
  ASSERT_OK(s->get_bytes("k", out.data(), v.size()));
  EXPECT_TRUE(std::equal(v.begin(), v.end(), out.begin()));
}

TEST(StoreOps, ManySmallObjects) {
  TempDir d;
  auto s = open_or_die(small_options(d.path()));
  ASSERT_TRUE(s);
  const int k = 10000;
  std::vector<Future<void>> futs;
  futs.reserve(k);
  std::vector<uint64_t> vals(k);
  for (int i = 0; i < k; ++i) {
    vals[i] = 0x1234567800000000ull + static_cast<uint64_t>(i) * 7919;
    futs.push_back(s->put_async("small/" + std::to_string(i), &vals[i], TensorDesc{DType::kInt64, {1}}));
  }
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_OK(when_all(futs).result());
  auto t1 = std::chrono::steady_clock::now();
  std::printf("10000 puts: %.3f s\n", std::chrono::duration<double>(t1 - t0).count());
  EXPECT_EQ(s->list("small/").size(), static_cast<size_t>(k));
  EXPECT_EQ(s->usage().nvme_bytes, static_cast<uint64_t>(k) * 4096);
  s.reset();  // close
  auto t2 = std::chrono::steady_clock::now();
  auto s2 = open_or_die(small_options(d.path()));
  ASSERT_TRUE(s2);
  auto t3 = std::chrono::steady_clock::now();
  std::printf("close %.3f s, reopen %.3f s\n", std::chrono::duration<double>(t2 - t1).count(),
              std::chrono::duration<double>(t3 - t2).count());
  EXPECT_EQ(s2->list("small/").size(), static_cast<size_t>(k));
  std::vector<uint64_t> got(k, 0);
  futs.clear();
  for (int i = 0; i < k; ++i) {
    futs.push_back(s2->get_async("small/" + std::to_string(i), &got[i], TensorDesc{DType::kInt64, {1}}));
  }
  ASSERT_OK(when_all(futs).result());
  EXPECT_EQ(got, vals);
}

}  // namespace
}  // namespace strata
