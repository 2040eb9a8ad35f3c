// strata::store — internals shared by the I/O engines (io_uring and thread pool).
//
// A caller's read/write becomes a Request, split into Pieces of at most block_size bytes:
//  - On an O_DIRECT file, the aligned middle [align_up(off), align_down(end)) goes through
//    the O_DIRECT descriptor, straight from caller memory when that memory is aligned to the
//    file's DIO memory alignment, else through an aligned bounce buffer per piece.
//  - The unaligned head and tail (each < offset alignment bytes) go through a second,
//    buffered descriptor of the same file. The page cache keeps them coherent with the
//    direct I/O (the kernel writes back and invalidates cached pages over a direct I/O
//    range). Unlike a read-modify-write of whole blocks, two concurrent writes of adjacent
//    unaligned ranges in one block cannot overwrite each other, and the file never grows
//    past offset + nbytes.
//  - A short transfer is continued where it stopped (on the buffered descriptor if the
//    remainder is no longer aligned); 0 bytes read before the end is DataLoss.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "strata/base/future.hpp"
#include "strata/base/status.hpp"
#include "strata/store/io_engine.hpp"

namespace strata::io {

/// Slots of io_uring registered files, shared by an engine's rings and the files it opened
/// (a file may outlive its engine: then it just closes its descriptors).
class FileSlotOwner {
 public:
  virtual ~FileSlotOwner() = default;
  /// Registers fds[0..1] in every ring; returns the base slot, or -1 when not registered.
  virtual int register_file(int fd_direct, int fd_buffered) = 0;
  virtual void unregister_file(int slot) = 0;
};

/// Shared between an engine and its files; `owner` is cleared when the engine dies.
struct FileSlotLink {
  std::mutex mu;
  FileSlotOwner* owner = nullptr;
};

class FileImpl final : public IoFile {
 public:
  ~FileImpl() override;
  const std::string& path() const override { return path_; }
  bool direct() const override { return direct_; }
  uint32_t offset_alignment() const override { return offset_align_; }
  uint32_t memory_alignment() const override { return memory_align_; }
  Result<uint64_t> size() const override;

  std::string path_;
  OpenMode mode_ = OpenMode::kRead;
  bool direct_ = false;
  int fd_direct_ = -1;    ///< O_DIRECT descriptor (== fd_buffered_ when !direct_)
  int fd_buffered_ = -1;  ///< buffered descriptor (unaligned heads/tails, continuations)
  uint32_t offset_align_ = 1;
  uint32_t memory_align_ = 1;
  std::shared_ptr<FileSlotLink> link_;  ///< engine that registered the fds (may be dead)
  int slot_ = -1;                       ///< registered slot of fd_direct_; +1 for buffered
};

/// Opens `path` for `engine_options`; registers the fds via `link` when non-null.
Result<std::shared_ptr<FileImpl>> open_file(const std::string& path, OpenMode mode,
                                            const IoEngineOptions& options,
                                            const std::shared_ptr<FileSlotLink>& link);

/// DIO alignment of an open fd: statx STATX_DIOALIGN, else the logical block size of the
/// block device (sysfs), else 4096. Returns {offset_align, memory_align}.
std::pair<uint32_t, uint32_t> dio_alignment(int fd);

enum class Op : uint8_t { kRead, kWrite, kSync };

struct Request;

struct Piece {
  Request* req = nullptr;
  bool buffered_fd = false;  ///< use the buffered descriptor
  char* user = nullptr;      ///< caller memory for this piece
  char* bounce = nullptr;    ///< aligned bounce buffer (nullptr: I/O from/to `user`)
  uint64_t len = 0;
  uint64_t offset = 0;
  uint64_t done = 0;
  int attempts = 0;  ///< EAGAIN/EINTR resubmissions

  char* data() const { return (bounce ? bounce : user) + done; }
  uint64_t remaining() const { return len - done; }
};

/// One caller operation. Lives until its last piece completes (self_ keeps it alive).
struct Request {
  Op op = Op::kRead;
  std::shared_ptr<FileImpl> file;
  uint64_t nbytes = 0;
  uint64_t offset = 0;
  std::vector<Piece> pieces;
  std::atomic<size_t> pieces_left{0};
  std::mutex mu;
  Status error;
  Promise<uint64_t> promise;        // for reads/writes
  Promise<void> void_promise;       // for sync
  std::shared_ptr<Request> self_;   // released by the last piece
  std::function<void()> on_done;    // engine accounting (drain); runs after the promise
};

/// Builds the request and its pieces. `block_size` is the maximum piece length.
std::shared_ptr<Request> plan_request(Op op, std::shared_ptr<FileImpl> file, char* buf,
                                      uint64_t nbytes, uint64_t offset, uint64_t block_size);

/// Prepares a piece for issue: allocates and fills (writes) its bounce buffer if needed.
void prepare_piece(Piece& p);

/// Accounts a result of `res` bytes (>= 0) or -errno (< 0) for one transfer of `p`.
/// Returns true when the piece is finished (successfully or not; the request records the
/// error), false when it must be issued again for the remainder.
bool account_result(Piece& p, int64_t res);

class OccupancyTracker;
/// Runs one piece synchronously with pread/pwrite (threads engine, IOPOLL edge pieces);
/// the transfer is in flight for `occupancy` (when given) until just before the piece
/// finishes (its future may complete then).
void run_piece_sync(Piece& p, OccupancyTracker* occupancy = nullptr);

/// Completes a piece (copies the bounce buffer out for reads, frees it) and, when it was the
/// last one, fulfils the request's promise.
void finish_piece(Piece& p);

/// Error message prefix: "write of 'path' at offset X, length Y".
std::string describe(const Piece& p);

/// Counts requests in flight for drain().
class InflightCounter {
 public:
  void add() {
    std::lock_guard<std::mutex> lk(mu_);
    ++n_;
  }
  void done() {
    std::lock_guard<std::mutex> lk(mu_);
    if (--n_ == 0) cv_.notify_all();
  }
  void wait_zero() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return n_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t n_ = 0;
};

/// Accumulates IoOccupancy: pieces in flight by kind, and the time spent in each state.
/// \threadsafety every member may be called from any thread (one mutex).
class OccupancyTracker {
 public:
  OccupancyTracker() : last_(std::chrono::steady_clock::now()) {}
  /// A piece of `op` was issued (starts being in flight).
  void start(Op op) { move(op, +1); }
  /// A piece of `op` completed (or its transfer ended short, to be issued again).
  void end(Op op) { move(op, -1); }
  /// The accumulated times, the current state's included up to now.
  IoOccupancy snapshot() const;

 private:
  void move(Op op, int delta);
  /// The current state: index of seconds_, (reads > 0) | (writes > 0) << 1.
  int state_locked() const { return (reads_ > 0 ? 1 : 0) | (writes_ > 0 ? 2 : 0); }
  mutable std::mutex mu_;
  std::chrono::steady_clock::time_point last_;  // when the current state began
  double seconds_[4] = {0, 0, 0, 0};            // closed intervals, by state
  double piece_seconds_[2] = {0, 0};            // closed intervals x pieces: reads, writes
  int64_t reads_ = 0, writes_ = 0;
};

/// Validates a read/write call; returns a ready future with the error when invalid.
Status check_io_args(const std::shared_ptr<IoFile>& file, const void* buf, uint64_t nbytes,
                     bool write);

/// Common front end of both engines: argument checks, planning, drain accounting.
class EngineBase : public IoEngine {
 public:
  explicit EngineBase(const IoEngineOptions& o) : options_(o) {}
  const IoEngineOptions& options() const override { return options_; }
  Result<std::shared_ptr<IoFile>> open(const std::string& path, OpenMode mode) override;
  Future<uint64_t> read_async(const std::shared_ptr<IoFile>& file, void* dst, uint64_t nbytes,
                              uint64_t offset) override;
  Future<uint64_t> write_async(const std::shared_ptr<IoFile>& file, const void* src, uint64_t nbytes,
                               uint64_t offset) override;
  Future<void> sync_async(const std::shared_ptr<IoFile>& file) override;
  void drain() override { inflight_.wait_zero(); }
  IoOccupancy occupancy() const override { return occupancy_.snapshot(); }

 protected:
  /// The registered-file link of this engine (nullptr: files are not registered).
  virtual std::shared_ptr<FileSlotLink> slot_link() { return nullptr; }
  /// Hands the pieces of `r` (at least one) to the workers.
  virtual void enqueue(Request* r) = 0;
  Future<uint64_t> submit(Op op, const std::shared_ptr<IoFile>& file, char* buf, uint64_t nbytes,
                          uint64_t offset);

  IoEngineOptions options_;
  InflightCounter inflight_;
  OccupancyTracker occupancy_;  // the engines call start/end around each piece's transfer
};

/// Overrides the fields of `o` that STRATA_IO_ENGINE, STRATA_QUEUE_DEPTH, STRATA_BLOCK_SIZE,
/// STRATA_IO_WORKERS, STRATA_DIRECT and STRATA_IO_SUBMIT_BATCH set (IoEngineOptions).
/// \error InvalidArgument naming the variable on a malformed value.
Status apply_env(IoEngineOptions& o);

/// The CPUs of NUMA node `node` of the running machine (empty when node < 0).
/// \error InvalidArgument when the machine has no such node (or it has no CPUs); as
///     Topology::system().
Result<std::vector<int>> numa_node_cpus(int node);
/// Binds the calling engine thread to `cpus` (nothing when empty); a failure is one
/// warning per process (the thread runs unbound).
void bind_engine_thread(const std::vector<int>& cpus, int node);

std::shared_ptr<IoEngine> make_threads_engine(const IoEngineOptions& options);
/// nullptr + status when io_uring cannot be set up.
Result<std::shared_ptr<IoEngine>> make_uring_engine(const IoEngineOptions& options);

}  // namespace strata::io
