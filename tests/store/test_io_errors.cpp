// Error cases and fallbacks of the I/O engines: missing directory, read-only files and
// filesystems, a full filesystem, O_DIRECT refused (buffered fallback), io_uring_setup
// refused by seccomp (thread-pool fallback), options from the environment, fd stability.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include <cstddef>
#include <cstring>

#include "store/test_io_util.hpp"
#include "strata/store/io_engine.hpp"

namespace strata {
namespace {

using testing::AlignedBuf;
using testing::open_fd_count;
using testing::pattern;
using testing::MountedDir;
using testing::TempDir;

std::shared_ptr<IoEngine> make_engine(EngineKind kind, bool direct = true,
                                      bool buffered_fallback = true) {
  IoEngineOptions o = testing::engine_options(kind, 256 * 1024);
  o.direct = direct;
  o.allow_buffered_fallback = buffered_fallback;
  return testing::make_engine(o);
}

/// Opening `path` (kTruncate) fails with `code` carrying errno `err`.
void expect_open_error(IoEngine& e, const std::string& path, StatusCode code, int err) {
  auto f = e.open(path, OpenMode::kTruncate);
  ASSERT_FALSE(f.ok()) << path;
  EXPECT_EQ(f.status().code(), code) << f.status().to_string();
  EXPECT_EQ(f.status().sys_errno(), err) << f.status().to_string();
}

class IoErrors : public ::testing::TestWithParam<EngineKind> {};

TEST_P(IoErrors, MissingDirectoryIsNotFoundNamingThePath) {
  TempDir dir;
  auto e = make_engine(GetParam());
  ASSERT_NE(e, nullptr);
  const std::string path = dir.path() + "/no_such_dir/file";
  for (OpenMode m : {OpenMode::kRead, OpenMode::kReadWrite, OpenMode::kTruncate}) {
    auto f = e->open(path, m);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), StatusCode::kNotFound);
    EXPECT_EQ(f.status().sys_errno(), ENOENT);
    EXPECT_NE(f.status().message().find(path), std::string::npos) << f.status().to_string();
  }
}

TEST_P(IoErrors, WriteToReadOnlyFileIsPermissionDeniedAndDataIntact) {
  TempDir dir;
  auto e = make_engine(GetParam());
  ASSERT_NE(e, nullptr);
  const std::string path = dir.path() + "/ro";
  auto data = pattern(9000, 21);
  {
    auto f = e->open(path, OpenMode::kTruncate);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(e->write_async(*f, data.data(), data.size(), 0).result().ok());
  }
  auto f = e->open(path, OpenMode::kRead);
  ASSERT_TRUE(f.ok());
  auto other = pattern(9000, 22);
  auto w = e->write_async(*f, other.data(), other.size(), 0).result();
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(w.status().message().find(path), std::string::npos) << w.status().to_string();
  std::vector<char> back(data.size());
  ASSERT_TRUE(e->read_async(*f, back.data(), back.size(), 0).result().ok());
  EXPECT_EQ(back, data);
}

TEST_P(IoErrors, OpeningADirectoryAsAFileFails) {
  TempDir dir;
  auto e = make_engine(GetParam());
  ASSERT_NE(e, nullptr);
  auto f = e->open(dir.path(), OpenMode::kReadWrite);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().sys_errno(), EISDIR);
  EXPECT_NE(f.status().message().find(dir.path()), std::string::npos);
}

// A read-only mount refuses creation even for root: EROFS -> PermissionDenied.
TEST_P(IoErrors, ReadOnlyFilesystemIsPermissionDenied) {
  MountedDir dir("tmpfs", MS_RDONLY, "size=1m");
  if (!dir.ok()) GTEST_SKIP() << dir.why();
  auto e = make_engine(GetParam());
  ASSERT_NE(e, nullptr);
  expect_open_error(*e, dir.path() + "/x", StatusCode::kPermissionDenied, EROFS);
}

// A 1 MiB tmpfs fills up: ResourceExhausted naming path, offset and errno; earlier data stays.
TEST_P(IoErrors, FullFilesystemIsResourceExhaustedAndEarlierDataIntact) {
  MountedDir dir("tmpfs", 0, "size=1m");
  if (!dir.ok()) GTEST_SKIP() << dir.why();
  auto e = make_engine(GetParam());
  ASSERT_NE(e, nullptr);
  const std::string path = dir.path() + "/full";
  auto f = e->open(path, OpenMode::kTruncate);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  auto first = pattern(300001, 31);
  ASSERT_TRUE(e->write_async(*f, first.data(), first.size(), 0).result().ok());
  auto big = pattern(4 << 20, 32);
  auto w = e->write_async(*f, big.data(), big.size(), first.size()).result();
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kResourceExhausted) << w.status().to_string();
  EXPECT_EQ(w.status().sys_errno(), ENOSPC);
  EXPECT_NE(w.status().message().find(path), std::string::npos);
  EXPECT_NE(w.status().message().find("offset"), std::string::npos);
  std::vector<char> back(first.size());
  auto r = e->read_async(*f, back.data(), back.size(), 0).result();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(back, first);
}

// O_DIRECT refused (ramfs): buffered I/O with one warning, or InvalidArgument when the
// fallback is off.
TEST_P(IoErrors, BufferedFallbackWhereODirectIsRefused) {
  MountedDir dir("ramfs", 0, nullptr);
  if (!dir.ok()) GTEST_SKIP() << dir.why();
  {
    int fd = ::open((dir.path() + "/probe").c_str(), O_CREAT | O_RDWR | O_DIRECT, 0644);
    if (fd >= 0) {
      ::close(fd);
      GTEST_SKIP() << "this kernel's ramfs accepts O_DIRECT";
    }
  }
  auto e = make_engine(GetParam());
  ASSERT_NE(e, nullptr);
  auto f = e->open(dir.path() + "/buffered", OpenMode::kTruncate);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_FALSE((*f)->direct());
  for (uint64_t size : {uint64_t{1}, uint64_t{4095}, uint64_t{4097}, uint64_t{1000003}}) {
    auto data = pattern(size, size);
    ASSERT_TRUE(e->write_async(*f, data.data(), size, 3).result().ok());
    std::vector<char> back(size);
    auto r = e->read_async(*f, back.data(), size, 3).result();
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(back, data);
  }
  auto strict = make_engine(GetParam(), true, /*buffered_fallback=*/false);
  ASSERT_NE(strict, nullptr);
  expect_open_error(*strict, dir.path() + "/strict", StatusCode::kInvalidArgument, EINVAL);
}

// Buffered I/O selected by option (direct=false), on /dev/shm (tmpfs).
TEST_P(IoErrors, BufferedByOptionOnDevShm) {
  TempDir dir("/dev/shm", std::nothrow);
  if (!dir.ok()) GTEST_SKIP() << "/dev/shm not writable";
  auto e = make_engine(GetParam(), /*direct=*/false);
  ASSERT_NE(e, nullptr);
  auto f = e->open(dir.path() + "/b", OpenMode::kTruncate);
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE((*f)->direct());
  auto data = pattern(28824000, 41);
  ASSERT_TRUE(e->write_async(*f, data.data(), data.size(), 4097).result().ok());
  std::vector<char> back(data.size());
  ASSERT_TRUE(e->read_async(*f, back.data(), back.size(), 4097).result().ok());
  EXPECT_EQ(back, data);
}

TEST_P(IoErrors, FdCountStableOverManyEngineCycles) {
  TempDir dir;
  const int before = open_fd_count();
  AlignedBuf region(1 << 20);
  auto data = pattern(12345, 51);
  for (int i = 0; i < 200; ++i) {
    auto e = make_engine(GetParam());
    ASSERT_NE(e, nullptr);
    ASSERT_TRUE(e->register_buffer(region.data(), 1 << 20).ok());
    auto f = e->open(dir.path() + "/cycle", OpenMode::kTruncate);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(e->write_async(*f, data.data(), data.size(), i).result().ok());
    auto missing = e->open(dir.path() + "/missing/x", OpenMode::kRead);
    ASSERT_FALSE(missing.ok());
    if (i % 2) {
      ASSERT_TRUE(e->unregister_buffer(region.data()).ok());
    }
    // Half the time the file outlives the engine.
    if (i % 3 == 0) {
      e.reset();
      f = Status(StatusCode::kCancelled, "dropped");
    }
  }
  EXPECT_EQ(open_fd_count(), before);
}

INSTANTIATE_TEST_SUITE_P(Engines, IoErrors,
                         ::testing::Values(EngineKind::kUring, EngineKind::kThreads),
                         [](const auto& info) { return std::string(engine_kind_name(info.param)); });

// io_uring_setup refused by a seccomp filter (as in a locked-down container): the uring
// engine falls back to the thread pool, or is Unavailable without the fallback. Runs in a
// forked child because a seccomp filter cannot be removed.
TEST(IoFallback, ThreadsEngineWhenIoUringSetupFails) {
  TempDir dir;
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {static_cast<unsigned short>(sizeof filter / sizeof filter[0]),
                              filter};
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) ::_exit(10);
    if (::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) ::_exit(11);
    IoEngineOptions o;
    o.kind = EngineKind::kUring;
    o.allow_threads_fallback = false;
    auto strict = IoEngine::create(o);
    if (strict.ok() || strict.status().code() != StatusCode::kUnavailable) ::_exit(12);
    o.allow_threads_fallback = true;
    auto e = IoEngine::create(o);
    if (!e.ok()) ::_exit(13);
    if ((*e)->kind() != EngineKind::kThreads) ::_exit(14);
    auto f = (*e)->open(dir.path() + "/fb", OpenMode::kTruncate);
    if (!f.ok()) ::_exit(15);
    auto data = pattern(100003, 61);
    if (!(*e)->write_async(*f, data.data(), data.size(), 7).result().ok()) ::_exit(16);
    std::vector<char> back(data.size());
    if (!(*e)->read_async(*f, back.data(), back.size(), 7).result().ok()) ::_exit(17);
    ::_exit(back == data ? 0 : 18);
  }
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st));
  if (WEXITSTATUS(st) == 10 || WEXITSTATUS(st) == 11) GTEST_SKIP() << "seccomp unavailable";
  EXPECT_EQ(WEXITSTATUS(st), 0) << "child failed at step " << WEXITSTATUS(st);
}

TEST(IoOptions, FromEnvParsesAndRejectsMalformedValues) {
  ::setenv("STRATA_IO_ENGINE", "threads", 1);
  ::setenv("STRATA_QUEUE_DEPTH", "7", 1);
  ::setenv("STRATA_BLOCK_SIZE", "128KiB", 1);
  ::setenv("STRATA_IO_WORKERS", "2", 1);
  ::setenv("STRATA_DIRECT", "off", 1);
  auto o = IoEngineOptions::from_env();
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  EXPECT_EQ(o->kind, EngineKind::kThreads);
  EXPECT_EQ(o->queue_depth, 7u);
  EXPECT_EQ(o->block_size, 128u * 1024);
  EXPECT_EQ(o->workers, 2u);
  EXPECT_FALSE(o->direct);
  ::setenv("STRATA_IO_ENGINE", "spdk", 1);
  auto bad = IoEngineOptions::from_env();
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("STRATA_IO_ENGINE"), std::string::npos);
  ::setenv("STRATA_IO_ENGINE", "uring", 1);
  ::setenv("STRATA_QUEUE_DEPTH", "0", 1);
  EXPECT_EQ(IoEngineOptions::from_env().status().code(), StatusCode::kInvalidArgument);
  for (const char* v : {"STRATA_IO_ENGINE", "STRATA_QUEUE_DEPTH", "STRATA_BLOCK_SIZE",
                        "STRATA_IO_WORKERS", "STRATA_DIRECT"}) {
    ::unsetenv(v);
  }
  auto d = IoEngineOptions::from_env();
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->kind, EngineKind::kUring);
  EXPECT_EQ(d->queue_depth, 32u);
  EXPECT_TRUE(d->direct);
}

TEST(IoOptions, CreateRejectsInvalidOptions) {
  IoEngineOptions o;
  o.queue_depth = 0;
  EXPECT_EQ(IoEngine::create(o).status().code(), StatusCode::kInvalidArgument);
  o = IoEngineOptions();
  o.block_size = 0;
  EXPECT_EQ(IoEngine::create(o).status().code(), StatusCode::kInvalidArgument);
  o = IoEngineOptions();
  o.workers = 0;
  EXPECT_EQ(IoEngine::create(o).status().code(), StatusCode::kInvalidArgument);
}

// Several uring workers (one ring each) and opt-in SQPOLL produce the same bytes.
TEST(IoUring, MultipleWorkersAndSqpollRoundTrip) {
  TempDir dir;
  for (bool sqpoll : {false, true}) {
    IoEngineOptions o;
    o.workers = 3;
    o.sqpoll = sqpoll;
    o.block_size = 65536;
    o.allow_threads_fallback = false;
    auto e = IoEngine::create(o);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    AlignedBuf region(8 << 20);
    ASSERT_TRUE((*e)->register_buffer(region.data(), 8 << 20).ok());
    auto f = (*e)->open(dir.path() + "/w", OpenMode::kTruncate);
    ASSERT_TRUE(f.ok());
    auto data = pattern(4 << 20, sqpoll ? 71 : 72);
    std::memcpy(region.data(), data.data(), data.size());
    std::vector<Future<uint64_t>> fs;
    for (int i = 0; i < 8; ++i) {
      fs.push_back((*e)->write_async(*f, region.data() + i * (512 << 10), 512 << 10, i * (512 << 10)));
    }
    for (auto& fu : fs) ASSERT_TRUE(fu.result().ok()) << fu.result().status().to_string();
    auto r = (*e)->read_async(*f, region.data() + (4 << 20), 4 << 20, 0).result();
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(std::memcmp(region.data() + (4 << 20), data.data(), 4 << 20), 0);
  }
}

}  // namespace
}  // namespace strata
