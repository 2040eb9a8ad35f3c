// strata::store — check_distinct_directories() (io_engine.hpp): refuses a list of
// directories that names one directory twice (by path or by device and inode).
#include <sys/stat.h>

#include <filesystem>

#include "strata/store/io_engine.hpp"

namespace strata {

Status check_distinct_directories(const std::vector<std::string>& dirs,
                                  const std::function<std::string(size_t)>& label) {
  namespace fs = std::filesystem;
  struct Dir {
    std::string canon;
    bool exists = false;
    dev_t dev = 0;
    ino_t ino = 0;
  };
  std::vector<Dir> seen(dirs.size());
  for (size_t i = 0; i < dirs.size(); ++i) {
    if (dirs[i].empty()) continue;
    Dir& d = seen[i];
    std::error_code ec;
    fs::path abs = fs::absolute(dirs[i], ec);
    if (ec) abs = fs::path(dirs[i]);
    fs::path c = fs::weakly_canonical(abs, ec);
    d.canon = (ec ? abs : c).lexically_normal().string();
    while (d.canon.size() > 1 && d.canon.back() == '/') d.canon.pop_back();
    struct stat st;
    if (::stat(dirs[i].c_str(), &st) == 0) {
      d.exists = true;
      d.dev = st.st_dev;
      d.ino = st.st_ino;
    }
    for (size_t j = 0; j < i; ++j) {
      if (dirs[j].empty()) continue;
      const bool same_path = seen[j].canon == d.canon;
      const bool same_inode = d.exists && seen[j].exists && seen[j].dev == d.dev &&
                              seen[j].ino == d.ino;
      if (!same_path && !same_inode) continue;
      const std::string how = same_path ? "(" + d.canon + ")"
                                        : "(device " + std::to_string(d.dev) + " inode " +
                                              std::to_string(d.ino) + ")";
      return invalid_argument(label(j) + " '" + dirs[j] + "' and " + label(i) + " '" + dirs[i] +
                              "' are the same directory " + how +
                              ": each directory may be listed once");
    }
  }
  return Status::OK();
}

}  // namespace strata
