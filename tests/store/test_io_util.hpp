// Helpers for the I/O engine tests: temporary directories, mounts, deterministic byte
// patterns, aligned buffers.
#pragma once

#include <dirent.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "common/temp_dir.hpp"
#include "strata/base/status.hpp"
#include "strata/store/io_engine.hpp"

namespace strata::testing {

/// A filesystem mounted on an existing directory for the test's lifetime (needs CAP_SYS_ADMIN).
class ScopedMount {
 public:
  ScopedMount(const std::string& where, const char* fstype, unsigned long flags, const char* data)
      : where_(where) {
    ok_ = ::mount(fstype, where.c_str(), fstype, flags, data) == 0;
    err_ = ok_ ? 0 : errno;
  }
  ~ScopedMount() {
    if (ok_) ::umount2(where_.c_str(), MNT_DETACH);
  }
  bool ok() const { return ok_; }
  std::string why() const { return std::string("mount failed: ") + std::strerror(err_); }

 private:
  std::string where_;
  bool ok_ = false;
  int err_ = 0;
};

/// A file system (mount(2): `fstype`, `flags`, `data`) mounted on TempDir().sub(name) for
/// the test's lifetime, then unmounted and removed. Mounting needs CAP_SYS_ADMIN: a test
/// skips when !ok().
class MountedDir {
 public:
  MountedDir(const char* fstype, unsigned long flags, const char* data,
             const std::string& name = "mnt")
      : path_(dir_.make_sub(name)),
        mount_(path_, fstype, flags, data),
        what_(std::string(fstype) + (data != nullptr ? std::string(" ") + data : "")) {}
  bool ok() const { return mount_.ok(); }
  /// Why the mount failed, e.g. "mount failed: Operation not permitted (tmpfs size=1m needs
  /// CAP_SYS_ADMIN)".
  std::string why() const { return mount_.why() + " (" + what_ + " needs CAP_SYS_ADMIN)"; }
  /// The mount point.
  const std::string& path() const { return path_; }
  /// The temporary directory that holds the mount point (room for other directories).
  const TempDir& parent() const { return dir_; }

 private:
  TempDir dir_;
  std::string path_;
  ScopedMount mount_;
  std::string what_;
};

/// The value of `r`, or nullptr after a test failure (EXPECT) naming r's status.
template <class T>
std::shared_ptr<T> value_or_null(Result<std::shared_ptr<T>> r) {
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? std::move(r).value() : nullptr;
}

/// Options of an engine of exactly `kind` (allow_threads_fallback off): `block_size` bytes
/// per request, `queue_depth` requests in flight, the other fields at their defaults.
inline IoEngineOptions engine_options(EngineKind kind, uint64_t block_size = 1 << 20,
                                      uint32_t queue_depth = 8) {
  IoEngineOptions o;
  o.kind = kind;
  o.block_size = block_size;
  o.queue_depth = queue_depth;
  o.allow_threads_fallback = false;
  return o;
}

/// The engine IoEngine::create(o) makes, or nullptr after a test failure naming why.
inline std::shared_ptr<IoEngine> make_engine(const IoEngineOptions& o) {
  return value_or_null(IoEngine::create(o));
}

/// make_engine(engine_options(kind, block_size, queue_depth)).
inline std::shared_ptr<IoEngine> make_engine(EngineKind kind, uint64_t block_size = 1 << 20,
                                             uint32_t queue_depth = 8) {
  return make_engine(engine_options(kind, block_size, queue_depth));
}

/// Bytes i of the pattern for `seed`: a xorshift stream, so shifted copies never match.
inline std::vector<char> pattern(uint64_t n, uint64_t seed) {
  std::vector<char> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (uint64_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v[i] = static_cast<char>(x >> 24);
  }
  return v;
}

/// Number of open file descriptors of this process.
inline int open_fd_count() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d) != nullptr) ++n;
    ::closedir(d);
  }
  return n - 3;  // ".", ".." and the descriptor of the listing itself
}

/// An aligned heap buffer (posix_memalign), freed on destruction.
class AlignedBuf {
 public:
  AlignedBuf(uint64_t n, uint64_t align = 4096) {
    void* p = nullptr;
    if (::posix_memalign(&p, align, n ? n : 1) == 0) p_ = static_cast<char*>(p);
  }
  ~AlignedBuf() { std::free(p_); }
  AlignedBuf(const AlignedBuf&) = delete;
  AlignedBuf& operator=(const AlignedBuf&) = delete;
  char* data() const { return p_; }

 private:
  char* p_ = nullptr;
};

}  // namespace strata::testing
