// strata::store (private) — identity marker files, written durably. See store_markers.hpp.
#include "store_markers.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>

namespace strata::store_detail {

namespace fs = std::filesystem;

namespace {
constexpr const char* kMarkerMagic = "strata store marker 1";

/// Durable replace: write `path`.tmp, fsync, rename over `path`, fsync the directory.
Status write_file_durably(const std::string& dir, const std::string& path,
                          const std::string& text) {
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno_status(errno, "create " + tmp);
  ssize_t n = ::write(fd, text.data(), text.size());
  int e = errno;
  if (n != static_cast<ssize_t>(text.size())) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return errno_status(n < 0 ? e : EIO, "write " + tmp);
  }
  if (::fsync(fd) != 0) {
    e = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return errno_status(e, "fsync " + tmp);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    e = errno;
    ::unlink(tmp.c_str());
    return errno_status(e, "rename " + tmp + " to " + path);
  }
  return fsync_directory(dir);
}
}  // namespace

Status fsync_directory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno_status(errno, "open directory " + dir);
  int rc = ::fsync(fd);
  int e = errno;
  ::close(fd);
  if (rc != 0) return errno_status(e, "fsync directory " + dir);
  return Status::OK();
}

Result<std::optional<Marker>> read_marker(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    if (errno == ENOENT || !fs::exists(path)) return std::optional<Marker>();
    return errno_status(errno, "read store marker " + path);
  }
  std::string line;
  Marker m;
  if (!std::getline(in, line) || line != kMarkerMagic) {
    return data_loss("store marker " + path + " is not a strata marker");
  }
  while (std::getline(in, line)) {
    if (line.rfind("uuid ", 0) == 0) m.uuid = line.substr(5);
    if (line.rfind("root ", 0) == 0) m.root = line.substr(5);
  }
  if (m.uuid.empty() || m.root.empty()) {
    return data_loss("store marker " + path + " lacks its uuid or root line");
  }
  return std::optional<Marker>(m);
}

Status write_marker(const std::string& dir, const std::string& path, const std::string& uuid,
                    const std::string& root) {
  std::string text = std::string(kMarkerMagic) + "\nuuid " + uuid + "\nroot " + root + "\n";
  return write_file_durably(dir, path, text);
}

}  // namespace strata::store_detail
