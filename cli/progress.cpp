// Progress lines on stderr (see progress.hpp).
#include "progress.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "strata/base/units.hpp"

namespace strata::cli {

bool progress_wanted() {
  if (const char* v = std::getenv("STRATA_PROGRESS")) {
    if (std::strcmp(v, "1") == 0) return true;
    if (std::strcmp(v, "0") == 0) return false;
  }
  return isatty(STDERR_FILENO) == 1;
}

Progress::Progress(std::string label, uint64_t total, Unit unit)
    : label_(std::move(label)), total_(total), unit_(unit), enabled_(progress_wanted()) {
  start_ = std::chrono::steady_clock::now();
  last_ = start_ - std::chrono::seconds(1);  // the first update() draws
}

Progress::~Progress() { finish(); }

void Progress::set_label(std::string label) { label_ = std::move(label); }

void Progress::update(uint64_t done) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_ < std::chrono::milliseconds(200)) return;
  last_ = now;
  draw(done);
}

void Progress::draw(uint64_t done) {
  const double secs = std::chrono::duration<double>(last_ - start_).count();
  std::string line = label_ + ": ";
  char buf[128];
  if (unit_ == Unit::kBytes) {
    line += format_bytes(done);
    if (total_ > 0) line += " / " + format_bytes(total_);
    if (secs > 0) {
      std::snprintf(buf, sizeof buf, ", %.0f MB/s", static_cast<double>(done) / secs / 1e6);
      line += buf;
    }
  } else {
    line += std::to_string(done);
    if (total_ > 0) line += " / " + std::to_string(total_);
  }
  if (total_ > 0) {
    std::snprintf(buf, sizeof buf, " (%.0f%%", 100.0 * static_cast<double>(done) / total_);
    line += buf;
    if (done > 0 && done < total_ && secs > 1) {
      std::snprintf(buf, sizeof buf, ", %.0f s left",
                    secs * static_cast<double>(total_ - done) / static_cast<double>(done));
      line += buf;
    }
    line += ")";
  }
  const size_t w = line.size();
  if (w < width_) line.append(width_ - w, ' ');  // cover the end of a longer previous line
  width_ = w;
  std::fprintf(stderr, "\r%s", line.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::finish() {
  if (!drawn_) return;
  std::fprintf(stderr, "\r%s\r", std::string(width_, ' ').c_str());
  std::fflush(stderr);
  drawn_ = false;
  width_ = 0;
}

}  // namespace strata::cli
