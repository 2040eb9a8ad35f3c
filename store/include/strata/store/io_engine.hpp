// strata::store — the NVMe I/O engine: io_uring (liburing) with O_DIRECT, or a thread-pool
// pread/pwrite fallback, behind one asynchronous interface (IoEngine). The store, the
// optimizer's pipeline and the CLI benchmarks all do their file I/O through it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "strata/base/future.hpp"
#include "strata/base/status.hpp"

namespace strata {

enum class EngineKind { kUring, kThreads };
std::string_view engine_kind_name(EngineKind k);  // "uring" | "threads"

/// Options of an IoEngine. Defaults are seeded from STRATA_* environment variables by
/// IoEngineOptions::from_env(); a field set explicitly always wins.
struct IoEngineOptions {
  EngineKind kind = EngineKind::kUring;  ///< STRATA_IO_ENGINE=uring|threads
  uint32_t queue_depth = 32;             ///< requests in flight per worker (STRATA_QUEUE_DEPTH)
  uint64_t block_size = 1ull << 20;      ///< bytes per request, max (STRATA_BLOCK_SIZE)
  uint32_t workers = 1;                  ///< worker threads (one ring each) (STRATA_IO_WORKERS)
  bool direct = true;                    ///< O_DIRECT (STRATA_DIRECT)
  bool allow_buffered_fallback = true;   ///< use buffered I/O + one warning when O_DIRECT is refused
  bool allow_threads_fallback = true;    ///< use the thread engine + one warning when io_uring_setup fails
  bool register_files = true;            ///< io_uring registered files
  bool register_buffers = true;          ///< READ_FIXED/WRITE_FIXED for register_buffer() regions
  /// Most SQEs handed to the kernel per io_uring_submit (STRATA_IO_SUBMIT_BATCH). 0 = auto:
  /// every prepared SQE at once when block_size < 128 KiB (small transfers: the syscall is
  /// the cost), one per call otherwise. Consecutive large pieces submitted together are
  /// merged by the block layer into requests up to max_sectors_kb (4 MiB on virtio disks),
  /// which lowers the number of requests the device works on in parallel: measured here,
  /// 1 MiB O_DIRECT reads at queue depth 32 ran ~10% slower (8 merged 4 MiB requests in
  /// flight instead of 32), while one io_uring_enter per >= 128 KiB transfer costs < 1%.
  uint32_t submit_batch = 0;
  /// NUMA node (kernel number) whose CPUs run the engine's threads: its worker threads
  /// are bound there (hwloc), and with io_uring the kernel's async workers too
  /// (IORING_REGISTER_IOWQ_AFF); only CPUs the creating thread may already use (taskset,
  /// cpusets) count, and when none does the threads stay unbound. -1 = no binding. A store places one engine per node of
  /// its NVMe directories (see StorePlacement). A node the machine lacks is InvalidArgument
  /// at create(); a binding the kernel refuses is one warning.
  int numa_node = -1;
  bool sqpoll = false;                   ///< IORING_SETUP_SQPOLL (opt-in)
  bool iopoll = false;                   ///< IORING_SETUP_IOPOLL (opt-in; O_DIRECT only)

  /// Defaults overridden by the configuration file's "io" section ($STRATA_CONFIG; see
  /// config.hpp), then by the STRATA_* variables above.
  /// \error InvalidArgument naming the variable on a malformed value; what Config::load()
  ///     returns for the file.
  static Result<IoEngineOptions> from_env();
  /// As from_env(), with `config_file` instead of $STRATA_CONFIG when non-empty.
  static Result<IoEngineOptions> from_config(const std::string& config_file);
};

enum class OpenMode {
  kRead,       ///< existing file, read only
  kReadWrite,  ///< existing file, or created when absent
  kTruncate,   ///< created or truncated to 0
};

/// An open file on which the engine does I/O. Created by IoEngine::open(); closes on
/// destruction. Thread-safety: immutable after open; share freely.
class IoFile {
 public:
  virtual ~IoFile() = default;
  virtual const std::string& path() const = 0;
  virtual bool direct() const = 0;               ///< opened with O_DIRECT
  virtual uint32_t offset_alignment() const = 0; ///< DIO offset/length alignment (bytes)
  virtual uint32_t memory_alignment() const = 0; ///< DIO buffer alignment (bytes)
  virtual Result<uint64_t> size() const = 0;     ///< current file size in bytes
};

/// How long an engine had reads only, writes only (syncs count as writes), both, or nothing
/// in flight, in seconds of the steady clock since the engine was created. A piece (at most
/// block_size bytes of one request) is in flight from its issue (its io_uring SQE prepared,
/// or its pread/pwrite called) to its completion; the times are the engine's as a whole,
/// whatever its worker count, and the four add up to the engine's age. The difference of
/// two snapshots splits the interval between them: `strata bench step` reports the split
/// of its step and of its I/O probe, which shows whether a pipeline left the device idle
/// or kept it busy at a lower rate (docs/benchmarks.md).
struct IoOccupancy {
  double idle_seconds = 0;
  double reads_only_seconds = 0;
  double writes_only_seconds = 0;
  double reads_and_writes_seconds = 0;
  /// The integral over time of the read (write) pieces in flight, in piece-seconds: divided
  /// by the seconds with reads (writes) in flight, the mean read (write) queue depth.
  double read_piece_seconds = 0;
  double write_piece_seconds = 0;
  /// Field by field `*this - before` (the interval between two snapshots).
  IoOccupancy operator-(const IoOccupancy& before) const {
    return {idle_seconds - before.idle_seconds, reads_only_seconds - before.reads_only_seconds,
            writes_only_seconds - before.writes_only_seconds,
            reads_and_writes_seconds - before.reads_and_writes_seconds,
            read_piece_seconds - before.read_piece_seconds,
            write_piece_seconds - before.write_piece_seconds};
  }
};

/// Asynchronous file I/O: every read, write and sync returns a future at once and runs on
/// the engine's own threads.
///
/// - Kinds: kUring runs `workers` threads, each owning one io_uring ring; kThreads runs
///   blocking pread/pwrite on `queue_depth` threads (at most 64) per worker (where io_uring
///   is unavailable or selected). Each request goes to one worker (round robin) and is cut into pieces of at
///   most `block_size` bytes; a worker keeps up to `queue_depth` pieces in flight.
/// - Alignment: files open with O_DIRECT when `direct` (falling back to buffered I/O, with
///   one warning, where the file system refuses it). Any offset, size and buffer works:
///   unaligned heads and tails and unaligned caller buffers go through aligned bounce
///   memory inside the engine. A transfer needs no copy when the buffer is aligned to
///   IoFile::memory_alignment() and the offset and length to IoFile::offset_alignment()
///   (statx STATX_DIOALIGN, else the device's logical block size, else 4096).
/// - Completion: a future completes on the engine thread that reaps the last piece of its
///   request, so continuations (Future::on_ready/then) run there and must not block.
///   Buffers passed to read_async/write_async must stay valid until the returned future is ready.
///   Buffers inside a region given to register_buffer() use READ_FIXED/WRITE_FIXED.
/// - Errors: every completion is checked. A short transfer is continued; a failure
///   resolves the future to an error naming path, offset, length and errno (ENOSPC is
///   ResourceExhausted, reading past EOF DataLoss). A read or write future resolves to
///   exactly `nbytes` on success, never a silent truncation.
/// - Threads: the worker threads are bound to `numa_node`'s CPUs when set (with io_uring,
///   the kernel's io-wq workers too).
/// \threadsafety every member may be called concurrently from any thread; a continuation
///     running on an engine thread may submit further requests but must not wait for one
///     (nor drain()).
class IoEngine {
 public:
  /// Creates an engine. With kind=kUring and io_uring unavailable, falls back to kThreads
  /// (one warning) when allow_threads_fallback, else Unavailable.
  static Result<std::shared_ptr<IoEngine>> create(const IoEngineOptions& options);
  /// Waits for every request in flight (drain()), then stops the engine's threads.
  virtual ~IoEngine() = default;

  virtual EngineKind kind() const = 0;
  virtual const IoEngineOptions& options() const = 0;

  /// Opens `path`. With options().direct, opens with O_DIRECT; if the filesystem refuses
  /// O_DIRECT (EINVAL, e.g. tmpfs) and allow_buffered_fallback, opens buffered and warns once.
  /// \error NotFound (missing file/dir), PermissionDenied, IoError — each naming the path.
  virtual Result<std::shared_ptr<IoFile>> open(const std::string& path, OpenMode mode) = 0;

  /// Reads nbytes at offset into dst. Reading past EOF is DataLoss naming path/offset.
  virtual Future<uint64_t> read_async(const std::shared_ptr<IoFile>& file, void* dst, uint64_t nbytes,
                                      uint64_t offset) = 0;
  /// Writes nbytes from src at offset. ENOSPC -> ResourceExhausted naming path/offset.
  virtual Future<uint64_t> write_async(const std::shared_ptr<IoFile>& file, const void* src,
                                       uint64_t nbytes, uint64_t offset) = 0;
  /// fdatasync of the file (on a worker).
  virtual Future<void> sync_async(const std::shared_ptr<IoFile>& file) = 0;

  /// Registers [addr, addr+nbytes) for fixed-buffer I/O (io_uring); no-op for kThreads.
  virtual Status register_buffer(void* addr, uint64_t nbytes) = 0;
  virtual Status unregister_buffer(void* addr) = 0;

  /// Blocks until every request submitted so far is complete. Returns at once when none.
  virtual void drain() = 0;

  /// The engine's occupancy so far (IoOccupancy), up to this call.
  /// \threadsafety any thread; a snapshot while pieces complete is consistent (one lock).
  virtual IoOccupancy occupancy() const = 0;
};

/// OK when no directory appears twice in `dirs`: two entries are the same when their
/// normalized canonical paths are equal, or when both exist with the same st_dev and st_ino
/// (bind mounts, symlinks). Striping over one directory twice would put two stripes in one
/// file (or one device) and double-count its bandwidth. Empty entries are skipped (callers
/// check emptiness with their own message).
/// \param label names entry i in the message, e.g. "StoreOptions.nvme_dirs[0]", "--path #1".
/// \error InvalidArgument "<label(j)> '<a>' and <label(i)> '<b>' are the same directory
///     (<canonical path> | device D inode I): each directory may be listed once".
/// Thread-safety: none needed (stat() only).
Status check_distinct_directories(const std::vector<std::string>& dirs,
                                  const std::function<std::string(size_t)>& label);

}  // namespace strata
