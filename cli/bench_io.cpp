// `strata bench io`: sequential read or write bandwidth through the strata I/O engine, in
// the shape of fio's sequential jobs (block size, queue depth, O_DIRECT or buffered), over
// one file per --path, striped RAID-0 when several paths are given.
//
// Method: the engine runs with queue_depth and block_size as given, so it keeps exactly
// queue_depth block-sized transfers in flight on the device, as fio's iodepth does. The
// benchmark hands it requests of --request-size bytes (default queue_depth x block_size / 4)
// and keeps 2 x queue_depth x block_size bytes of them outstanding, replacing each completed
// request at once; the engine's worker refills the device queue from the requests it holds
// without a round trip through the submitting thread. Memory: one buffer of that many bytes
// from a PinnedPool (huge pages, registered with the engine: READ_FIXED/WRITE_FIXED). A read first lays out its files when
// they are missing or short (untimed) and drops them from the page cache. The figure is
// bytes / wall time of the timed loop; GB/s means 1e9 bytes per second, like fio's "GB/s".
// The bench/io_vs_fio.sh script compares it with fio on the same files.
//
// Before it starts, the run is refused (InvalidArgument) when two --path entries are the
// same directory, and (ResourceExhausted) when a file system lacks the space the files
// need beyond what they already hold. Unless --keep, a file the run created is removed when
// it ends, whether it succeeds, fails or is stopped by SIGINT/SIGTERM/SIGHUP, and a file that
// existed stays (truncated back to its former size after a failure); with --keep every file
// stays as it is (a later run reuses it: a read then needs no layout).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <csignal>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_limits.hpp"
#include "command.hpp"
#include "progress.hpp"
#include "striped_file.hpp"
#include "strata/base/units.hpp"
#include "strata/store/io_engine.hpp"
#include "strata/store/pinned_pool.hpp"

namespace strata::cli {
namespace {

struct BenchIoArgs {
  std::vector<std::string> paths;
  std::string size = "1GiB";
  std::string block_size = "1MiB";
  uint32_t queue_depth = 32;
  std::string op = "read";
  std::string engine = "uring";
  uint32_t workers = 1;
  std::string request_size;  // default: queue_depth x block_size / 4 (at least block_size)
  std::string stripe_unit;  // default: block size (when a multiple of 4096), else 1 MiB
  std::string file_name = "strata-bench-io.dat";
  bool buffered = false;
  bool keep = false;
  bool json = false;
};

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
uint64_t striped_file_bytes(uint64_t size, uint64_t u, uint64_t k, uint64_t j) {
  const uint64_t nfull = size / u, rem = size % u;
  uint64_t units = nfull / k + (j < nfull % k ? 1 : 0);
  return units * u + (j == nfull % k ? rem : 0);
}

void drop_page_cache(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fdatasync(fd);
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

struct LoopResult {
  double seconds = 0;
  Status status;
};

/// Keeps `slots` requests of `bs` bytes outstanding over [0, size) until all are done.
LoopResult run_loop(StripedFile& file, bool write, char* mem, uint64_t size, uint64_t bs,
                    uint32_t slots, bool progress, const char* label) {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<uint32_t, Status>> done;
  const uint64_t nreq = (size + bs - 1) / bs;
  uint64_t next = 0, completed = 0;
  auto submit = [&](uint32_t slot) {
    const uint64_t off = next * bs;
    const uint64_t len = std::min(bs, size - off);
    ++next;
    char* p = mem + static_cast<uint64_t>(slot) * bs;
    Future<uint64_t> f = write ? file.write_async(p, len, off) : file.read_async(p, len, off);
    f.on_ready([&, slot](const Result<uint64_t>& r) {
      // Notify under the lock: the waiter may return (and destroy cv) right after.
      std::lock_guard<std::mutex> lk(mu);
      done.emplace_back(slot, r.status());
      cv.notify_one();
    });
  };
  LoopResult res;
  Progress bar(std::string("  ") + label, size, Progress::Unit::kBytes);
  const auto t0 = std::chrono::steady_clock::now();
  for (uint32_t s = 0; s < slots && next < nreq; ++s) submit(s);
  while (completed < nreq) {
    std::pair<uint32_t, Status> c;
    {
      std::unique_lock<std::mutex> lk(mu);
      cv.wait(lk, [&] { return !done.empty(); });
      c = std::move(done.front());
      done.pop_front();
    }
    ++completed;
    if (!c.second.ok() && res.status.ok()) res.status = c.second;
    if (res.status.ok() && next < nreq) submit(c.first);
    if (!res.status.ok() && completed == next) break;  // every submitted request is done
    if (progress) bar.update(std::min(size, completed * bs));
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  bar.finish();
  return res;
}

int run_bench_io(const BenchIoArgs& a) {
  uint64_t size, bs, unit, req;
  try {
    size = parse_size_or_throw(a.size, "--size");
    bs = parse_size_or_throw(a.block_size, "--block-size");
    if (bs == 0) return report_error(invalid_argument("--block-size '" + a.block_size + "' must be > 0"));
    req = a.request_size.empty()
              ? std::max<uint64_t>(bs, static_cast<uint64_t>(a.queue_depth) * bs / 4 / bs * bs)
              : parse_size_or_throw(a.request_size, "--request-size");
    unit = a.stripe_unit.empty() ? (bs % 4096 == 0 ? bs : kMiB)
                                 : parse_size_or_throw(a.stripe_unit, "--stripe-unit");
  } catch (const CLI::ValidationError& e) {
    return report_error(invalid_argument(e.what()));
  }
  if (size == 0 || bs == 0) return report_error(invalid_argument("--size and --block-size must be > 0"));
  if (a.op != "read" && a.op != "write") {
    return report_error(invalid_argument("--op '" + a.op + "': expected read or write"));
  }
  if (a.engine != "uring" && a.engine != "threads") {
    return report_error(invalid_argument("--engine '" + a.engine + "': expected uring or threads"));
  }
  if (a.queue_depth == 0) return report_error(invalid_argument("--queue-depth must be >= 1"));
  if (a.file_name.empty() || a.file_name.find('/') != std::string::npos || a.file_name == "." ||
      a.file_name == "..") {
    return report_error(invalid_argument("--file-name '" + a.file_name +
                                         "' must be a plain file name inside each --path"));
  }
  if (req == 0) return report_error(invalid_argument("--request-size must be > 0"));
  for (size_t i = 0; i < a.paths.size(); ++i) {
    if (a.paths[i].empty()) {
      return report_error(invalid_argument("--path must name a directory, got an empty string "
                                           "(--path #" + std::to_string(i + 1) + ")"));
    }
  }
  if (Status st = check_distinct_dirs(a.paths, "--path"); !st.ok()) return report_error(st);
  if (unit == 0 || unit % 4096 != 0) {
    return report_error(invalid_argument("--stripe-unit " + std::to_string(unit) +
                                         " must be a positive multiple of 4096"));
  }
  // Free space: each file grows to its share of --size; what it already holds is reused.
  const uint64_t k = a.paths.size();
  FileGuard guard(a.paths, a.file_name, a.keep);
  {
    std::vector<DiskNeed> needs;
    for (uint64_t j = 0; j < k; ++j) {
      const uint64_t want = striped_file_bytes(size, unit, k, j);
      const uint64_t have = guard.allocated(j);
      needs.push_back({"--path #" + std::to_string(j + 1), a.paths[j], want > have ? want - have : 0});
    }
    if (Status st = check_free_space(needs, "bench io --size " + a.size); !st.ok()) {
      return report_error(st);
    }
  }
  // Requests outstanding: 2 x queue_depth x block_size bytes of them (at least 2 requests).
  const uint32_t slots = static_cast<uint32_t>(
      std::max<uint64_t>(2, (2 * static_cast<uint64_t>(a.queue_depth) * bs + req - 1) / req));
  auto mem_bytes_r = checked_mul(slots, req, "bench io buffer: " + std::to_string(slots) +
                                                 " requests outstanding of --request-size");
  if (!mem_bytes_r.ok()) return report_error(mem_bytes_r.status());
  const uint64_t mem_bytes = *mem_bytes_r;
  if (Status st = check_memory(mem_bytes, "bench io (" + std::to_string(slots) +
                                              " requests of " + std::to_string(req) +
                                              " bytes outstanding)");
      !st.ok()) {
    return report_error(st);
  }
  const bool write = a.op == "write";

  IoEngineOptions eo;
  eo.kind = a.engine == "uring" ? EngineKind::kUring : EngineKind::kThreads;
  eo.queue_depth = a.queue_depth;
  eo.block_size = bs;
  eo.workers = a.workers;
  eo.direct = !a.buffered;
  auto engine = IoEngine::create(eo);
  if (!engine.ok()) return report_error(engine.status());

  IoMemory mem;
  if (Status st = mem.init(mem_bytes, *engine); !st.ok()) return report_error(st);
  for (uint64_t i = 0; i < mem_bytes; ++i) {
    mem.data()[i] = static_cast<char>(i * 131 + (i >> 12));
  }

  auto file = StripedFile::open(*engine, a.paths, a.file_name, OpenMode::kReadWrite, unit);
  if (!file.ok()) return report_error(file.status());
  const bool progress = progress_wanted();

  if (!write) {
    bool short_file = false;
    for (uint64_t j = 0; j < k; ++j) {
      auto sz = (*file)->files()[j]->size();
      if (!sz.ok()) return report_error(sz.status());
      if (*sz < striped_file_bytes(size, unit, k, j)) short_file = true;
    }
    if (short_file) {
      if (!a.json) std::fprintf(stderr, "laying out %s for the read (untimed)\n", format_bytes(size).c_str());
      auto lay = run_loop(**file, true, mem.data(), size, req, slots, progress, "layout");
      if (!lay.status.ok()) return report_error(lay.status.with_context("laying out the read file"));
      auto s = (*file)->sync_async().result();
      if (!s.ok()) return report_error(s.status());
    }
  }
  for (const auto& f : (*file)->files()) drop_page_cache(f->path());

  auto res = run_loop(**file, write, mem.data(), size, req, slots, progress, a.op.c_str());
  if (!res.status.ok()) return report_error(res.status);
  const bool direct = (*file)->files()[0]->direct();
  const double bw = gbps(size, res.seconds);
  const double iops = res.seconds > 0 ? static_cast<double>((size + bs - 1) / bs) / res.seconds : 0;
  const std::string engine_name(engine_kind_name((*engine)->kind()));

  if (a.json) {
    nlohmann::json j;
    j["op"] = a.op;
    j["bytes"] = size;
    j["seconds"] = res.seconds;
    j["gbps"] = bw;
    j["mib_per_s"] = static_cast<double>(size) / res.seconds / kMiB;
    j["iops"] = iops;
    j["block_size"] = bs;
    j["queue_depth"] = a.queue_depth;
    j["request_size"] = req;
    j["engine"] = engine_name;
    j["workers"] = a.workers;
    j["direct"] = direct;
    j["paths"] = a.paths;
    j["stripe_unit"] = unit;
    j["memory"] = mem.kind();
    j["registered_buffers"] = mem.registered();
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("strata bench io: op=%s engine=%s direct=%d bs=%s iodepth=%u files=%zu memory=%s%s\n",
                a.op.c_str(), engine_name.c_str(), direct ? 1 : 0, format_bytes(bs).c_str(),
                a.queue_depth, a.paths.size(), mem.kind(),
                mem.registered() ? " (registered)" : "");
    std::printf("  %s: IOPS=%.0f, BW=%.2f GB/s (%.0f MiB/s)(%s/%.3fs)\n", a.op.c_str(), iops, bw,
                static_cast<double>(size) / res.seconds / kMiB, format_bytes(size).c_str(),
                res.seconds);
    for (const auto& f : (*file)->files()) std::printf("  file: %s\n", f->path().c_str());
  }
  guard.succeeded();
  return 0;
}

void register_bench_io(Registry& r) {
  auto args = std::make_shared<BenchIoArgs>();
  auto* sub = add_command(bench_group(r), "io",
                          "Sequential read/write bandwidth through the I/O engine (fio-like; one "
                          "file per --path, striped when several)",
                          args, run_bench_io);
  sub->add_option("--path", args->paths,
                  "directory for the benchmark file (repeat to stripe over distinct directories; "
                  "each file system must have room for its files' share of --size)")
      ->required();
  add_defaulted(sub, "--size", args->size, "total bytes (suffixes KiB, MiB, GiB, K, M, G)");
  add_defaulted(sub, "--block-size", args->block_size, "bytes per request");
  add_defaulted(sub, "--queue-depth", args->queue_depth, "requests in flight");
  add_defaulted(sub, "--op", args->op, "read or write");
  add_defaulted(sub, "--engine", args->engine, "uring or threads");
  add_defaulted(sub, "--workers", args->workers, "io_uring worker threads (one ring each)");
  sub->add_option("--request-size", args->request_size,
                  "bytes per engine request, split into block-size transfers (default: "
                  "queue depth x block size / 4)");
  sub->add_option("--stripe-unit", args->stripe_unit,
                  "stripe unit over several paths (default: the block size)");
  add_defaulted(sub, "--file-name", args->file_name,
                "file name inside each path (a file the run creates is removed when it ends, "
                "also after an error or SIGINT; one that existed stays, truncated back to "
                "its size after a failure)");
  sub->add_flag("--keep", args->keep,
                "keep the files as they are when the run ends (a later run reuses them)");
  sub->add_flag("--buffered", args->buffered, "buffered I/O instead of O_DIRECT");
  sub->add_flag("--json", args->json, "print one JSON object");
}

}  // namespace

STRATA_CLI_COMMAND(register_bench_io);

}  // namespace strata::cli
