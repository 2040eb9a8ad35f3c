// The sequential-transfer machinery of `strata bench io`, shared with `strata tune`: the
// benchmark files' clean-up guard, the I/O memory, and the loop that keeps requests
// outstanding over a StripedFile. See bench_io_cmd.cpp for the method.
#pragma once

#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <array>
#include <csignal>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "striped_file.hpp"
#include "strata/base/status.hpp"
#include "strata/base/units.hpp"
#include "strata/store/io_engine.hpp"
#include "strata/store/pinned_pool.hpp"

namespace strata::cli {

/// Cleans up the benchmark files on every exit path of a run (unless --keep): a file the run
/// created is removed, after success, failure or a fatal SIGINT/SIGTERM/SIGHUP alike; a file
/// that existed stays, truncated back to its former size unless the run succeeded (a read
/// lays out a short file). While a guard lives, those signals run the clean-up, then
/// terminate the process with the signal's default action.
class FileGuard {
 public:
  FileGuard(const std::vector<std::string>& paths, const std::string& name, bool keep)
      : keep_(keep) {
    for (const auto& p : paths) {
      Entry e;
      e.path = p + "/" + name;
      struct stat st;
      e.existed = ::lstat(e.path.c_str(), &st) == 0;
      e.size = e.existed ? static_cast<uint64_t>(st.st_size) : 0;
      e.allocated = e.existed ? static_cast<uint64_t>(st.st_blocks) * 512 : 0;
      entries_.push_back(e);
    }
    if (keep_) return;
    active_ = this;
    struct sigaction sa {};
    sa.sa_handler = &FileGuard::on_signal;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < kSignals.size(); ++i) {
      ::sigaction(kSignals[i], &sa, &old_[i]);
      // a signal the caller ignores (nohup, a background job) stays ignored
      if (old_[i].sa_handler == SIG_IGN) ::sigaction(kSignals[i], &old_[i], nullptr);
    }
  }
  ~FileGuard() {
    if (keep_) return;
    for (size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &old_[i], nullptr);
    active_ = nullptr;
    undo(!ok_);
  }
  FileGuard(const FileGuard&) = delete;
  FileGuard& operator=(const FileGuard&) = delete;
  void succeeded() { ok_ = true; }
  /// Bytes file `j` holds on disk now (0 when it does not exist).
  uint64_t allocated(size_t j) const { return entries_[j].allocated; }

 private:
  struct Entry {
    std::string path;
    bool existed = false;
    uint64_t size = 0, allocated = 0;
  };
  static constexpr std::array<int, 3> kSignals{SIGINT, SIGTERM, SIGHUP};

  /// Async-signal-safe (lstat, unlink and truncate only; entries_ is not changed after the
  /// constructor).
  void undo(bool failed) const {
    for (const auto& e : entries_) {
      if (!e.existed) {
        (void)::unlink(e.path.c_str());
      } else if (failed) {
        struct stat st;
        if (::lstat(e.path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
            static_cast<uint64_t>(st.st_size) > e.size) {
          (void)::truncate(e.path.c_str(), static_cast<off_t>(e.size));
        }
      }
    }
  }
  static void on_signal(int sig) {
    if (const FileGuard* g = active_) g->undo(true);
    ::signal(sig, SIG_DFL);
    ::raise(sig);
  }

  static inline const FileGuard* volatile active_ = nullptr;
  std::vector<Entry> entries_;
  std::array<struct sigaction, kSignals.size()> old_{};
  bool keep_;
  bool ok_ = false;
};

/// The benchmark's I/O memory: a PinnedPool buffer (huge pages, registered with the engine),
/// or, when the pool cannot be created, an anonymous mapping with MAP_HUGETLB, else 2 MiB
/// aligned memory with madvise(MADV_HUGEPAGE).
class IoMemory {
 public:
  Status init(uint64_t nbytes, const std::shared_ptr<IoEngine>& engine) {
    PinnedPoolOptions po;
    po.budget_bytes = align_up(nbytes, 2 * kMiB);
    po.huge_pages = true;
    auto pool = PinnedPool::create(po, engine);
    if (pool.ok()) {
      auto buf = (*pool)->try_allocate(nbytes);
      if (buf.ok()) {
        pool_ = *pool;
        buf_ = std::move(*buf);
        data_ = static_cast<char*>(buf_.data());
        kind_ = huge_page_kind_name(pool_->huge_page_kind());
        registered_ = pool_->engine_registered();
        return Status::OK();
      }
    }
    map_len_ = align_up(nbytes, 2 * kMiB);
    void* p = ::mmap(nullptr, map_len_, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
    if (p != MAP_FAILED) {
      kind_ = "hugetlb";
      map_base_ = p;
      map_total_ = map_len_;
    } else {
      map_total_ = map_len_ + 2 * kMiB;
      p = ::mmap(nullptr, map_total_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) return errno_status(errno, "mmap of the benchmark buffer");
      map_base_ = p;
      p = reinterpret_cast<void*>(align_up(reinterpret_cast<uintptr_t>(p), 2 * kMiB));
      kind_ = ::madvise(p, map_len_, MADV_HUGEPAGE) == 0 ? "thp" : "none";
    }
    data_ = static_cast<char*>(p);
    registered_ = engine->register_buffer(data_, map_len_).ok();
    engine_ = engine;
    return Status::OK();
  }
  ~IoMemory() {
    buf_ = PinnedBuffer();
    pool_.reset();
    if (map_base_) {
      if (registered_) (void)engine_->unregister_buffer(data_);
      ::munmap(map_base_, map_total_);
    }
  }
  char* data() const { return data_; }
  const char* kind() const { return kind_; }
  bool registered() const { return registered_; }

 private:
  std::shared_ptr<PinnedPool> pool_;
  PinnedBuffer buf_;
  std::shared_ptr<IoEngine> engine_;
  void* map_base_ = nullptr;
  uint64_t map_len_ = 0, map_total_ = 0;
  char* data_ = nullptr;
  const char* kind_ = "none";
  bool registered_ = false;
};

/// Bytes of the logical extent [0, size) that land in file j of k (stripe unit u).
uint64_t striped_file_bytes(uint64_t size, uint64_t u, uint64_t k, uint64_t j);

/// fdatasync + POSIX_FADV_DONTNEED of `path` (errors ignored): the next read comes from
/// the device.
void drop_page_cache(const std::string& path);

/// How bench io keeps a device queue full: requests of `request` bytes (default
/// max(bs, queue_depth x bs / 4), a multiple of bs), `slots` of them outstanding
/// (2 x queue_depth x bs bytes, at least 2 requests).
struct PassShape {
  uint64_t request = 0;
  uint32_t slots = 0;
};
/// \param request_size 0 = the default above.
PassShape pass_shape(uint32_t queue_depth, uint64_t bs, uint64_t request_size = 0);

struct LoopResult {
  double seconds = 0;  ///< wall time of the loop
  uint64_t bytes = 0;  ///< bytes transferred: [0, bytes) of the extent
  Status status;       ///< the first failing request's error
};

/// Keeps `slots` requests of `bs` bytes outstanding over [0, size) of `file` (reads, or
/// writes from `mem`, which holds slots x bs bytes) until all are done; with `progress`, a
/// "<label> NN.N%  X GB/s" line on stderr every 0.5 s. With `max_seconds` > 0, no request
/// is submitted after that many seconds: the loop ends when those in flight are done.
LoopResult run_loop(StripedFile& file, bool write, char* mem, uint64_t size, uint64_t bs,
                    uint32_t slots, bool progress, const char* label, double max_seconds = 0);

}  // namespace strata::cli
