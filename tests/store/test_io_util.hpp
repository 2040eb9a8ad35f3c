// Helpers for the I/O engine tests: temporary directories and deterministic byte patterns.
#pragma once

#include <dirent.h>
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

/// A fresh directory under `parent` (default /tmp, a real disk here), removed on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& parent = "/tmp") {
    std::string tmpl = parent + "/strata_io_test_XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) != nullptr) path_ = buf.data();
  }
  ~TempDir() {
    if (!path_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(path_, ec);
    }
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  bool ok() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  std::string sub(const std::string& name) const {
    std::string p = path_ + "/" + name;
    ::mkdir(p.c_str(), 0755);
    return p;
  }

 private:
  std::string path_;
};

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
