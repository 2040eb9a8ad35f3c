// TempDir: the temporary directory of a test (every test executable, and the helper
// processes the tests start), removed with everything in it when the test is done.
#pragma once

#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <new>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace strata::testing {

/// A fresh directory PARENT/strata-test-XXXXXX (mkdtemp), removed recursively on
/// destruction. The default parent is $TMPDIR, or /var/tmp when that is unset or empty (a
/// real disk here, so O_DIRECT works; /dev/shm, say, is tmpfs).
/// \threadsafety one object per thread; distinct objects never share a directory.
class TempDir {
 public:
  /// The default parent: $TMPDIR, else /var/tmp.
  static std::string default_parent() {
    const char* base = std::getenv("TMPDIR");
    return base && *base ? base : "/var/tmp";
  }

  /// Creates the directory under `parent`.
  /// \throws std::runtime_error naming `parent` and errno when mkdtemp fails (a test then
  ///     fails with that message: GoogleTest reports exceptions thrown in a test).
  explicit TempDir(const std::string& parent = default_parent()) {
    if (!create(parent)) {
      throw std::runtime_error("TempDir: mkdtemp under '" + parent +
                               "' failed: " + std::strerror(errno));
    }
  }
  /// As above, but a failure leaves ok() false instead of throwing (for a test that skips
  /// when `parent` is not writable).
  TempDir(const std::string& parent, std::nothrow_t) { create(parent); }

  ~TempDir() {
    if (path_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  /// True when the directory exists (always, unless made with std::nothrow and it failed).
  bool ok() const { return !path_.empty(); }
  /// The directory, PARENT/strata-test-XXXXXX ("" when !ok()).
  const std::string& path() const { return path_; }
  /// path() + "/" + name; creates nothing.
  std::string sub(const std::string& name) const { return path_ + "/" + name; }
  /// sub(name), created (with missing parents) when absent.
  /// \throws std::filesystem::filesystem_error when it cannot be created.
  std::string make_sub(const std::string& name) const {
    std::string p = sub(name);
    std::filesystem::create_directories(p);
    return p;
  }

 private:
  bool create(const std::string& parent) {
    std::string tmpl = parent + "/strata-test-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) == nullptr) return false;
    path_ = buf.data();
    return true;
  }

  std::string path_;
};

}  // namespace strata::testing
