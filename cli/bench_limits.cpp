#include "bench_limits.hpp"

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "strata/base/units.hpp"
#include "strata/store/io_engine.hpp"

namespace strata::cli {

namespace {

std::string bytes_text(uint64_t n) {
  return std::to_string(n) + " bytes (" + format_bytes(n) + ")";
}

}  // namespace

Result<uint64_t> available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream ls(line.substr(13));
    uint64_t kib = 0;
    std::string unit;
    if (ls >> kib >> unit && unit == "kB") return kib * 1024;
  }
  const long pages = ::sysconf(_SC_AVPHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages < 0 || page <= 0) {
    return unavailable("cannot tell the available memory: no MemAvailable in /proc/meminfo "
                       "and sysconf(_SC_AVPHYS_PAGES) failed");
  }
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
}

Status check_memory(uint64_t need_bytes, const std::string& what) {
  STRATA_ASSIGN_OR_RETURN(uint64_t avail, available_memory_bytes());
  if (need_bytes <= avail) return Status::OK();
  return resource_exhausted(what + " needs " + bytes_text(need_bytes) +
                            " of memory, but only " + bytes_text(avail) +
                            " are available (MemAvailable)");
}

Status check_free_space(const std::vector<DiskNeed>& needs, const std::string& what) {
  struct Fs {
    dev_t dev;
    uint64_t avail = 0, need = 0;
    std::string names;
  };
  std::vector<Fs> fss;
  for (const auto& n : needs) {
    // A directory the run will create: the file system of its nearest existing ancestor.
    std::string at = n.path;
    struct stat st;
    while (::stat(at.c_str(), &st) != 0) {
      const int err = errno;
      const std::string parent = std::filesystem::path(at).parent_path().string();
      if (err != ENOENT || parent.empty() || parent == at) {
        return errno_status(err, "stat of " + n.option + " '" + n.path + "'");
      }
      at = parent;
    }
    struct statvfs vfs;
    if (::statvfs(at.c_str(), &vfs) != 0) {
      return errno_status(errno, "statvfs of " + n.option + " '" + n.path + "'");
    }
    Fs* fs = nullptr;
    for (auto& f : fss) {
      if (f.dev == st.st_dev) fs = &f;
    }
    if (fs == nullptr) {
      fss.push_back({st.st_dev, static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize, 0, ""});
      fs = &fss.back();
    }
    fs->need = fs->need + n.bytes < fs->need ? UINT64_MAX : fs->need + n.bytes;
    fs->names += (fs->names.empty() ? "" : " and ") + n.option + " '" + n.path + "'";
  }
  for (const auto& f : fss) {
    if (f.need > f.avail) {
      return resource_exhausted(what + " needs " + bytes_text(f.need) + " on the file system of " +
                                f.names + ", which has " + bytes_text(f.avail) + " available",
                                ENOSPC);
    }
  }
  return Status::OK();
}

Status check_distinct_dirs(const std::vector<std::string>& paths, const std::string& option) {
  return check_distinct_directories(
      paths, [&](size_t i) { return option + " #" + std::to_string(i + 1); });
}

Status check_nonempty_paths(const std::vector<std::string>& paths, const std::string& option) {
  for (size_t i = 0; i < paths.size(); ++i) {
    if (paths[i].empty()) {
      return invalid_argument(option + " must name a directory, got an empty string (" + option +
                              " #" + std::to_string(i + 1) + ")");
    }
  }
  return Status::OK();
}

RemoveDirsOnExit::~RemoveDirsOnExit() {
  if (keep) return;
  for (const auto& d : dirs) {
    std::error_code ec;
    std::filesystem::remove_all(d, ec);
  }
}

Result<uint64_t> checked_mul(uint64_t a, uint64_t b, const std::string& what) {
  uint64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) {
    return invalid_argument(what + ": " + std::to_string(a) + " x " + std::to_string(b) +
                            " overflows 64 bits");
  }
  return r;
}

}  // namespace strata::cli
