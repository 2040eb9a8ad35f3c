// Reading a small text file whole (see file_text.hpp).
#include "strata/base/file_text.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

namespace strata {

Result<std::string> read_text_file(const std::string& path, const std::string& label,
                                   size_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno_status(errno, "cannot open " + label);
  std::string text;
  char buf[1 << 14];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      return errno_status(e, "cannot read " + label);
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > max_bytes) {
      ::close(fd);
      return invalid_argument(label + ": larger than " + std::to_string(max_bytes >> 20) +
                              " MiB");
    }
  }
  ::close(fd);
  return text;
}

}  // namespace strata
