// StripedFile (striped_file.hpp): a logical read or write cut at stripe-unit boundaries into
// one engine request per unit, joined into one future.
#include "striped_file.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <mutex>

namespace strata::cli {
namespace {

/// Joins per-segment futures into one Future<uint64_t> resolving to `total` or the error of
/// the lowest-offset failed segment.
class Join {
 public:
  Join(size_t n, uint64_t total) : errors_(n), remaining_(n), total_(total) {}
  Future<uint64_t> future() { return promise_.future(); }
  void done(size_t i, const Status& s) {
    if (!s.ok()) {
      std::lock_guard<std::mutex> lk(mu_);
      errors_[i] = s;
    }
    if (remaining_.fetch_sub(1) != 1) return;
    for (auto& e : errors_) {
      if (!e.ok()) {
        promise_.set_error(e);
        return;
      }
    }
    promise_.set_value(total_);
  }

 private:
  std::mutex mu_;
  std::vector<Status> errors_;
  std::atomic<size_t> remaining_;
  uint64_t total_;
  Promise<uint64_t> promise_;
};

}  // namespace

Future<uint64_t> StripedFile::read_async(void* dst, uint64_t nbytes, uint64_t offset) {
  return run(false, static_cast<char*>(dst), nbytes, offset);
}

Future<uint64_t> StripedFile::write_async(const void* src, uint64_t nbytes, uint64_t offset) {
  return run(true, const_cast<char*>(static_cast<const char*>(src)), nbytes, offset);
}

Future<void> StripedFile::sync_async() {
  std::vector<Future<void>> fs;
  for (auto& f : files_) fs.push_back(engine_->sync_async(f));
  return when_all(fs);
}

Future<uint64_t> StripedFile::run(bool write, char* buf, uint64_t nbytes, uint64_t offset) {
  const uint64_t k = files_.size();
  if (k == 1) {
    return write ? engine_->write_async(files_[0], buf, nbytes, offset)
                 : engine_->read_async(files_[0], buf, nbytes, offset);
  }
  if (nbytes == 0) return make_ready_future<uint64_t>(uint64_t{0});
  if (offset + nbytes < offset) {
    return make_ready_future<uint64_t>(invalid_argument("striped I/O: offset + length overflows"));
  }
  const uint64_t first_unit = offset / unit_;
  const uint64_t last_unit = (offset + nbytes - 1) / unit_;
  auto join = std::make_shared<Join>(last_unit - first_unit + 1, nbytes);
  Future<uint64_t> out = join->future();
  size_t i = 0;
  for (uint64_t u = first_unit; u <= last_unit; ++u, ++i) {
    const uint64_t lo = std::max(offset, u * unit_);
    const uint64_t hi = std::min(offset + nbytes, (u + 1) * unit_);
    const auto& f = files_[u % k];
    const uint64_t foff = (u / k) * unit_ + lo % unit_;
    char* p = buf + (lo - offset);
    Future<uint64_t> seg = write ? engine_->write_async(f, p, hi - lo, foff)
                                 : engine_->read_async(f, p, hi - lo, foff);
    seg.on_ready([join, i](const Result<uint64_t>& r) { join->done(i, r.status()); });
  }
  return out;
}

Result<std::shared_ptr<StripedFile>> StripedFile::open(std::shared_ptr<IoEngine> engine,
                                                       const std::vector<std::string>& dirs,
                                                       const std::string& name, OpenMode mode,
                                                       uint64_t stripe_unit) {
  if (!engine) return invalid_argument("StripedFile::open: null engine");
  if (dirs.empty()) return invalid_argument("StripedFile::open('" + name + "'): no directories");
  STRATA_RETURN_IF_ERROR(check_distinct_directories(dirs, [&](size_t i) {
    return "StripedFile::open('" + name + "'): directory #" + std::to_string(i + 1);
  }));
  if (stripe_unit == 0 || stripe_unit % 4096 != 0) {
    return invalid_argument("StripedFile::open('" + name + "'): stripe_unit " +
                            std::to_string(stripe_unit) + " is not a positive multiple of 4096");
  }
  std::vector<std::shared_ptr<IoFile>> files;
  for (const auto& d : dirs) {
    struct stat st;
    if (::stat(d.c_str(), &st) != 0) {
      return errno_status(errno, "striped file directory '" + d + "'");
    }
    if (!S_ISDIR(st.st_mode)) {
      return invalid_argument("striped file directory '" + d + "' is not a directory");
    }
    STRATA_ASSIGN_OR_RETURN(auto f, engine->open(d + "/" + name, mode));
    files.push_back(std::move(f));
  }
  return std::make_shared<StripedFile>(std::move(engine), std::move(files), stripe_unit);
}

}  // namespace strata::cli
