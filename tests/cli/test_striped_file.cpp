// cli::StripedFile, the benchmarks' striped baseline file: round trips over 1, 2 and 3
// directories with both engines, odd sizes and offsets, the stripe layout, bad arguments.
#include "striped_file.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <tuple>

#include "store/test_io_util.hpp"
#include "strata/store/io_engine.hpp"

namespace strata::cli {
namespace {

using strata::testing::make_engine;
using strata::testing::pattern;
using strata::testing::TempDir;

// Striped over 1, 2 and 3 directories, both engines, odd sizes and offsets.
class StripedRoundTrip : public ::testing::TestWithParam<std::tuple<EngineKind, int>> {};

TEST_P(StripedRoundTrip, OddSizesRoundTripAndLayoutMatchesFormula) {
  auto [kind, ndirs] = GetParam();
  TempDir dir;
  std::vector<std::string> dirs;
  for (int i = 0; i < ndirs; ++i) dirs.push_back(dir.make_sub("d" + std::to_string(i)));
  auto e = make_engine(kind, 32768, 16);
  ASSERT_NE(e, nullptr);
  const uint64_t unit = 65536;
  auto sf = StripedFile::open(e, dirs, "x", OpenMode::kTruncate, unit);
  ASSERT_TRUE(sf.ok()) << sf.status().to_string();
  EXPECT_EQ((*sf)->stripe_unit(), unit);
  ASSERT_EQ((*sf)->files().size(), static_cast<size_t>(ndirs));
  const uint64_t total = 1000003;
  auto data = pattern(total, 11 + ndirs);
  auto w = (*sf)->write_async(data.data(), total, 0).result();
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(*w, total);
  // Odd sub-ranges read back exactly.
  for (auto [off, len] : std::vector<std::pair<uint64_t, uint64_t>>{
           {0, total}, {1, 1}, {65535, 2}, {65536 * 2 - 3, 65536 * 3 + 7}, {4097, 300001}}) {
    std::vector<char> back(len);
    auto r = (*sf)->read_async(back.data(), len, off).result();
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(*r, len);
    EXPECT_EQ(0, std::memcmp(back.data(), data.data() + off, len)) << "off " << off;
  }
  // Layout: logical byte x is in file (x/u)%k at (x/u/k)*u + x%u.
  for (uint64_t x : {uint64_t{0}, uint64_t{65536}, uint64_t{200000}, total - 1}) {
    const uint64_t u = x / unit;
    const auto& f = (*sf)->files()[u % ndirs];
    char c = 0;
    auto r = e->read_async(f, &c, 1, (u / ndirs) * unit + x % unit).result();
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(c, data[x]) << "x " << x;
  }
  ASSERT_TRUE((*sf)->sync_async().result().ok());
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
}  // namespace strata::cli
