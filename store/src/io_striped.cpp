// strata::store — StripedFile: one logical extent striped RAID-0 over files in several
// directories. Logical byte x lives in file (x / u) % k at offset (x / u / k) * u + x % u.
// A read or write becomes one engine request per stripe unit touched, all submitted before
// any is waited on, so every device has requests in flight at once.
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <filesystem>
#include <mutex>

#include "io_common.hpp"

namespace strata {
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

class StripedFileImpl final : public StripedFile {
 public:
  StripedFileImpl(std::shared_ptr<IoEngine> engine, std::vector<std::shared_ptr<IoFile>> files,
                  uint64_t unit)
      : engine_(std::move(engine)), files_(std::move(files)), unit_(unit) {}

  Future<uint64_t> read(void* dst, uint64_t nbytes, uint64_t offset) override {
    return run(false, static_cast<char*>(dst), nbytes, offset);
  }
  Future<uint64_t> write(const void* src, uint64_t nbytes, uint64_t offset) override {
    return run(true, const_cast<char*>(static_cast<const char*>(src)), nbytes, offset);
  }
  Future<void> sync() override {
    std::vector<Future<void>> fs;
    for (auto& f : files_) fs.push_back(engine_->sync(f));
    return when_all(fs);
  }
  uint64_t stripe_unit() const override { return unit_; }
  const std::vector<std::shared_ptr<IoFile>>& files() const override { return files_; }

 private:
  Future<uint64_t> run(bool write, char* buf, uint64_t nbytes, uint64_t offset) {
    const uint64_t k = files_.size();
    if (k == 1) {
      return write ? engine_->write(files_[0], buf, nbytes, offset)
                   : engine_->read(files_[0], buf, nbytes, offset);
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
      Future<uint64_t> seg = write ? engine_->write(f, p, hi - lo, foff)
                                   : engine_->read(f, p, hi - lo, foff);
      seg.on_ready([join, i](const Result<uint64_t>& r) { join->done(i, r.status()); });
    }
    return out;
  }

  std::shared_ptr<IoEngine> engine_;
  std::vector<std::shared_ptr<IoFile>> files_;
  uint64_t unit_;
};

}  // namespace

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
  return std::shared_ptr<StripedFile>(
      std::make_shared<StripedFileImpl>(std::move(engine), std::move(files), stripe_unit));
}

}  // namespace strata
