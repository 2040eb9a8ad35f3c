// strata::store (private) — StoreImpl, the tiered object store behind Store (store.hpp,
// docs/store.md). One class, its members defined one concern per file:
//
//   store.cpp            the public free functions of store.hpp, Store::open, list_store
//   store_open.cpp       open (init, in named steps) and close, operation admission
//   store_files.cpp      the lock file, the data files' growth and trimming, the ballast
//   store_objects.cpp    the object table: lookup (the one every read goes through),
//                        locking a live version, catalog rows
//   store_readonly.cpp   a read-only open following another process's writer (catch-up)
//   store_commit.cpp     the group-commit thread
//   store_datapath.cpp   chunk I/O: O_DIRECT or staged, checksummed, pipelined
//   store_tiers.cpp      LRU, eviction, promotion, demotion, move
//   store_ops.cpp        put, get, ranges, pin, remove, flush, hold / commit
//   store_query.cpp      stat, list, contains, usage, verify
//
// The model in brief:
//  - Obj: one version of one key. Its NVMe bytes are a Layout (chunks -> extents); its
//    memory copy is a pinned host buffer or a device allocation. A put creates a new Obj and
//    installs it in `objects_` (replacing the old version, which readers may still hold).
//  - durable_: mirror of the catalog (key -> the Layout its committed row names). Extents
//    are reference-counted: an extent returns to the allocator when neither the catalog
//    mirror nor any version/reader holds it, so space named by the catalog is never reused.
//  - Commits go through one committer thread: it fdatasyncs the data files written since
//    the last batch, applies a batch of catalog ops in one SQLite transaction, then applies
//    their in-memory effects in the same order (group commit).
//  - Ordering rule: an op that changes which version a key maps to (put, remove) holds the
//    exclusive lock of the key's live version from before it enqueues its commit until the
//    commit's in-memory effect is applied, so catalog order == in-memory order per key.
//  - A read-only open has no committer, lock file, ballast or host tier; its object table
//    is a view of the committed catalog that an explicit catch-up step refreshes at the
//    start of each query and on a read's NotFound/DataLoss (store_readonly.cpp).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "catalog_sqlite.hpp"
#include "checksum.hpp"
#include "extent_allocator.hpp"
#include "gpu_detail.hpp"
#include "io_lock.hpp"
#include "store_stats.hpp"
#include "strata/base/thread_pool.hpp"
#include "strata/base/units.hpp"
#include "strata/store/pinned_pool.hpp"
#include "strata/store/store.hpp"

namespace strata::store_detail {

// Direct (O_DIRECT, no copy) chunk reads are split into engine requests of this size and
// verified piece by piece as they complete, while the later pieces are still in flight, so
// a 64 MiB chunk costs its transfer plus the hash of one piece, not transfer plus the hash
// of 64 MiB. (Direct writes are all submitted before any hashing: see write_layout_once.)
// The engine cuts each request into block_size pieces as before.
constexpr uint64_t kHashPiece = 4ull << 20;

// Size of the catalog ballast (StoreImpl::release_ballast): room for SQLite's write-ahead
// log to commit a batch of row changes on an otherwise full file system.
constexpr uint64_t kBallastBytes = 4ull << 20;

constexpr uint64_t kAlign = 4096;  // extent offset/length alignment in the data files

/// The catalog's chunk_bytes record, parsed strictly: a damaged value must be an error, not
/// an exception, a division by zero or unaligned direct I/O.
/// \error DataLoss quoting the value and naming `cat_path`.
Result<uint64_t> parse_chunk_bytes(const std::string& v, const std::string& cat_path);

/// OutOfRange for `n` bytes at offset `off` of an object of `size` bytes (off + n may not
/// fit 64 bits, so the message gives the offset and the length, not the end).
Status range_error(const char* op, const std::string& key, uint64_t off, uint64_t n,
                   uint64_t size);

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};
/// Heap memory aligned to 4 KiB (for O_DIRECT tails).
using AlignedBlock = std::unique_ptr<uint8_t, AlignedFree>;
/// At least `n` (>= 1) bytes, rounded up to 4 KiB, aligned to 4 KiB. Aborts when out of memory.
inline AlignedBlock aligned_block(uint64_t n) {
  void* p = std::aligned_alloc(kAlign, align_up(std::max<uint64_t>(n, 1), kAlign));
  STRATA_CHECK(p != nullptr);
  return AlignedBlock(static_cast<uint8_t*>(p));
}

// ---------------------------------------------------------------- the object model

/// One chunk of an object's NVMe copy: `nbytes` of data (the extent is `nbytes` rounded up
/// to 4 KiB, zero-padded) and their XXH3-64.
struct ChunkRef {
  std::shared_ptr<Extent> ext;
  uint64_t nbytes = 0;
  uint64_t checksum = 0;
};
/// An NVMe copy: chunk j holds the object's bytes [j * chunk_bytes, ...), each chunk
/// chunk_bytes long but the last (PutOptions::chunk_bytes; the store's by default).
struct Layout : std::vector<ChunkRef> {
  uint64_t chunk_bytes = 0;
};
using LayoutPtr = std::shared_ptr<const Layout>;

/// A device-tier allocation; frees itself and its share of the device budget.
struct DeviceMem {
  int id = 0;
  void* ptr = nullptr;
  uint64_t nbytes = 0;
  std::shared_ptr<std::atomic<uint64_t>> used;
  ~DeviceMem() {
    device_free(id, ptr);
    if (used) used->fetch_sub(nbytes);
  }
};

/// One version of one key. Fields after `io` are guarded by StoreImpl::mu_.
struct Obj {
  std::string key;
  TensorDesc desc;
  uint64_t nbytes = 0;
  uint32_t first_dir = 0;
  uint64_t chunk = 0;  // bytes per chunk of its NVMe copies (PutOptions::chunk_bytes)
  /// Shared: readers and write_range (until their last continuation, on any thread).
  /// Exclusive: tier changes, write-back, replacement.
  IoLock io;

  bool live = true;         // installed in objects_
  std::string damage;       // non-empty: the catalog row is damaged (reads fail, DataLoss)
  uint64_t row_hash = 0;    // XXH3 of the catalog row it was loaded from (0: not loaded)
  LayoutPtr current;        // NVMe copy (null: none)
  bool on_host = false;     // memory copy in host (buffer empty when nbytes == 0)
  PinnedBuffer host;
  bool on_device = false;
  std::shared_ptr<DeviceMem> dev;
  bool dirty = false;       // memory copy newer than `current`
  int pins = 0;
  /// A prefetch() brought the memory copy up and no read has used it yet (prefetch_hits).
  std::atomic<bool> prefetched{false};
  bool in_lru = false;
  std::list<std::shared_ptr<Obj>>::iterator lru_it;

  Tier tier() const { return on_device ? Tier::kDevice : on_host ? Tier::kHost : Tier::kNvme; }
  void* mem() const {
    if (on_device) return dev ? dev->ptr : nullptr;
    if (on_host) return host.data();
    return nullptr;
  }
};
using ObjPtr = std::shared_ptr<Obj>;

// ---------------------------------------------------------------- the store

class StoreImpl final : public Store {
 public:
  ~StoreImpl() override;

  /// Opens the store (Store::open): the steps below, in order. On an error the object is
  /// destroyed unopened.
  Status init(StoreOptions options);

  // ---- Store API (store.hpp documents each call)
  Future<void> put_async(const std::string& key, const void* src, const TensorDesc& desc,
                         const PutOptions& opts) override;
  Future<void> get_async(const std::string& key, void* dst, const TensorDesc& desc) override {
    return get_impl(key, dst, desc.nbytes(), &desc);
  }
  Future<void> get_bytes_async(const std::string& key, void* dst, uint64_t nbytes) override {
    return get_impl(key, dst, nbytes, nullptr);
  }
  Future<void> get_alloc_async(const std::string& key,
                               std::function<Result<void*>(const TensorDesc&)> allocate) override;
  Future<void> read_range_async(const std::string& key, uint64_t off, uint64_t n, void* dst) override;
  Future<void> write_range_async(const std::string& key, uint64_t off, uint64_t n,
                                 const void* src) override;
  Future<void> move_async(const std::string& key, Tier tier) override {
    return run_op(true, [=, this] { return move_impl(key, tier, false); });
  }
  Future<void> prefetch_async(const std::string& key, Tier tier) override {
    return run_op(true, [=, this] { return move_impl(key, tier, true); });
  }
  Future<void> evict_async(const std::string& key) override {
    return run_op(true, [=, this] { return move_impl(key, Tier::kNvme, false); });
  }
  Future<void> pin_async(const std::string& key) override;
  Future<void> unpin_async(const std::string& key) override;
  Future<void> remove_async(const std::string& key) override;
  Future<void> flush_async() override {
    return run_op(true, [this] { return flush_impl(nullptr); });
  }
  Status hold(const std::vector<std::string>& keys) override;
  void release(const std::vector<std::string>& keys) override;
  Future<void> commit_async(std::vector<std::string> keys) override {
    return run_op(true, [this, keys = std::move(keys)] { return flush_impl(&keys); });
  }
  Result<ObjectInfo> stat(const std::string& key) const override;
  std::vector<ObjectInfo> list(std::string_view prefix) const override;
  bool contains(const std::string& key) const override;
  Result<VerifyReport> verify() override;
  StoreUsage usage() const override;
  StoreStats stats() const override;
  void reset_stats() override;
  Result<std::vector<NvmeDirSpace>> nvme_space() const override;
  uint64_t chunk_bytes() const override { return chunk_bytes_; }
  const StoreOptions& options() const override { return opts_; }
  std::shared_ptr<IoEngine> engine() const override { return engine_; }
  bool has_device() const override { return has_device_; }
  Status set_device_stream(void* stream) override;
  const StorePlacement& placement() const override { return placement_; }
  Status close() override { return close_impl(true); }
  Result<Savepoint> savepoint(const std::vector<std::string>& keys) override;
  Status rollback(const Savepoint& sp) override;

 private:
  // ---- store_open.cpp: open, in steps (each returns what makes the open fail)
  /// Checks `opts_` before anything is created. \error InvalidArgument naming the field.
  Status check_options() const;
  /// Creates (with `create`) and normalizes the store root; opts_.path becomes absolute.
  Status open_root();
  /// Refuses a directory that is not a store (NotFound, DataLoss for orphaned data files)
  /// before and again after taking the lock; takes the lock (writable opens).
  Status lock_and_check_catalog(const std::string& cat_path);
  /// Opens the catalog (releasing the ballast first on a nearly full file system).
  Status open_catalog(const std::string& cat_path);
  /// Records (new store) or checks (reopen) the store's uuid, chunk_bytes and nvme_dirs.
  Status load_identity(const std::string& cat_path);
  /// The NVMe directories: identity markers (store_dirs.cpp), created when missing.
  Status prepare_directories();
  /// NUMA placement, then one I/O engine per node of the directories.
  Status start_engines();
  /// Fills placement_ (placement.hpp) for dirs_ and the store's GPU (has_device_).
  /// \error InvalidArgument for a bad StoreOptions::numa_node.
  Status plan_placement();
  /// Opens <dir>/strata-<uuid>.data in every NVMe directory.
  Status open_data_files();
  /// Catalog rows -> the object table and the allocator's used extents.
  Status load_objects();
  /// Pinned staging memory (per engine group), the host tier, the device budget.
  Status create_pools();
  /// close(); when the write-back fails and `stay_open_on_failure`, the store reopens for
  /// operations and returns the error (the destructor passes false: it always closes).
  Status close_impl(bool stay_open_on_failure);

  // ---- store_open.cpp: admission of operations
  template <class F>
  Future<void> run_op(bool mutating, F f);
  /// Like run_op(), but `f` returns Future<void>: the worker does not wait for it, and the
  /// operation ends (end_op()) when that future completes.
  template <class F>
  Future<void> run_op_async(bool mutating, F f);
  /// Admits an operation (writable when `mutating`, store not closing) and counts it in
  /// flight; end_op() uncounts it and wakes close().
  Status begin_op(bool mutating) const;
  void end_op() const;
  /// A synchronous call that is not an operation of run_op (stat, list, contains, usage,
  /// verify) counted in flight like one, so close() waits for it and does not free what it
  /// uses; `status` is FailedPrecondition when the store is closed (or closing).
  struct CallScope {
    explicit CallScope(const StoreImpl* s) : self(s), status(s->begin_op(false)) {}
    ~CallScope() {
      if (status.ok()) self->end_op();
    }
    CallScope(const CallScope&) = delete;
    CallScope& operator=(const CallScope&) = delete;
    const StoreImpl* self;
    Status status;
  };
  Status check_writable() const;

  // ---- store_files.cpp: the lock file, data file space, the catalog ballast
  /// Takes <root>/LOCK (flock) and writes this pid into it.
  /// \error FailedPrecondition naming the holder's pid when another process holds it.
  Status acquire_lock(const std::string& root);
  void release_lock();
  /// Grows the data file of `dir` (fallocate) so that [0, end) is allocated before a
  /// direct write lands there: O_DIRECT writes past EOF extend i_size one at a time.
  Status ensure_file_size(uint32_t dir, uint64_t end);
  /// After a failed write (put, write_range, flush, demotion), once its new extents are
  /// released: gives back data file space preallocated past the allocator's end.
  void trim_data_files();
  /// After a commit: punches holes (fallocate PUNCH_HOLE, size kept) over the data files'
  /// free extents, e.g. the copy-on-write originals the commit stopped naming, and over
  /// their preallocated tails, so a store holds on disk about what its objects take.
  /// With `keep_warm`, free extents and then the tail up to min(bytes live in the file, a
  /// quarter of the file system's free space) stay allocated for the next writes (the warm
  /// reserve); without (close, a full file system), every free extent and the tail are
  /// punched.
  /// Ranges stay unallocatable while punched; a file system without hole punching is
  /// tried once.
  void give_back_free_space(bool keep_warm);
  void give_back_free_space_locked(bool keep_warm);  // grow_mu_ held
  /// The catalog ballast: a small preallocated file beside catalog.db, deleted when a
  /// commit fails for lack of space so that the commit (e.g. a remove() freeing space) can
  /// go through, recreated after a later successful commit. Returns true when a ballast
  /// was there and is now deleted. Committer thread (and open) only.
  bool release_ballast();
  void restore_ballast();

  // ---- store_objects.cpp: the object table
  ObjPtr find(const std::string& key) const;
  /// An in-memory object for a committed catalog row. With `alloc`, its extents are adopted
  /// by the allocator (open); without (read-only catch-up), they are only read. `adopt`
  /// (may be empty) marks the chunks to keep (the others overlap or lie outside the store).
  ObjPtr obj_from_row(const catalog::ObjectRow& r, const std::vector<bool>& adopt,
                      bool alloc) const;
  catalog::ObjectRow row_of(const Obj& o, const Layout& l) const;
  /// The live version of `key`, its io lock held (exclusive or shared); null when absent.
  ObjPtr lock_live(const std::string& key) { return lock_live_as(key, false); }
  ObjPtr lock_live_shared(const std::string& key) { return lock_live_as(key, true); }
  ObjPtr lock_live_as(const std::string& key, bool shared);
  /// NotFound "object '<key>' is not in store <path>".
  Status missing(const std::string& key) const;
  /// DataLoss naming the damage when the catalog row of `o` is damaged; else OK.
  Status check_damage(const Obj& o) const;
  /// Where version `o`'s bytes are now (under mu_): its memory copy, if any, and its NVMe
  /// layout. The caller holds o.io (shared or exclusive), so neither goes away meanwhile.
  struct Copies {
    uint8_t* mem;     // the host or device copy (null: none, or an empty object)
    bool mem_dev;     // `mem` is device memory
    bool mem_tier;    // the object is in a memory tier (host or device)
    LayoutPtr nvme;   // NVMe copy (null: none)
  };
  Copies copies(const Obj& o) const;
  void install_locked(const ObjPtr& obj);  // under mu_
  /// Runs `attempt` on the object `key` (NotFound when absent): the lookup every read goes
  /// through. In a read-only open, a NotFound or DataLoss is checked against the key's
  /// current catalog row first: when a writer changed it, the attempt runs again on the new
  /// version (at most 8 retries; retry_after_catch_up(), store_readonly.cpp).
  Future<void> with_current_object_async(
      const std::string& key, std::function<Future<void>(const ObjPtr&)> attempt,
      int retries = 0);

  // ---- store_readonly.cpp: following another process's writer
  /// The catch-up step of a read-only open, like RocksDB's TryCatchUpWithPrimary for one
  /// key; a no-op returning false in a writable open. Another process may hold the store
  /// open for writing and may have created, replaced or removed `key` (and reused its
  /// extents) since this open read it: re-reads the key's committed row and installs it in
  /// the object table, when the table still maps `key` to `seen` (the version the caller
  /// found; null: absent).
  /// \returns true when the table's version of `key` is now other than `seen`.
  /// \error what reading the catalog returns; the table is then unchanged.
  /// \threadsafety safe (one catalog reader at a time: refresh_mu_); const because the
  ///     object table of a read-only open is a cached view (objects_ is mutable).
  Result<bool> catch_up(const std::string& key, const ObjPtr& seen) const;
  /// The catch-up step for every key starting with `prefix` (new, changed and removed
  /// keys); a no-op in a writable open. \error as catch_up().
  Status catch_up_prefix(const std::string& prefix) const;
  /// Installs committed `row` in the object table unless the table's version of its key
  /// came from the same row; true when it changed. Under mu_.
  bool install_row_locked(const catalog::ObjectRow& row) const;
  /// The retry step of with_current_object_async() in a read-only open: when `r` (the
  /// result of an attempt on `seen`, the version found; null: absent) is a NotFound or
  /// DataLoss and fewer than 8 retries ran, catches up with the key's current catalog row
  /// on a worker (it reads the catalog: never on a completion thread) and, when a writer
  /// changed it, runs `attempt` again on the new version; else `r` stands.
  Future<void> retry_after_catch_up(const std::string& key, const ObjPtr& seen,
                                    const std::function<Future<void>(const ObjPtr&)>& attempt,
                                    int retries, const Result<void>& r);

  // ---- store_commit.cpp: group commit
  struct CommitReq {
    std::vector<catalog::Op> ops;
    std::function<void(bool)> on_done;  // under mu_, after the transaction (true: committed)
    Promise<void> promise;
  };
  Future<void> enqueue_commit(std::vector<catalog::Op> ops, std::function<void(bool)> on_done);
  void committer_loop();
  /// Uncounts one commit of `key` enqueued by an operation (inflight_), under mu_.
  void end_inflight_locked(const std::string& key) {
    if (--inflight_[key] == 0) inflight_.erase(key);
  }

  // ---- store_datapath.cpp: chunk I/O
  /// Writes a new version of `nbytes` from `src` into newly placed extents (put, flush,
  /// demotion). On failure the new extents are released and the data files trimmed.
  /// `chunk`: bytes per chunk (Obj::chunk). `repeat` (PutOptions::repeat_bytes, a multiple
  /// of `chunk`): `src` holds that many bytes, repeated; 0: all `nbytes`.
  Result<LayoutPtr> write_layout(const std::string& key, const uint8_t* src, uint64_t nbytes,
                                 uint32_t first_dir, bool src_dev, uint64_t chunk,
                                 uint64_t repeat = 0);
  Result<LayoutPtr> write_layout_once(const std::string& key, const uint8_t* src,
                                      uint64_t nbytes, uint32_t first_dir, bool src_dev,
                                      uint64_t chunk, uint64_t repeat);
  // Reads and write_range run completion-driven: the calling thread (a worker) plans the
  // transfer, allocates staging memory and submits; each later step runs on the thread
  // that completed the step before it (an engine completion thread), except the CPU work
  // of a piece (verifying it, copying out of or into a staging buffer) and what follows it
  // (submitting the next piece, the next chunk), which runs on cpu_pool_: hashing on the
  // engine's one ring thread kept it from reaping and submitting (the queue ran dry at
  // high bandwidth), and the pool spreads concurrent transfers' hashing over cores. That
  // pool is not the worker pool: workers block in operations that stay synchronous (move,
  // pin, remove, flush: lock_live() and the exclusive io lock), so a read whose last step
  // needed a worker could wait for a worker that waits for that read's shared lock
  // (worker_threads = 1 deadlocks); cpu_pool_'s tasks never block.

  /// What a staged write does before filling a piece (read-modify-write: read the old
  /// bytes into `buf`); may be null.
  using PieceLoad = std::function<Future<uint64_t>(uint8_t* buf, uint64_t off, uint64_t n)>;
  /// Fills `n` bytes at `buf` with the chunk's bytes [off, off + n); in piece order.
  using PieceFill = std::function<Status(uint8_t* buf, uint64_t off, uint64_t n)>;
  /// Takes the `n` bytes at `buf` that are the chunk's bytes [off, off + n); in order.
  using PieceSink = std::function<Status(const uint8_t* buf, uint64_t off, uint64_t n)>;
  /// Staging pieces for a transfer of `span` bytes of one chunk.
  uint64_t staged_piece(uint64_t span) const {
    return std::min(piece_bytes_, align_up(std::max<uint64_t>(span, 1), kAlign));
  }
  /// The XXH3 stream of a transfer's pieces, hashed as they go through.
  struct Hashed {
    Xxh3Stream h;
  };
  /// The finish step of a verified chunk read: DataLoss (checksum_error) when what `hashed`
  /// saw does not match chunk `c` (number `j`, at object offset `cs`).
  std::function<Status()> checksum_check(const std::string& key, uint32_t j, uint64_t cs,
                                         const ChunkRef& c,
                                         std::shared_ptr<const Hashed> hashed) const;
  /// Reads bytes [off, off + n) of layout `l` into `dst` (device memory when `dst_dev`),
  /// verifying each chunk read whole (all of it is read when `verify`). Staging memory is
  /// allocated here, before anything is submitted; the future completes (on an engine
  /// thread) once every piece in flight has completed, with the lowest chunk's error.
  Future<void> read_layout_async(const std::string& key, LayoutPtr l, uint64_t off, uint64_t n,
                                 uint8_t* dst, bool dst_dev, bool verify);
  /// read_layout_async(), waited for (promotion, on a worker holding the exclusive lock).
  Status read_layout(const std::string& key, LayoutPtr l, uint64_t off, uint64_t n,
                     uint8_t* dst, bool dst_dev, bool verify);
  /// One whole chunk `c` (number `j`, at object offset `cs`) straight into aligned host
  /// memory `d`.
  Future<void> direct_read_async(const std::string& key, uint32_t j, uint64_t cs,
                                 const ChunkRef& c, uint8_t* d, bool verify);
  /// Bytes [lo, hi) of chunk `c` (number `j`, at object offset `cs`) through the staging
  /// memory `buf` (two pieces of at most `piece_cap` bytes), handed to `sink` in order.
  Future<void> staged_read_async(const std::string& key, uint32_t j, uint64_t cs,
                                 const ChunkRef& c, uint64_t lo, uint64_t hi, bool verify,
                                 uint8_t* buf, uint64_t piece_cap, PieceSink sink);
  /// staged_read_async() with its own staging memory, waited for (verify()).
  Status staged_read_chunk(const std::string& key, uint32_t j, uint64_t cs, const ChunkRef& c,
                           uint64_t lo, uint64_t hi, bool verify, PieceSink sink);
  /// Writes `len` bytes into extent `ext` through `buf` (two pieces of `piece` bytes): each
  /// piece loaded (optional), filled, hashed, zero-padded to 4 KiB and written.
  /// \returns future of the XXH3-64 of the `len` bytes.
  Future<uint64_t> staged_write_async(const Extent& ext, uint64_t len, uint8_t* buf,
                                      uint64_t piece, PieceLoad load, PieceFill fill);
  /// staged_write_async() with its own staging memory, waited for (put, write-back).
  Result<uint64_t> staged_write_chunk(const Extent& ext, uint64_t len, PieceFill fill);
  /// Copies `n` bytes, through a CUDA stream when `any_dev` (either side device memory).
  Status copy_mem(void* dst, const void* src, uint64_t n, bool any_dev);
  /// Submits the write of `len` bytes from host memory `s` (aligned for O_DIRECT on the
  /// data file of NVMe directory `dir`) at `offset` (4 KiB-aligned); a partial last 4 KiB
  /// block goes through a zero-padded block appended to `tails`. Appends the engine futures
  /// to `futs` (the caller waits for them, and hashes `s` while they are in flight).
  void write_direct(uint32_t dir, const uint8_t* s, uint64_t len, uint64_t offset,
                    std::vector<Future<uint64_t>>& futs, std::vector<AlignedBlock>& tails);
  /// Pinned staging memory of `nbytes` from the pool serving NVMe directory `dir` (on its
  /// NUMA node).
  Result<PinnedBuffer> staging(uint32_t dir, uint64_t nbytes);
  /// The I/O engine serving NVMe directory `dir` (its threads on the directory's node).
  IoEngine& io(uint32_t dir) { return *groups_[dir_group_[dir]].engine; }
  Status checksum_error(const std::string& key, uint32_t j, uint64_t chunk_start,
                        const ChunkRef& c, uint64_t got) const;
  void mark_dir_dirty(uint32_t dir) { dir_dirty_[dir].store(true); }

  // ---- store_tiers.cpp: LRU and tier changes
  Result<PinnedBuffer> alloc_host(uint64_t nbytes, const Obj* self);
  Result<std::shared_ptr<DeviceMem>> alloc_device(uint64_t nbytes, const Obj* self);
  /// The least recently used version of the device (else host) tier that is not `self`,
  /// not pinned and not busy, its io lock held exclusively; null when none.
  ObjPtr pick_victim(bool device, const Obj* self);
  /// Demotes pick_victim()'s version to NVMe. \returns false when nothing is evictable.
  /// \error the demotion's, naming the victim.
  Result<bool> evict_one(bool device, const Obj* self);
  Status demote_locked(const ObjPtr& o);  // o exclusively locked
  Status promote_locked(const ObjPtr& o, Tier tier);
  /// Counts a tier change of `o` (promotion or eviction) done by promote_locked().
  void count_move_locked(const Obj& o, Tier from, Tier to);
  Status move_impl(const std::string& key, Tier tier, bool prefetch_only);
  void lru_add_locked(const ObjPtr& o);
  void lru_remove_locked(const ObjPtr& o);
  void lru_touch(const ObjPtr& o);

  // ---- store_ops.cpp: the data operations
  /// Reads [off, off + n) of version `o` into `dst`: from its memory copy at once, else
  /// from NVMe (read_layout_async), holding `o->io` shared until the last step.
  Future<void> read_async(const ObjPtr& o, uint64_t off, uint64_t n, uint8_t* dst);
  Future<void> get_impl(const std::string& key, void* dst, uint64_t nbytes,
                        const TensorDesc* desc);
  /// write_range of an object only in NVMe (`cur`: its layout), copy-on-write per chunk;
  /// the caller holds `o->io` shared until the future completes.
  Future<void> write_range_nvme(const ObjPtr& o, LayoutPtr cur, uint64_t off, uint64_t n,
                                const uint8_t* src, bool src_dev);
  /// flush() (`only` null: every key not held) or commit() (`only`: those keys).
  Status flush_impl(const std::vector<std::string>* only);

  // ---- store_query.cpp
  ObjectInfo info_locked(const Obj& o) const;

  // ---- state
  StoreOptions opts_;
  std::vector<std::string> dirs_;
  uint64_t chunk_bytes_ = 0;
  uint64_t piece_bytes_ = 0;
  std::string uuid_;
  int lock_fd_ = -1;
  mutable std::mutex refresh_mu_;  // read-only opens: one catalog reader at a time
  std::string ballast_path_;       // <root>/catalog.ballast ("" when read-only)
  std::atomic<bool> ballast_missing_{false};  // written by the committer thread (and open)
  bool read_only_ = false;
  bool has_device_ = false;
  std::atomic<void*> device_stream_{nullptr};  // the caller's cudaStream_t, or null
  uint64_t device_budget_ = 0;
  std::shared_ptr<std::atomic<uint64_t>> device_used_ = std::make_shared<std::atomic<uint64_t>>(0);

  std::shared_ptr<IoEngine> engine_;  // groups_[0]'s: engine(), shared with the optimizer
  /// NUMA placement (placement.hpp): one I/O engine and one staging pool per distinct node
  /// of the NVMe directories; dir_group_[d] indexes the group serving directory d.
  struct IoGroup {
    int node = -1;
    std::shared_ptr<IoEngine> engine;
    std::shared_ptr<PinnedPool> staging;
  };
  StorePlacement placement_;
  std::vector<IoGroup> groups_;
  std::vector<uint32_t> dir_group_;
  std::vector<std::shared_ptr<IoFile>> files_;
  std::unique_ptr<std::atomic<bool>[]> dir_dirty_;
  std::vector<int> grow_fds_;                 // plain fds of the data files, for fallocate
  std::atomic<bool> punch_unsupported_{false};  // a data file's file system cannot punch holes
  // The catalog had damaged rows at open: space no row names may still hold the bytes of
  // an object whose row is damaged, so none is trimmed or punched out (until a reopen of a
  // whole catalog).
  bool keep_unreferenced_space_ = false;
  std::unique_ptr<std::atomic<uint64_t>[]> file_end_;  // allocated size of each data file
  std::mutex grow_mu_;
  std::shared_ptr<ExtentAllocator> alloc_;
  std::shared_ptr<PinnedPool> host_pool_;
  std::unique_ptr<catalog::Catalog> catalog_;

  /// The counters (Store::stats()): relaxed atomics, bumped on the data path without a lock;
  /// mutable because const paths (checksum checks) count too.
  mutable StoreCounters counters_;
  std::unique_ptr<StatsLogger> stats_logger_;  // StoreOptions::stats_interval > 0

  mutable std::mutex mu_;
  /// key -> live version. In a read-only open, the cached view of the writer's committed
  /// catalog that catch_up() refreshes, also from const queries (stat, list, contains):
  /// hence mutable. No other const member writes it.
  mutable std::map<std::string, ObjPtr> objects_;
  std::unordered_map<std::string, LayoutPtr> durable_;
  std::unordered_map<std::string, int> pending_creates_;
  std::unordered_map<std::string, int> inflight_;  // commits enqueued, not yet applied, per key
  std::unordered_set<std::string> held_;  // hold(): left out of flush() and close()
  std::list<ObjPtr> host_lru_, device_lru_;
  std::atomic<uint32_t> next_dir_{0};

  std::mutex commit_mu_;
  std::condition_variable commit_cv_;
  std::deque<std::shared_ptr<CommitReq>> commit_q_;
  bool commit_stop_ = false;
  std::thread committer_;

  std::unique_ptr<ThreadPool> pool_;  // StoreOptions::worker_threads workers (run_op)
  // The data path's CPU steps (PieceSteps::cpu): min(cores - 1, 8) threads, at least 1.
  std::unique_ptr<ThreadPool> cpu_pool_;
  // Admission: begin_op()/end_op(), also from const queries (CallScope).
  mutable std::mutex ops_mu_;
  mutable std::condition_variable ops_cv_;
  mutable uint64_t ops_in_flight_ = 0;
  std::atomic<bool> closed_{false};
  bool closing_ = false;
  bool started_ = false;
};

// ---------------------------------------------------------------- templates

template <class F>
Future<void> StoreImpl::run_op(bool mutating, F f) {
  // The synchronous body's Status, as the ready future run_op_async continues from.
  return run_op_async(mutating, [f = std::move(f)]() mutable {
    return make_ready_future(Result<void>(f()));
  });
}

template <class F>
Future<void> StoreImpl::run_op_async(bool mutating, F f) {
  if (Status st = begin_op(mutating); !st.ok()) return make_ready_future(Result<void>(st));
  auto p = std::make_shared<Promise<void>>();
  Future<void> fut = p->future();
  pool_->submit([this, p, f = std::move(f)]() mutable {
    f().on_ready([this, p](const Result<void>& r) {
      p->set(r);
      end_op();
    });
  });
  return fut;
}

}  // namespace strata::store_detail
