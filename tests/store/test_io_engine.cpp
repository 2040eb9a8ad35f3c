// Round trips through the I/O engines: odd sizes and offsets with O_DIRECT, unaligned caller
// memory, registered buffers, both engines.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <tuple>

#include "store/test_io_util.hpp"
#include "strata/store/io_engine.hpp"

namespace strata {
namespace {

using testing::AlignedBuf;
using testing::make_engine;
using testing::pattern;
using testing::TempDir;

/// Writes `data` to `file` in pieces of `piece` bytes (piece i at byte i x piece), all
/// submitted before any is waited on. \returns their futures, in order.
std::vector<Future<uint64_t>> write_in_pieces(IoEngine& e, const std::shared_ptr<IoFile>& file,
                                              const std::vector<char>& data, uint64_t piece) {
  std::vector<Future<uint64_t>> fs;
  for (uint64_t off = 0; off < data.size(); off += piece) {
    fs.push_back(e.write_async(file, data.data() + off, std::min<uint64_t>(piece, data.size() - off), off));
  }
  return fs;
}

class IoEngineKinds : public ::testing::TestWithParam<EngineKind> {
 protected:
  /// An engine of the tested kind (`block_size` bytes per request, `queue_depth` in flight)
  /// and the file `name` in a fresh directory, truncated; either is null after a failure.
  std::pair<std::shared_ptr<IoEngine>, std::shared_ptr<IoFile>> engine_and_file(
      const std::string& name, uint64_t block_size = 1 << 20, uint32_t queue_depth = 8) {
    auto e = make_engine(GetParam(), block_size, queue_depth);
    if (!e) return {};
    auto f = e->open(dir_.path() + "/" + name, OpenMode::kTruncate);
    EXPECT_TRUE(f.ok()) << f.status().to_string();
    return {e, f.ok() ? *f : nullptr};
  }

  TempDir dir_;
};

TEST_P(IoEngineKinds, CreatesRequestedKind) {
  auto e = make_engine(GetParam());
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->kind(), GetParam());
  EXPECT_EQ(e->options().kind, GetParam());
}

TEST_P(IoEngineKinds, DrainWithNothingPendingReturnsAtOnce) {
  auto e = make_engine(GetParam());
  ASSERT_NE(e, nullptr);
  auto t0 = std::chrono::steady_clock::now();
  e->drain();
  e->drain();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(100));
}

// Odd sizes at odd offsets, from aligned and from unaligned caller memory, O_DIRECT on $TMPDIR (/var/tmp).
TEST_P(IoEngineKinds, OddSizesAndOffsetsRoundTripWithODirect) {
  TempDir dir;
  // Small blocks so that multi-piece requests and their splitting are exercised.
  auto e = make_engine(GetParam(), 64 * 1024, 16);
  ASSERT_NE(e, nullptr);
  const uint64_t sizes[] = {1, 511, 512, 4095, 4096, 4097, 65537, 1000003, 28824000};
  const uint64_t offsets[] = {0, 1, 4095, 4096, 8192 + 7};
  uint64_t seed = 1;
  for (uint64_t size : sizes) {
    for (uint64_t off : offsets) {
      for (uint64_t mis : {uint64_t{0}, uint64_t{3}}) {  // caller memory misalignment
        if (size > 100000 && off != 4096 && off != 1) continue;  // keep the test short
        SCOPED_TRACE("size " + std::to_string(size) + " offset " + std::to_string(off) +
                     " misalignment " + std::to_string(mis));
        auto f = e->open(dir.path() + "/f", OpenMode::kTruncate);
        ASSERT_TRUE(f.ok()) << f.status().to_string();
        EXPECT_TRUE((*f)->direct());
        EXPECT_GT((*f)->offset_alignment(), 0u);
        auto data = pattern(size, seed++);
        AlignedBuf src(size + 64), dst(size + 64);
        std::memcpy(src.data() + mis, data.data(), size);
        auto w = e->write_async(*f, src.data() + mis, size, off).result();
        ASSERT_TRUE(w.ok()) << w.status().to_string();
        EXPECT_EQ(*w, size);
        auto sz = (*f)->size();
        ASSERT_TRUE(sz.ok());
        EXPECT_EQ(*sz, off + size);  // never grows past offset + nbytes
        std::memset(dst.data(), 0x5a, size + 64);
        auto r = e->read_async(*f, dst.data() + mis, size, off).result();
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        EXPECT_EQ(*r, size);
        ASSERT_EQ(std::memcmp(dst.data() + mis, data.data(), size), 0);
        // The bytes around the destination are untouched.
        for (uint64_t i = 0; i < mis; ++i) EXPECT_EQ(dst.data()[i], 0x5a);
        EXPECT_EQ(dst.data()[mis + size], 0x5a);
        // The hole before `off` reads back as zeros.
        if (off > 0) {
          std::vector<char> hole(off, 1);
          auto h = e->read_async(*f, hole.data(), off, 0).result();
          ASSERT_TRUE(h.ok()) << h.status().to_string();
          EXPECT_EQ(hole, std::vector<char>(off, 0));
        }
      }
    }
  }
}

// Adjacent unaligned writes issued concurrently do not overwrite each other.
TEST_P(IoEngineKinds, ConcurrentAdjacentUnalignedWritesKeepEveryByte) {
  auto [e, f] = engine_and_file("adj", 4096, 32);
  ASSERT_TRUE(e && f);
  const uint64_t piece = 1000, n = 200;
  auto data = pattern(piece * n, 77);
  auto fs = write_in_pieces(*e, f, data, piece);
  for (auto& fu : fs) ASSERT_TRUE(fu.result().ok()) << fu.result().status().to_string();
  std::vector<char> back(piece * n);
  auto r = e->read_async(f, back.data(), back.size(), 0).result();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(back, data);
}

TEST_P(IoEngineKinds, ReadPastEndOfFileIsDataLossNamingPathAndOffset) {
  TempDir dir;
  auto e = make_engine(GetParam());
  ASSERT_NE(e, nullptr);
  const std::string path = dir.path() + "/short";
  auto f = e->open(path, OpenMode::kTruncate);
  ASSERT_TRUE(f.ok());
  auto data = pattern(10000, 3);
  ASSERT_TRUE(e->write_async(*f, data.data(), data.size(), 0).result().ok());
  AlignedBuf buf(20000);
  auto r = e->read_async(*f, buf.data(), 8192, 4096).result();  // 4096..12288 > 10000
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().to_string();
  EXPECT_NE(r.status().message().find("offset"), std::string::npos);
  // Entirely past the end.
  auto r2 = e->read_async(*f, buf.data(), 1, 10000).result();
  EXPECT_EQ(r2.status().code(), StatusCode::kDataLoss);
  // Exactly up to the end is fine.
  auto r3 = e->read_async(*f, buf.data(), 10000, 0).result();
  ASSERT_TRUE(r3.ok());
  EXPECT_EQ(std::memcmp(buf.data(), data.data(), 10000), 0);
}

TEST_P(IoEngineKinds, ZeroLengthIsReadyAtOnce) {
  auto [e, f] = engine_and_file("z");
  ASSERT_TRUE(e && f);
  auto fu = e->read_async(f, nullptr, 0, 0);
  EXPECT_TRUE(fu.ready());
  ASSERT_TRUE(fu.result().ok());
  EXPECT_EQ(*fu.result(), 0u);
}

TEST_P(IoEngineKinds, RegisteredBufferRoundTrip) {
  TempDir dir;
  auto e = make_engine(GetParam(), 256 * 1024, 8);
  ASSERT_NE(e, nullptr);
  const uint64_t n = 4 << 20;
  AlignedBuf region(2 * n);
  ASSERT_TRUE(e->register_buffer(region.data(), 2 * n).ok());
  auto f = e->open(dir.path() + "/fixed", OpenMode::kTruncate);
  ASSERT_TRUE(f.ok());
  auto data = pattern(n - 5, 9);
  std::memcpy(region.data(), data.data(), data.size());
  auto w = e->write_async(*f, region.data(), data.size(), 512).result();
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  auto r = e->read_async(*f, region.data() + n, data.size(), 512).result();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(std::memcmp(region.data() + n, data.data(), data.size()), 0);
  EXPECT_TRUE(e->unregister_buffer(region.data()).ok());
  if (GetParam() == EngineKind::kUring) {
    EXPECT_EQ(e->unregister_buffer(region.data()).code(), StatusCode::kNotFound);
  }
}

TEST_P(IoEngineKinds, SyncCompletes) {
  auto [e, f] = engine_and_file("s");
  ASSERT_TRUE(e && f);
  auto data = pattern(5000, 4);
  ASSERT_TRUE(e->write_async(f, data.data(), data.size(), 0).result().ok());
  auto s = e->sync_async(f).result();
  EXPECT_TRUE(s.ok()) << s.status().to_string();
}

TEST_P(IoEngineKinds, ManyConcurrentRequestsThenDrain) {
  auto [e, f] = engine_and_file("many", 16384, 4);
  ASSERT_TRUE(e && f);
  const uint64_t chunk = 50000, n = 64;
  auto data = pattern(chunk * n, 5);
  auto fs = write_in_pieces(*e, f, data, chunk);
  e->drain();
  for (auto& fu : fs) {
    EXPECT_TRUE(fu.ready());
    ASSERT_TRUE(fu.result().ok());
    EXPECT_EQ(*fu.result(), chunk);
  }
  std::vector<char> back(chunk * n);
  ASSERT_TRUE(e->read_async(f, back.data(), back.size(), 0).result().ok());
  EXPECT_EQ(back, data);
}

double occupancy_sum(const IoOccupancy& o) {
  return o.idle_seconds + o.reads_only_seconds + o.writes_only_seconds +
         o.reads_and_writes_seconds;
}

// occupancy(): an interval with only writes in flight adds to writes_only (and idle) alone,
// one with only reads to reads_only alone, and the four times of an interval add up to its
// length on the steady clock; the piece-seconds give a mean depth within [1, queue_depth].
TEST_P(IoEngineKinds, OccupancySplitsTimeByWhatIsInFlight) {
  auto [e, f] = engine_and_file("occ", 1 << 20, 8);
  ASSERT_TRUE(e && f);
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
  auto data = pattern(16 << 20, 6);
  const auto t0 = Clock::now();
  const IoOccupancy s0 = e->occupancy();
  const auto t1 = Clock::now();
  ASSERT_TRUE(e->write_async(f, data.data(), data.size(), 0).result().ok());
  const IoOccupancy s1 = e->occupancy();
  std::vector<char> back(data.size());
  ASSERT_TRUE(e->read_async(f, back.data(), back.size(), 0).result().ok());
  ASSERT_TRUE(e->sync_async(f).result().ok());  // a sync counts as a write
  const auto t2 = Clock::now();
  const IoOccupancy s2 = e->occupancy();
  const auto t3 = Clock::now();
  EXPECT_EQ(back, data);
  const IoOccupancy w = s1 - s0, r = s2 - s1;
  EXPECT_GT(w.writes_only_seconds, 0.0);
  EXPECT_EQ(w.reads_only_seconds, 0.0);
  EXPECT_EQ(w.reads_and_writes_seconds, 0.0);
  EXPECT_GT(r.reads_only_seconds, 0.0);
  EXPECT_GT(r.writes_only_seconds, 0.0);  // the sync
  EXPECT_EQ(r.reads_and_writes_seconds, 0.0);
  // Piece-seconds: none of the other kind; at least one piece and at most queue_depth (8:
  // one request, one worker) in flight for every second of the kind (1e-9: rounding).
  EXPECT_EQ(w.read_piece_seconds, 0.0);
  EXPECT_GE(w.write_piece_seconds, w.writes_only_seconds * (1 - 1e-9));
  EXPECT_LE(w.write_piece_seconds, 8 * w.writes_only_seconds * (1 + 1e-9));
  EXPECT_GE(r.read_piece_seconds, r.reads_only_seconds * (1 - 1e-9));
  EXPECT_LE(r.read_piece_seconds, 8 * r.reads_only_seconds * (1 + 1e-9));
  const double total = occupancy_sum(s2 - s0);
  EXPECT_GE(total, seconds(t2 - t1));
  EXPECT_LE(total, seconds(t3 - t0));
  // From the engine's creation on: every second is in one of the four.
  EXPECT_GE(occupancy_sum(e->occupancy()), occupancy_sum(s2));
}

INSTANTIATE_TEST_SUITE_P(Engines, IoEngineKinds,
                         ::testing::Values(EngineKind::kUring, EngineKind::kThreads),
                         [](const auto& info) { return std::string(engine_kind_name(info.param)); });

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// Every submit_batch setting and registered/unregistered buffers give the same bytes.
TEST(IoUringOptions, SubmitBatchAndBufferRegistrationRoundTrip) {
  testing::TempDir dir;
  const uint64_t n = (3 << 20) + 4097;
  auto data = testing::pattern(n, 99);
  for (uint32_t batch : {0u, 1u, 4u, 64u}) {
    for (bool reg : {true, false}) {
      SCOPED_TRACE("submit_batch " + std::to_string(batch) + " register_buffers " +
                   std::to_string(reg));
      IoEngineOptions o = testing::engine_options(EngineKind::kUring, 256 * 1024, 16);
      o.submit_batch = batch;
      o.register_buffers = reg;
      auto e = IoEngine::create(o);
      ASSERT_TRUE(e.ok()) << e.status().to_string();
      testing::AlignedBuf mem(2 * n + 8192);
      ASSERT_TRUE((*e)->register_buffer(mem.data(), 2 * n + 8192).ok());
      std::memcpy(mem.data(), data.data(), n);
      auto f = (*e)->open(dir.path() + "/b", OpenMode::kTruncate);
      ASSERT_TRUE(f.ok());
      ASSERT_TRUE((*e)->write_async(*f, mem.data(), n, 4096).result().ok());
      char* back = mem.data() + n + 4096;
      auto r = (*e)->read_async(*f, back, n, 4096).result();
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      EXPECT_EQ(std::memcmp(back, data.data(), n), 0);
      ASSERT_TRUE((*e)->unregister_buffer(mem.data()).ok());
    }
  }
}

}  // namespace
}  // namespace strata
