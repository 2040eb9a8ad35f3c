// Fuzz targets' scratch directory: one per process, removed at exit.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

#include "fuzz_check.hpp"

namespace strata::fuzz {

/// The process's scratch directory, created on the first call under `parent` (the first
/// call's), else $TMPDIR, else /var/tmp (a disk: the store's O_DIRECT I/O works there).
inline const std::string& scratch_dir(const char* parent = nullptr) {
  static const std::string dir = [parent] {
    const char* base = parent ? parent : std::getenv("TMPDIR");
    std::string t = std::string(base && *base ? base : "/var/tmp") + "/strata-fuzz-XXXXXX";
    FUZZ_CHECK(::mkdtemp(t.data()) != nullptr, "mkdtemp %s", t.c_str());
    static std::string removed_at_exit;
    removed_at_exit = t;
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(removed_at_exit, ec);
    });
    return t;
  }();
  return dir;
}

}  // namespace strata::fuzz
