// The store's counters (Store::stats(), stats.hpp): exact values after known operations,
// reset, the pools' gauges, the periodic log line and STRATA_STATS_INTERVAL.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "store/test_store_util.hpp"
#include "strata/base/units.hpp"

namespace strata::store_test {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kChunk = 1ull << 20;  // small_options()

/// Disk bytes of an object of `n` bytes: each chunk's bytes rounded up to 4 KiB.
uint64_t disk_bytes(uint64_t n) {
  uint64_t total = 0;
  for (uint64_t at = 0; at < n; at += kChunk) total += align_up(std::min(kChunk, n - at), 4096);
  return total;
}

TEST(StoreStats, PutAndGetCountNvmeChunksAndDiskBytes) {
  TempDir d;
  auto s = open_or_die(small_options(d.path()));
  ASSERT_TRUE(s);
  const uint64_t n = 2 * kChunk + kChunk / 2 + 10;  // 3 chunks, the last one 512 KiB + 10
  auto v = pattern(n, 1);
  // A buffer that is not 4096-aligned (staged; one byte into an allocation, since an
  // allocator such as ASan's may hand out page-aligned blocks) and an aligned one (O_DIRECT
  // from the caller's memory).
  std::vector<uint8_t> unaligned_buf(n + 1);
  uint8_t* const unaligned = unaligned_buf.data() + 1;
  std::memcpy(unaligned, v.data(), n);
  std::unique_ptr<uint8_t, decltype(&std::free)> aligned(
      static_cast<uint8_t*>(std::aligned_alloc(4096, align_up(n, 4096))), &std::free);
  ASSERT_TRUE(aligned);
  std::memcpy(aligned.get(), v.data(), n);
  ASSERT_TRUE(s->put("a", unaligned, TensorDesc::bytes(n)).ok());
  ASSERT_TRUE(s->put("b", aligned.get(), TensorDesc::bytes(n)).ok());
  StoreStats st = s->stats();
  EXPECT_EQ(st.nvme.write_ops, 6u);
  EXPECT_EQ(st.nvme.write_bytes, 2 * disk_bytes(n));
  EXPECT_EQ(disk_bytes(n), 2 * kChunk + 528384);
  EXPECT_EQ(st.nvme.read_ops, 0u);
  EXPECT_GT(st.nvme_write_wait_seconds, 0.0);
  EXPECT_EQ(st.host.write_ops, 0u);

  std::vector<uint8_t> got_buf(n + 1);
  ASSERT_TRUE(s->get_bytes("a", got_buf.data() + 1, n).ok());
  ASSERT_TRUE(s->get_bytes("b", aligned.get(), n).ok());
  EXPECT_EQ(std::vector<uint8_t>(got_buf.begin() + 1, got_buf.end()), v);
  st = s->stats();
  EXPECT_EQ(st.nvme.read_ops, 6u);
  EXPECT_EQ(st.nvme.read_bytes, 2 * disk_bytes(n));
  EXPECT_EQ(st.prefetch_misses, 2u);  // both read from NVMe
  EXPECT_EQ(st.prefetch_hits, 0u);
  EXPECT_GT(st.nvme_read_wait_seconds, 0.0);
  EXPECT_EQ(st.checksum_failures, 0u);
  EXPECT_EQ(st.staging_pool.capacity_bytes, 4 * kMiB);
  EXPECT_GT(st.staging_pool.peak_bytes, 0u);
  EXPECT_EQ(st.staging_pool.in_use_bytes, 0u);

  // A partial write_range of an NVMe object: one chunk read (the old bytes) and written.
  ASSERT_TRUE(s->write_range("a", 10, 100, v.data()).ok());
  const StoreStats after = s->stats();
  EXPECT_EQ(after.nvme.read_ops - st.nvme.read_ops, 1u);
  EXPECT_EQ(after.nvme.read_bytes - st.nvme.read_bytes, kChunk);
  EXPECT_EQ(after.nvme.write_ops - st.nvme.write_ops, 1u);
  EXPECT_EQ(after.nvme.write_bytes - st.nvme.write_bytes, kChunk);
  // A read_range inside one chunk, verified (the default): the whole chunk is read.
  ASSERT_TRUE(s->read_range("b", kChunk + 5, 10, got_buf.data()).ok());
  EXPECT_EQ(s->stats().nvme.read_bytes - after.nvme.read_bytes, kChunk);
  ASSERT_TRUE(s->close().ok());
}

TEST(StoreStats, RepeatBytesMakesAnObjectFromOneBuffer) {
  TempDir d;
  const uint64_t n = 5 * kChunk + 300;  // 6 chunks, the last one 300 bytes
  auto block = pattern(2 * kChunk, 3);  // repeated every 2 chunks
  std::vector<uint8_t> want(n);
  for (uint64_t i = 0; i < n; ++i) want[i] = block[i % block.size()];
  {
    auto s = open_or_die(small_options(d.path()));
    ASSERT_TRUE(s);
    PutOptions po;
    po.repeat_bytes = block.size();
    ASSERT_TRUE(s->put("rep", block.data(), TensorDesc::bytes(n), po).ok());
    EXPECT_EQ(s->stat("rep")->nbytes, n);
    EXPECT_EQ(s->stat("rep")->num_chunks, 6u);
    std::vector<uint8_t> got(n);
    ASSERT_TRUE(s->get_bytes("rep", got.data(), n).ok());
    EXPECT_EQ(got, want);
    // Errors name the key, change nothing: not a multiple of the chunk, another tier.
    po.repeat_bytes = kChunk + 4096;
    Status e = s->put("bad", block.data(), TensorDesc::bytes(n), po);
    EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(e.message().find("put 'bad': PutOptions.repeat_bytes " +
                               std::to_string(kChunk + 4096)), std::string::npos)
        << e.message();
    po.repeat_bytes = kChunk;
    po.tier = Tier::kHost;
    EXPECT_EQ(s->put("bad", block.data(), TensorDesc::bytes(n), po).code(),
              StatusCode::kInvalidArgument);
    EXPECT_FALSE(s->contains("bad"));
    ASSERT_TRUE(s->close().ok());
  }
  auto s = open_or_die(small_options(d.path()));  // every chunk checksummed as written
  ASSERT_TRUE(s);
  auto rep = s->verify();
  ASSERT_TRUE(rep.ok());
  EXPECT_TRUE(rep->errors.empty());
  EXPECT_EQ(rep->chunks, 6u);
  std::vector<uint8_t> got(n);
  ASSERT_TRUE(s->get_bytes("rep", got.data(), n).ok());
  EXPECT_EQ(got, want);
}

TEST(StoreStats, AnObjectsOwnChunkSizeMakesSlicesWholeChunks) {
  TempDir d;
  constexpr uint64_t kSlice = 256 * 1024;  // a quarter of the store's 1 MiB chunk
  const uint64_t n = 3 * kChunk + 100;     // 13 slices: 12 whole and one of 100 bytes
  auto v = pattern(n, 7);
  std::unique_ptr<uint8_t, decltype(&std::free)> buf(
      static_cast<uint8_t*>(std::aligned_alloc(4096, align_up(n, 4096))), &std::free);
  ASSERT_TRUE(buf);
  {
    auto s = open_or_die(small_options(d.path()));
    ASSERT_TRUE(s);
    PutOptions po;
    po.chunk_bytes = kSlice;
    ASSERT_TRUE(s->put("sliced", v.data(), TensorDesc::bytes(n), po).ok());
    ASSERT_TRUE(s->put("plain", v.data(), TensorDesc::bytes(n)).ok());
    auto info = s->stat("sliced");
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->chunk_bytes, kSlice);
    EXPECT_EQ(info->num_chunks, 13u);
    EXPECT_EQ(s->stat("plain")->chunk_bytes, kChunk);
    EXPECT_EQ(s->stat("plain")->num_chunks, 4u);
    // One slice read (verified): that chunk only, not the store chunk around it.
    const StoreStats st = s->stats();
    ASSERT_TRUE(s->read_range("sliced", 5 * kSlice, kSlice, buf.get()).ok());
    EXPECT_EQ(std::memcmp(buf.get(), v.data() + 5 * kSlice, kSlice), 0);
    const StoreStats r = s->stats();
    EXPECT_EQ(r.nvme.read_bytes - st.nvme.read_bytes, kSlice);
    // One slice written: no read-modify-write (nothing read), one slice written.
    std::vector<uint8_t> w = pattern(kSlice, 8);
    std::memcpy(buf.get(), w.data(), kSlice);
    ASSERT_TRUE(s->write_range("sliced", 6 * kSlice, kSlice, buf.get()).ok());
    const StoreStats after = s->stats();
    EXPECT_EQ(after.nvme.read_bytes - r.nvme.read_bytes, 0u);
    EXPECT_EQ(after.nvme.write_bytes - r.nvme.write_bytes, kSlice);
    std::memcpy(v.data() + 6 * kSlice, w.data(), kSlice);
    // The same on an object of store chunks: the whole 1 MiB chunk read, then rewritten.
    ASSERT_TRUE(s->write_range("plain", 6 * kSlice, kSlice, buf.get()).ok());
    const StoreStats plain = s->stats();
    EXPECT_EQ(plain.nvme.read_bytes - after.nvme.read_bytes, kChunk);
    EXPECT_EQ(plain.nvme.write_bytes - after.nvme.write_bytes, kChunk);
    ASSERT_TRUE(s->flush().ok());
    // Bad chunk sizes name the key and change nothing.
    for (uint64_t bad : {uint64_t{5000}, 2 * kChunk}) {
      po.chunk_bytes = bad;
      po.overwrite = true;
      Status e = s->put("sliced", v.data(), TensorDesc::bytes(n), po);
      EXPECT_EQ(e.code(), StatusCode::kInvalidArgument) << bad;
      EXPECT_NE(e.message().find("put 'sliced': PutOptions.chunk_bytes " + std::to_string(bad)),
                std::string::npos) << e.message();
    }
    ASSERT_TRUE(s->close().ok());
  }
  // Reopened: the chunk size comes back from the catalog's rows, and so do the bytes.
  auto s = open_or_die(small_options(d.path()));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->stat("sliced")->chunk_bytes, kSlice);
  std::vector<uint8_t> got(n);
  ASSERT_TRUE(s->get_bytes("sliced", got.data(), n).ok());
  EXPECT_EQ(got, v);
  const StoreStats st = s->stats();
  ASSERT_TRUE(s->write_range("sliced", kSlice, kSlice, buf.get()).ok());
  EXPECT_EQ(s->stats().nvme.read_bytes - st.nvme.read_bytes, 0u);  // whole chunks still
  auto rep = s->verify();
  ASSERT_TRUE(rep.ok());
  EXPECT_TRUE(rep->errors.empty());
  EXPECT_EQ(rep->chunks, 13u + 4u);
  EXPECT_EQ(rep->bytes, 2 * n);
  ASSERT_TRUE(s->close().ok());
}

TEST(StoreStats, HostTierEvictionAndLruCounts) {
  TempDir d;
  auto s = open_or_die(small_options(d.path()));  // 8 MiB host tier
  ASSERT_TRUE(s);
  const uint64_t n = 3 * kMiB;
  auto v = pattern(n, 2);
  PutOptions host;
  host.tier = Tier::kHost;
  ASSERT_TRUE(s->put("h", v.data(), TensorDesc::bytes(n), host).ok());
  StoreStats st = s->stats();
  EXPECT_EQ(st.host.write_ops, 1u);
  EXPECT_EQ(st.host.write_bytes, n);
  EXPECT_EQ(st.nvme.write_ops, 0u);
  EXPECT_EQ(st.host_pool.in_use_bytes, n);
  EXPECT_EQ(st.host_pool.capacity_bytes, 8 * kMiB);
  EXPECT_EQ(st.host_pool.peak_bytes, n);
  std::vector<uint8_t> got(n);
  ASSERT_TRUE(s->get_bytes("h", got.data(), n).ok());
  st = s->stats();
  EXPECT_EQ(st.host.read_ops, 1u);
  EXPECT_EQ(st.host.read_bytes, n);
  EXPECT_EQ(st.prefetch_misses, 0u);
  EXPECT_EQ(st.nvme.read_ops, 0u);

  ASSERT_TRUE(s->evict("h").ok());  // dirty: written back, then freed
  st = s->stats();
  EXPECT_EQ(st.evictions, 1u);
  EXPECT_EQ(st.eviction_bytes, n);
  EXPECT_EQ(st.lru_evictions, 0u);
  EXPECT_EQ(st.writebacks, 1u);
  EXPECT_EQ(st.writeback_bytes, n);
  EXPECT_EQ(st.nvme.write_ops, 3u);
  EXPECT_EQ(st.nvme.write_bytes, n);
  EXPECT_EQ(st.host_pool.in_use_bytes, 0u);
  EXPECT_EQ(st.host_pool.peak_bytes, n);

  // Three 3 MiB objects in an 8 MiB tier: the third put evicts the least recent one.
  ASSERT_TRUE(s->put("x", v.data(), TensorDesc::bytes(n), host).ok());
  ASSERT_TRUE(s->put("y", v.data(), TensorDesc::bytes(n), host).ok());
  ASSERT_TRUE(s->put("z", v.data(), TensorDesc::bytes(n), host).ok());
  st = s->stats();
  EXPECT_EQ(st.lru_evictions, 1u);
  EXPECT_EQ(st.evictions, 2u);
  EXPECT_EQ(st.writebacks, 2u);
  EXPECT_EQ(s->stat("x")->tier, Tier::kNvme);
  EXPECT_EQ(st.host_pool.peak_bytes, 2 * n);

  s->reset_stats();
  st = s->stats();
  EXPECT_EQ(st.host.write_ops, 0u);
  EXPECT_EQ(st.evictions, 0u);
  EXPECT_EQ(st.nvme.write_bytes, 0u);
  EXPECT_EQ(st.nvme_write_wait_seconds, 0.0);
  EXPECT_EQ(st.host_pool.in_use_bytes, 2 * n);  // a gauge: reset leaves it
  EXPECT_EQ(st.host_pool.peak_bytes, 2 * n);    // restarts at the use now
  EXPECT_LT(st.elapsed_seconds, 5.0);
  ASSERT_TRUE(s->close().ok());
}

TEST(StoreStats, PrefetchThenGetIsOneHit) {
  TempDir d;
  auto s = open_or_die(small_options(d.path()));
  ASSERT_TRUE(s);
  const uint64_t n = kChunk + 4096;
  auto v = pattern(n, 3);
  ASSERT_TRUE(s->put("p", v.data(), TensorDesc::bytes(n)).ok());
  s->reset_stats();
  ASSERT_TRUE(s->prefetch("p").ok());
  StoreStats st = s->stats();
  EXPECT_EQ(st.prefetches, 1u);
  EXPECT_EQ(st.promotions, 1u);
  EXPECT_EQ(st.promotion_bytes, n);
  EXPECT_EQ(st.nvme.read_ops, 2u);
  EXPECT_EQ(st.nvme.read_bytes, n);
  ASSERT_TRUE(s->prefetch("p").ok());  // already there: nothing to do
  std::vector<uint8_t> got(n);
  ASSERT_TRUE(s->get_bytes("p", got.data(), n).ok());
  ASSERT_TRUE(s->get_bytes("p", got.data(), n).ok());  // the prefetch was used already
  st = s->stats();
  EXPECT_EQ(st.prefetches, 1u);
  EXPECT_EQ(st.prefetch_hits, 1u);
  EXPECT_EQ(st.prefetch_misses, 0u);
  EXPECT_EQ(st.host.read_ops, 2u);
  EXPECT_EQ(st.host.read_bytes, 2 * n);
  // A move (not a prefetch) is a promotion but its reads are not prefetch hits.
  ASSERT_TRUE(s->evict("p").ok());
  ASSERT_TRUE(s->move("p", Tier::kHost).ok());
  ASSERT_TRUE(s->get_bytes("p", got.data(), n).ok());
  st = s->stats();
  EXPECT_EQ(st.promotions, 2u);
  EXPECT_EQ(st.evictions, 1u);
  EXPECT_EQ(st.writebacks, 0u);  // clean: nothing to write back
  EXPECT_EQ(st.prefetch_hits, 1u);
  ASSERT_TRUE(s->close().ok());
}

TEST(StoreStats, CorruptedChunkCountsOneChecksumFailure) {
  TempDir d;
  const StoreOptions o = small_options(d.path());
  auto v = pattern(8192, 4);
  ASSERT_TRUE(put_and_close(o, "c", v).ok());
  std::string data;
  for (const auto& e : std::filesystem::directory_iterator(d.path())) {
    if (e.path().extension() == ".data") data = e.path().string();
  }
  ASSERT_FALSE(data.empty());
  int fd = ::open(data.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  uint8_t b = 0;
  ASSERT_EQ(::pread(fd, &b, 1, 100), 1);
  b ^= 0x10;
  ASSERT_EQ(::pwrite(fd, &b, 1, 100), 1);
  ::close(fd);
  auto s = open_or_die(o);
  ASSERT_TRUE(s);
  std::vector<uint8_t> got(v.size());
  EXPECT_EQ(s->get_bytes("c", got.data(), got.size()).code(), StatusCode::kDataLoss);
  EXPECT_EQ(s->stats().checksum_failures, 1u);
  auto r = s->verify();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->errors.size(), 1u);
  const StoreStats st = s->stats();
  EXPECT_EQ(st.checksum_failures, 2u);
  EXPECT_EQ(st.nvme.read_ops, 2u);
  EXPECT_EQ(st.nvme.read_bytes, 2 * 8192u);
  ASSERT_TRUE(s->close().ok());
}

TEST(StoreStats, FormatLineAndFieldNames) {
  StoreStats s;
  s.nvme.write_bytes = 4096;
  s.nvme.write_ops = 1;
  s.prefetch_hits = 2;
  s.nvme_read_wait_seconds = 0.25;
  s.elapsed_seconds = 1.5;
  EXPECT_EQ(format_stats_line(s),
            "interval=1.50s nvme_write_bytes=4096 nvme_write_ops=1 prefetch_hits=2 "
            "nvme_read_wait_seconds=0.250");
  StoreStats later = s;
  later.nvme.write_bytes = 8192;
  later.elapsed_seconds = 2.5;
  const StoreStats d = stats_delta(s, later);
  EXPECT_EQ(d.nvme.write_bytes, 4096u);
  EXPECT_EQ(d.nvme.write_ops, 0u);
  EXPECT_DOUBLE_EQ(d.elapsed_seconds, 1.0);
  // Every field has a distinct name; 8-byte fields after struct_size in the C struct.
  auto f = stat_fields(s);
  EXPECT_EQ(f.size(), 34u);
  std::set<std::string> names;
  for (auto& x : f) names.insert(x.name);
  EXPECT_EQ(names.size(), f.size());
}

TEST(StoreStats, PeriodicLogLinesWhenEnabledAndNoneWhenOff) {
  for (int interval_ms : {0, 40}) {
    SCOPED_TRACE(interval_ms);
    TempDir d;
    StoreOptions o = small_options(d.path());
    o.stats_interval = std::chrono::milliseconds(interval_ms);
    ::testing::internal::CaptureStderr();
    {
      auto s = open_or_die(o);
      ASSERT_TRUE(s);
      auto v = pattern(kChunk, 5);
      ASSERT_TRUE(s->put("k", v.data(), TensorDesc::bytes(v.size())).ok());
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      ASSERT_TRUE(s->close().ok());
    }
    const std::string err = ::testing::internal::GetCapturedStderr();
    std::vector<std::string> lines;
    std::istringstream in(err);
    for (std::string l; std::getline(in, l);) {
      if (l.rfind("strata [stats] ", 0) == 0) lines.push_back(l);
    }
    if (interval_ms == 0) {
      EXPECT_TRUE(lines.empty()) << err;
      continue;
    }
    ASSERT_GE(lines.size(), 2u) << err;
    const std::regex re("strata \\[stats\\] " + d.path() +
                        " interval=0\\.[0-9]{2}s( [a-z_]+=[0-9]+(\\.[0-9]{3})?)*");
    bool saw_put = false;
    for (const auto& l : lines) {
      EXPECT_TRUE(std::regex_match(l, re)) << l;
      saw_put = saw_put || l.find(" nvme_write_ops=1 ") != std::string::npos;
    }
    EXPECT_TRUE(saw_put) << err;  // the put's chunk, in exactly one interval's deltas
  }
}

TEST(StoreStats, IntervalFromTheEnvironment) {
  ::setenv("STRATA_STATS_INTERVAL", "0.25", 1);
  auto o = StoreOptions::from_env();
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  EXPECT_EQ(o->stats_interval, std::chrono::milliseconds(250));
  for (const char* bad : {"abc", "-1", "", "1s", "nan", "1e-9", "0.0004", "2e9"}) {
    ::setenv("STRATA_STATS_INTERVAL", bad, 1);
    auto r = StoreOptions::from_env();
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("STRATA_STATS_INTERVAL"), std::string::npos)
        << r.status().message();
  }
  ::unsetenv("STRATA_STATS_INTERVAL");
  o = StoreOptions::from_env();
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->stats_interval.count(), 0);
}

}  // namespace
}  // namespace strata::store_test
