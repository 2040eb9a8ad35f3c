// Round trips through the I/O engines: odd sizes and offsets with O_DIRECT, unaligned caller
// memory, registered buffers, striping over 1, 2 and 3 directories, both engines.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <tuple>

#include "store/test_io_util.hpp"
#include "strata/store/io_engine.hpp"

namespace strata {
namespace {

using testing::AlignedBuf;
using testing::pattern;
using testing::TempDir;

std::shared_ptr<IoEngine> make_engine(EngineKind kind, uint64_t block_size = 1 << 20,
                                      uint32_t qd = 8) {
  IoEngineOptions o;
  o.kind = kind;
  o.block_size = block_size;
  o.queue_depth = qd;
  o.allow_threads_fallback = false;
  auto r = IoEngine::create(o);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : nullptr;
}

class IoEngineKinds : public ::testing::TestWithParam<EngineKind> {};

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

// Odd sizes at odd offsets, from aligned and from unaligned caller memory, O_DIRECT on /tmp.
TEST_P(IoEngineKinds, OddSizesAndOffsetsRoundTripWithODirect) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
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
        auto w = e->write(*f, src.data() + mis, size, off).result();
        ASSERT_TRUE(w.ok()) << w.status().to_string();
        EXPECT_EQ(*w, size);
        auto sz = (*f)->size();
        ASSERT_TRUE(sz.ok());
        EXPECT_EQ(*sz, off + size);  // never grows past offset + nbytes
        std::memset(dst.data(), 0x5a, size + 64);
        auto r = e->read(*f, dst.data() + mis, size, off).result();
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        EXPECT_EQ(*r, size);
        ASSERT_EQ(std::memcmp(dst.data() + mis, data.data(), size), 0);
        // The bytes around the destination are untouched.
        for (uint64_t i = 0; i < mis; ++i) EXPECT_EQ(dst.data()[i], 0x5a);
        EXPECT_EQ(dst.data()[mis + size], 0x5a);
        // The hole before `off` reads back as zeros.
        if (off > 0) {
          std::vector<char> hole(off, 1);
          auto h = e->read(*f, hole.data(), off, 0).result();
          ASSERT_TRUE(h.ok()) << h.status().to_string();
          EXPECT_EQ(hole, std::vector<char>(off, 0));
        }
      }
    }
  }
}

// Adjacent unaligned writes issued concurrently do not overwrite each other.
TEST_P(IoEngineKinds, ConcurrentAdjacentUnalignedWritesKeepEveryByte) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto e = make_engine(GetParam(), 4096, 32);
  ASSERT_NE(e, nullptr);
  auto f = e->open(dir.path() + "/adj", OpenMode::kTruncate);
  ASSERT_TRUE(f.ok());
  const uint64_t piece = 1000, n = 200;
  auto data = pattern(piece * n, 77);
  std::vector<Future<uint64_t>> fs;
  for (uint64_t i = 0; i < n; ++i) {
    fs.push_back(e->write(*f, data.data() + i * piece, piece, i * piece));
  }
  for (auto& fu : fs) ASSERT_TRUE(fu.result().ok()) << fu.result().status().to_string();
  std::vector<char> back(piece * n);
  auto r = e->read(*f, back.data(), back.size(), 0).result();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(back, data);
}

TEST_P(IoEngineKinds, ReadPastEndOfFileIsDataLossNamingPathAndOffset) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto e = make_engine(GetParam());
  ASSERT_NE(e, nullptr);
  const std::string path = dir.path() + "/short";
  auto f = e->open(path, OpenMode::kTruncate);
  ASSERT_TRUE(f.ok());
  auto data = pattern(10000, 3);
  ASSERT_TRUE(e->write(*f, data.data(), data.size(), 0).result().ok());
  AlignedBuf buf(20000);
  auto r = e->read(*f, buf.data(), 8192, 4096).result();  // 4096..12288 > 10000
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().to_string();
  EXPECT_NE(r.status().message().find("offset"), std::string::npos);
  // Entirely past the end.
  auto r2 = e->read(*f, buf.data(), 1, 10000).result();
  EXPECT_EQ(r2.status().code(), StatusCode::kDataLoss);
  // Exactly up to the end is fine.
  auto r3 = e->read(*f, buf.data(), 10000, 0).result();
  ASSERT_TRUE(r3.ok());
  EXPECT_EQ(std::memcmp(buf.data(), data.data(), 10000), 0);
}

TEST_P(IoEngineKinds, ZeroLengthIsReadyAtOnce) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto e = make_engine(GetParam());
  ASSERT_NE(e, nullptr);
  auto f = e->open(dir.path() + "/z", OpenMode::kTruncate);
  ASSERT_TRUE(f.ok());
  auto fu = e->read(*f, nullptr, 0, 0);
  EXPECT_TRUE(fu.ready());
  ASSERT_TRUE(fu.result().ok());
  EXPECT_EQ(*fu.result(), 0u);
}

TEST_P(IoEngineKinds, RegisteredBufferRoundTrip) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto e = make_engine(GetParam(), 256 * 1024, 8);
  ASSERT_NE(e, nullptr);
  const uint64_t n = 4 << 20;
  AlignedBuf region(2 * n);
  ASSERT_TRUE(e->register_buffer(region.data(), 2 * n).ok());
  auto f = e->open(dir.path() + "/fixed", OpenMode::kTruncate);
  ASSERT_TRUE(f.ok());
  auto data = pattern(n - 5, 9);
  std::memcpy(region.data(), data.data(), data.size());
  auto w = e->write(*f, region.data(), data.size(), 512).result();
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  auto r = e->read(*f, region.data() + n, data.size(), 512).result();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(std::memcmp(region.data() + n, data.data(), data.size()), 0);
  EXPECT_TRUE(e->unregister_buffer(region.data()).ok());
  if (GetParam() == EngineKind::kUring) {
    EXPECT_EQ(e->unregister_buffer(region.data()).code(), StatusCode::kNotFound);
  }
}

TEST_P(IoEngineKinds, SyncCompletes) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto e = make_engine(GetParam());
  ASSERT_NE(e, nullptr);
  auto f = e->open(dir.path() + "/s", OpenMode::kTruncate);
  ASSERT_TRUE(f.ok());
  auto data = pattern(5000, 4);
  ASSERT_TRUE(e->write(*f, data.data(), data.size(), 0).result().ok());
  auto s = e->sync(*f).result();
  EXPECT_TRUE(s.ok()) << s.status().to_string();
}

TEST_P(IoEngineKinds, ManyConcurrentRequestsThenDrain) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto e = make_engine(GetParam(), 16384, 4);
  ASSERT_NE(e, nullptr);
  auto f = e->open(dir.path() + "/many", OpenMode::kTruncate);
  ASSERT_TRUE(f.ok());
  const uint64_t chunk = 50000, n = 64;
  auto data = pattern(chunk * n, 5);
  std::vector<Future<uint64_t>> fs;
  for (uint64_t i = 0; i < n; ++i) fs.push_back(e->write(*f, data.data() + i * chunk, chunk, i * chunk));
  e->drain();
  for (auto& fu : fs) {
    EXPECT_TRUE(fu.ready());
    ASSERT_TRUE(fu.result().ok());
    EXPECT_EQ(*fu.result(), chunk);
  }
  std::vector<char> back(chunk * n);
  ASSERT_TRUE(e->read(*f, back.data(), back.size(), 0).result().ok());
  EXPECT_EQ(back, data);
}

INSTANTIATE_TEST_SUITE_P(Engines, IoEngineKinds,
                         ::testing::Values(EngineKind::kUring, EngineKind::kThreads),
                         [](const auto& info) { return std::string(engine_kind_name(info.param)); });

// Striped over 1, 2 and 3 directories, both engines, odd sizes and offsets.
class StripedRoundTrip : public ::testing::TestWithParam<std::tuple<EngineKind, int>> {};

TEST_P(StripedRoundTrip, OddSizesRoundTripAndLayoutMatchesFormula) {
  auto [kind, ndirs] = GetParam();
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  std::vector<std::string> dirs;
  for (int i = 0; i < ndirs; ++i) dirs.push_back(dir.sub("d" + std::to_string(i)));
  auto e = make_engine(kind, 32768, 16);
  ASSERT_NE(e, nullptr);
  const uint64_t unit = 65536;
  auto sf = StripedFile::open(e, dirs, "x", OpenMode::kTruncate, unit);
  ASSERT_TRUE(sf.ok()) << sf.status().to_string();
  EXPECT_EQ((*sf)->stripe_unit(), unit);
  ASSERT_EQ((*sf)->files().size(), static_cast<size_t>(ndirs));
  const uint64_t total = 1000003;
  auto data = pattern(total, 11 + ndirs);
  auto w = (*sf)->write(data.data(), total, 0).result();
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(*w, total);
  // Odd sub-ranges read back exactly.
  for (auto [off, len] : std::vector<std::pair<uint64_t, uint64_t>>{
           {0, total}, {1, 1}, {65535, 2}, {65536 * 2 - 3, 65536 * 3 + 7}, {4097, 300001}}) {
    std::vector<char> back(len);
    auto r = (*sf)->read(back.data(), len, off).result();
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(*r, len);
    EXPECT_EQ(0, std::memcmp(back.data(), data.data() + off, len)) << "off " << off;
  }
  // Layout: logical byte x is in file (x/u)%k at (x/u/k)*u + x%u.
  for (uint64_t x : {uint64_t{0}, uint64_t{65536}, uint64_t{200000}, total - 1}) {
    const uint64_t u = x / unit;
    const auto& f = (*sf)->files()[u % ndirs];
    char c = 0;
    auto r = e->read(f, &c, 1, (u / ndirs) * unit + x % unit).result();
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(c, data[x]) << "x " << x;
  }
  ASSERT_TRUE((*sf)->sync().result().ok());
}

INSTANTIATE_TEST_SUITE_P(
    Engines, StripedRoundTrip,
    ::testing::Combine(::testing::Values(EngineKind::kUring, EngineKind::kThreads),
                       ::testing::Values(1, 2, 3)),
    [](const auto& info) {
      return std::string(engine_kind_name(std::get<0>(info.param))) + "_" +
             std::to_string(std::get<1>(info.param)) + "dirs";
    });

TEST(StripedFile, RejectsBadArguments) {
  auto e = make_engine(EngineKind::kThreads);
  ASSERT_NE(e, nullptr);
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  EXPECT_EQ(StripedFile::open(e, {}, "x", OpenMode::kTruncate).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(StripedFile::open(e, {dir.path()}, "x", OpenMode::kTruncate, 0).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(StripedFile::open(e, {dir.path()}, "x", OpenMode::kTruncate, 5000).status().code(),
            StatusCode::kInvalidArgument);
  auto missing = StripedFile::open(e, {dir.path(), dir.path() + "/nope"}, "x", OpenMode::kTruncate);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(dir.path() + "/nope"), std::string::npos);
  // One directory twice (here spelled with a trailing "/."): two stripes in one file.
  auto twice = StripedFile::open(e, {dir.path(), dir.path() + "/."}, "x", OpenMode::kTruncate);
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(twice.status().message(),
            "StripedFile::open('x'): directory #1 '" + dir.path() +
                "' and StripedFile::open('x'): directory #2 '" + dir.path() +
                "/.' are the same directory (" +
                std::filesystem::weakly_canonical(dir.path()).string() +
                "): each directory may be listed once");
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// Every submit_batch setting and registered/unregistered buffers give the same bytes.
TEST(IoUringOptions, SubmitBatchAndBufferRegistrationRoundTrip) {
  testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  const uint64_t n = (3 << 20) + 4097;
  auto data = testing::pattern(n, 99);
  for (uint32_t batch : {0u, 1u, 4u, 64u}) {
    for (bool reg : {true, false}) {
      SCOPED_TRACE("submit_batch " + std::to_string(batch) + " register_buffers " +
                   std::to_string(reg));
      IoEngineOptions o;
      o.submit_batch = batch;
      o.register_buffers = reg;
      o.block_size = 256 * 1024;
      o.queue_depth = 16;
      o.allow_threads_fallback = false;
      auto e = IoEngine::create(o);
      ASSERT_TRUE(e.ok()) << e.status().to_string();
      testing::AlignedBuf mem(2 * n + 8192);
      ASSERT_TRUE((*e)->register_buffer(mem.data(), 2 * n + 8192).ok());
      std::memcpy(mem.data(), data.data(), n);
      auto f = (*e)->open(dir.path() + "/b", OpenMode::kTruncate);
      ASSERT_TRUE(f.ok());
      ASSERT_TRUE((*e)->write(*f, mem.data(), n, 4096).result().ok());
      char* back = mem.data() + n + 4096;
      auto r = (*e)->read(*f, back, n, 4096).result();
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      EXPECT_EQ(std::memcmp(back, data.data(), n), 0);
      ASSERT_TRUE((*e)->unregister_buffer(mem.data()).ok());
    }
  }
}

}  // namespace
}  // namespace strata
