// The data file's space: the warm reserve keeps the file's tail -- growth slack, or the
// copy-on-write original freed at the end of the file -- allocated for the next puts
// instead of punching a hole there at every commit.
#include <fcntl.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <filesystem>

#include "test_store_util.hpp"

namespace strata::store_test {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t kMiB = 1ull << 20;

/// The one data file of a store with one NVMe directory.
std::string data_file_of(const std::string& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".data") return e.path().string();
  }
  return "";
}

/// Bytes of `path` that the file system holds allocated (written or unwritten extents,
/// FIEMAP); -1 when the file system cannot tell (no FIEMAP, e.g. tmpfs).
int64_t allocated_bytes(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  constexpr uint32_t kMax = 256;
  std::vector<uint8_t> mem(sizeof(fiemap) + kMax * sizeof(fiemap_extent));
  auto* fm = reinterpret_cast<fiemap*>(mem.data());
  fm->fm_start = 0;
  fm->fm_length = FIEMAP_MAX_OFFSET;
  fm->fm_flags = FIEMAP_FLAG_SYNC;
  fm->fm_extent_count = kMax;
  const int rc = ::ioctl(fd, FS_IOC_FIEMAP, fm);
  ::close(fd);
  if (rc != 0 || fm->fm_mapped_extents == kMax) return -1;
  int64_t total = 0;
  for (uint32_t i = 0; i < fm->fm_mapped_extents; ++i) {
    total += static_cast<int64_t>(fm->fm_extents[i].fe_length);
  }
  return total;
}

TEST(StoreSpace, RewritesKeepBothVersionsAllocated) {
  TempDir d;
  const uint64_t n = 4 * kMiB;  // 4 chunks of small_options' 1 MiB
  auto s = open_or_die(small_options(d.sub("s")));
  ASSERT_TRUE(s);
  ASSERT_OK(s->put("a", pattern(n, 1).data(), TensorDesc::bytes(n)));
  const std::string f = data_file_of(d.sub("s"));
  ASSERT_FALSE(f.empty());
  if (allocated_bytes(f) < 0) GTEST_SKIP() << "no FIEMAP on " << f;
  EXPECT_EQ(allocated_bytes(f), static_cast<int64_t>(n));
  // Each rewrite writes the free half (the first one grows the file to 8 MiB) and frees the
  // other: the file stays 8 MiB, all of it allocated. (Before, the original freed at the
  // file's end was punched at every other commit, and the next rewrite wrote into a hole.)
  for (uint64_t i = 2; i < 8; ++i) {
    auto v = pattern(n, i);
    ASSERT_OK(s->put("a", v.data(), TensorDesc::bytes(n), {Tier::kNvme, true}));
    EXPECT_EQ(allocated_bytes(f), static_cast<int64_t>(2 * n)) << "rewrite " << i;
    EXPECT_EQ(fs::file_size(f), 2 * n) << "rewrite " << i;
    std::vector<uint8_t> back(n);
    ASSERT_OK(s->get_bytes("a", back.data(), n));
    EXPECT_EQ(back, v) << "rewrite " << i;
  }
  // Close gives the reserve back: the file holds what its one object takes.
  ASSERT_OK(s->close());
  EXPECT_EQ(allocated_bytes(f), static_cast<int64_t>(n));
  auto r = open_or_die(small_options(d.sub("s")));
  ASSERT_TRUE(r);
  std::vector<uint8_t> back(n);
  ASSERT_OK(r->get_bytes("a", back.data(), n));
  EXPECT_EQ(back, pattern(n, 7));
}

TEST(StoreSpace, GrowthSlackStaysAllocatedForTheNextPut) {
  TempDir d;
  auto s = open_or_die(small_options(d.sub("s")));
  ASSERT_TRUE(s);
  ASSERT_OK(s->put("a", pattern(4 * kMiB, 1).data(), TensorDesc::bytes(4 * kMiB)));
  const std::string f = data_file_of(d.sub("s"));
  ASSERT_FALSE(f.empty());
  if (allocated_bytes(f) < 0) GTEST_SKIP() << "no FIEMAP on " << f;
  // "b" (1 MiB at 4 MiB) grows the file by its size, 4 MiB, to 8 MiB: the 3 MiB past b stay
  // allocated after the commit (they were punched before).
  ASSERT_OK(s->put("b", pattern(kMiB, 2).data(), TensorDesc::bytes(kMiB)));
  EXPECT_EQ(fs::file_size(f), 8 * kMiB);
  EXPECT_EQ(allocated_bytes(f), static_cast<int64_t>(8 * kMiB));
  // "c" (3 MiB) lands there: no growth.
  auto c = pattern(3 * kMiB, 3);
  ASSERT_OK(s->put("c", c.data(), TensorDesc::bytes(3 * kMiB)));
  EXPECT_EQ(fs::file_size(f), 8 * kMiB);
  EXPECT_EQ(allocated_bytes(f), static_cast<int64_t>(8 * kMiB));
  std::vector<uint8_t> back(3 * kMiB);
  ASSERT_OK(s->get_bytes("c", back.data(), back.size()));
  EXPECT_EQ(back, c);
  // Close gives the slack back only where nothing lives: all 8 MiB hold objects now.
  ASSERT_OK(s->close());
  EXPECT_EQ(allocated_bytes(f), static_cast<int64_t>(8 * kMiB));
}

}  // namespace
}  // namespace strata::store_test
