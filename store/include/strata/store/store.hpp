// strata::store — the tiered object store: named tensors in GPU HBM, pinned DRAM and NVMe,
// moved between tiers asynchronously, with a durable, crash-consistent catalog.
//
// A store is a root directory holding the catalog (SQLite, WAL mode) and a lock file, plus
// one or more NVMe directories (default: the root itself) holding the data files. An
// object's bytes are cut into chunks of `chunk_bytes`; chunk j of an object lives in NVMe
// directory (first_dir + j) % k (RAID-0 over the directories), as one 4 KiB-aligned extent
// of the store's data file there. Each chunk carries an XXH3-64 checksum of its bytes.
//
// DURABILITY CONTRACT (see docs/store.md):
//  - put(..., tier = kNvme) with Durability::kOnPut (the default): when the future is ready
//    and OK, the chunks were written with O_DIRECT, fdatasync'ed, and then the catalog row
//    was committed (SQLite WAL, synchronous=FULL): the object survives a crash or power loss.
//    Before that point a crash leaves the previous version (or no object): never a mix.
//  - put(..., tier = kHost or kDevice) keeps the object in memory only ("dirty"): it is
//    durable after the next flush(), close(), evict() or an LRU eviction to NVMe.
//  - write_range() on an object resident only in NVMe is copy-on-write per chunk: updated
//    chunks go to fresh extents; the catalog still names the old ones until flush(). A
//    crash before flush() restores every chunk as of the last flush: flush() is a
//    consistent checkpoint of all write_range() updates since the previous one.
//  - flush() writes back every dirty object, fdatasyncs, and commits all pending changes
//    in one catalog transaction.
//  - With Durability::kOnFlush, NVMe puts are also committed only by flush()/close().
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/base/future.hpp"
#include "strata/base/status.hpp"
#include "strata/base/dtype.hpp"
#include "strata/store/io_engine.hpp"
#include "strata/store/pinned_pool.hpp"
#include "strata/store/placement.hpp"
#include "strata/store/stats.hpp"

namespace strata {

namespace store_detail {
class StoreImpl;
}

/// Memory tiers, fastest first. Stable values (persisted, C API).
enum class Tier : uint8_t {
  kDevice = 0,  ///< GPU HBM (CUDA builds with a GPU only)
  kHost = 1,    ///< pinned host DRAM
  kNvme = 2,    ///< data files in the NVMe directories
};

/// "device" | "host" | "nvme".
std::string_view tier_name(Tier t);
/// Parses "device"/"gpu"/"hbm", "host"/"dram"/"cpu", "nvme"/"disk". nullopt when unknown.
std::optional<Tier> tier_from_name(std::string_view s);

/// When a put into the NVMe tier becomes durable (see the contract above).
enum class Durability {
  kOnPut,    ///< each NVMe put is fdatasync'ed and committed before its future is ready
  kOnFlush,  ///< NVMe puts are committed (in one transaction) by flush() / close()
};

/// Options of Store::open(). Every field states its default and unit. Defaults marked
/// (ENV) are seeded from that environment variable by StoreOptions::from_env().
struct StoreOptions {
  /// Root directory: catalog (catalog.db) and lock file (LOCK). Created when absent and
  /// `create` is set. Required.
  std::string path{};
  /// NVMe directories (one per device) over which chunks are striped. Default: {path}.
  /// When reopening, must be empty or equal to the set recorded at creation.
  std::vector<std::string> nvme_dirs{};
  /// Bytes of pinned DRAM for host-tier objects. Default 1 GiB (STRATA_HOST_BUDGET).
  uint64_t host_budget_bytes = 1ull << 30;
  /// Bytes of data in the NVMe tier (sum of chunk extents). 0 = unlimited (bounded by the
  /// free space of the directories). Default 0 (STRATA_NVME_BUDGET).
  uint64_t nvme_budget_bytes = 0;
  /// Bytes of GPU memory for device-tier objects. 0 = half of the free memory at open.
  /// Ignored without a GPU. Default 0 (STRATA_DEVICE_BUDGET).
  uint64_t device_budget_bytes = 0;
  /// CUDA device ordinal of the device tier. Default 0.
  int device_id = 0;
  /// Chunk size in bytes for new stores (a multiple of 4096); an existing store keeps the
  /// value recorded at creation. Default 64 MiB (STRATA_CHUNK_SIZE).
  uint64_t chunk_bytes = 64ull << 20;
  /// Bytes of pinned staging memory for streaming (unaligned caller buffers, device
  /// transfers, read-modify-write). Default 256 MiB (STRATA_STAGING_BYTES).
  uint64_t staging_bytes = 256ull << 20;
  /// Bytes each pinned pool of the store (every staging pool and the host tier's) commits
  /// when the store opens, rounded up to 2 MiB and capped by the pool's budget; the pools
  /// grow on demand up to staging_bytes / host_budget_bytes (docs/pinned-memory.md). 0 =
  /// nothing until first use. Default 8 MiB (STRATA_PINNED_INITIAL): a store opened with
  /// the defaults on one NUMA node commits 16 MiB of pinned memory, not 1.25 GiB.
  uint64_t pinned_initial_bytes = 8ull << 20;
  /// Least bytes a pool commits when it grows (a larger request commits itself, rounded up
  /// to 2 MiB), capped by the pool's budget. Default 64 MiB; > 0 (STRATA_PINNED_GROW).
  uint64_t pinned_grow_bytes = 64ull << 20;
  /// Where the store's pinned pools get their memory (a framework's pinned-memory
  /// allocator; see PinnedAllocator): called once per segment with the segment's size and
  /// NUMA node; each block freed when its pool is released (at close() at the latest).
  /// Default: none (strata maps its own). \error (open) InvalidArgument when only one of
  /// alloc/free is set or the memory is misaligned; ResourceExhausted when alloc returns
  /// NULL.
  PinnedAllocator pinned_allocator{};
  /// A cudaStream_t (as void*) of the caller's on which the store orders its device-tier
  /// copies (host<->device, device<->device) instead of streams of its own; the store
  /// still waits for each copy before the operation that issued it completes. It must
  /// belong to device_id's context and outlive the store. Default nullptr: the store's own
  /// streams. \error (open) InvalidArgument when set in a build without CUDA or without a
  /// GPU; set with Store::set_device_stream() too.
  void* device_stream = nullptr;
  /// Verify chunk checksums on every read from NVMe. Default true (STRATA_VERIFY).
  bool verify_checksums = true;
  /// See Durability. Default kOnPut.
  Durability durability = Durability::kOnPut;
  /// Open without the write lock; every mutating call fails with FailedPrecondition.
  /// Default false.
  bool read_only = false;
  /// Create the store when `path` holds none. Default true.
  bool create = true;
  /// When the catalog is missing but strata data files (or identity markers) lie in the
  /// root or the NVMe directories, create a new empty store beside them instead of failing
  /// with DataLoss. The orphaned files are left alone. Default false.
  bool recreate_catalog = false;
  /// Threads that start store operations. Reads (get, get_bytes, get_alloc, read_range)
  /// and write_range of NVMe objects hold a worker only to plan and submit their I/O (and
  /// while staging memory is short); the rest of such an operation runs as the engine
  /// completes it, so how many are in flight does not depend on this number. put, move,
  /// prefetch, evict, pin, remove and flush run on a worker from start to end. Default 4;
  /// 1 to kMaxWorkerThreads (InvalidArgument otherwise).
  uint32_t worker_threads = 4;
  static constexpr uint32_t kMaxWorkerThreads = 1024;
  /// NUMA placement (placement.hpp). kNumaAuto (-1, default): from the topology, each NVMe
  /// directory's staging memory and I/O threads on the node nearest its block device, the
  /// host tier near the GPU (or where most directories are); kNumaNone (-2): no binding;
  /// a node number: everything on that node (InvalidArgument when the machine lacks it).
  /// Directories on one node share an I/O engine and a staging pool (staging_bytes each).
  /// With a shared `engine`, only the memory is placed.
  int numa_node = -1;
  /// Options of the I/O engine the store creates (when `engine` is null).
  IoEngineOptions engine_options{};
  /// An engine to share (e.g. with the optimizer); null = the store creates its own.
  std::shared_ptr<IoEngine> engine{};
  /// > 0: every interval, one line of the counters' deltas (Store::stats(),
  /// format_stats_line()) to stderr, "strata [stats] ROOT interval=...", from a thread of
  /// the store's, until close(). Default 0 = off (STRATA_STATS_INTERVAL, in seconds, e.g.
  /// "10" or "0.5").
  std::chrono::milliseconds stats_interval{0};

  /// The configuration file these options were read from (from_env(), from_config()), ""
  /// when none: what the optimizer bindings read their "optimizer" section from. Only
  /// informational for the store.
  std::string config_file{};

  /// Defaults overridden by the configuration file's "store" and "io" sections
  /// ($STRATA_CONFIG; see config.hpp), then by the STRATA_* variables above (and
  /// IoEngineOptions::from_env()'s).
  /// \error InvalidArgument naming the variable on a malformed value; what Config::load()
  ///     returns for the file.
  static Result<StoreOptions> from_env();
  /// As from_env(), with `config_file` instead of $STRATA_CONFIG when non-empty.
  static Result<StoreOptions> from_config(const std::string& config_file);
};

/// Shape and dtype of a tensor: nbytes = numel * dtype_size(dtype); a 0-d shape {} is a
/// scalar (numel 1); any 0 extent makes numel 0.
struct TensorDesc {
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;

  uint64_t numel() const;
  uint64_t nbytes() const { return numel() * dtype_size(dtype); }
  /// A 1-d uint8 tensor of `nbytes` elements (raw bytes).
  static TensorDesc bytes(uint64_t nbytes) { return {DType::kUInt8, {static_cast<int64_t>(nbytes)}}; }
};

/// "float32[2, 3]".
std::string to_string(const TensorDesc& d);

/// What stat()/list() report about an object.
struct ObjectInfo {
  std::string key;
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
  Tier tier = Tier::kNvme;  ///< fastest tier holding the current bytes
  bool on_nvme = false;     ///< an NVMe copy exists (it may be stale when dirty)
  bool dirty = false;       ///< the in-memory copy (or a pending write_range) is not yet durable
  bool pinned = false;
  uint32_t num_chunks = 0;  ///< chunks of the NVMe copy
  /// Bytes per chunk of its NVMe copies (PutOptions::chunk_bytes; the last chunk may be
  /// shorter).
  uint64_t chunk_bytes = 0;
  /// Non-empty when the object's catalog row is damaged (e.g. chunk sizes that do not add
  /// up to nbytes): what is wrong, naming the key. Reads of it fail with DataLoss; put with
  /// overwrite or remove() replace it. The other objects are unaffected.
  std::string damage;
};

struct PutOptions {
  Tier tier = Tier::kNvme;  ///< tier that receives the object. Default nvme.
  /// Replace an existing key (else AlreadyExists). Default false. The new version replaces
  /// the old one whole: its tier and pin come from these options, and the old version's
  /// pins end with it (a later unpin of the key is FailedPrecondition unless `pin`).
  bool overwrite = false;
  bool pin = false;         ///< pin at once (host/device tiers only). Default false.
  /// Bytes per chunk of this object's NVMe copies (the unit of a checksum, of striping
  /// and of read_range/write_range's read-modify-write): a multiple of 4096 up to the
  /// store's chunk_bytes(); 0 (default) = chunk_bytes(). A client that reads and writes
  /// an object in slices smaller than the store's chunk (an optimizer's sub-groups) gives
  /// the slice size here, so each slice is whole chunks: read without reading its
  /// neighbours to verify, written without a read-modify-write. Kept by write_range and
  /// write-back; a later put without it uses chunk_bytes(). Reopening derives it from the
  /// catalog's chunk rows.
  /// \error InvalidArgument (put) for a value that is not a multiple of 4096 or exceeds
  ///     chunk_bytes().
  uint64_t chunk_bytes = 0;
  /// 0 (default): `src` holds the object's bytes. Else `src` holds repeat_bytes bytes that
  /// the object repeats (byte i of the object is src[i % repeat_bytes]): an object far
  /// larger than memory made from one small buffer -- a zero-filled object to write_range()
  /// into later, say. NVMe tier only; the object's chunks are written and checksummed as
  /// for any put.
  /// \error InvalidArgument (put) for another tier, or a value that is not a multiple of
  ///     the object's chunk bytes (chunk_bytes, else the store's).
  uint64_t repeat_bytes = 0;
};

/// Per-tier usage, in bytes.
struct StoreUsage {
  uint64_t device_bytes = 0, device_budget_bytes = 0;
  uint64_t host_bytes = 0, host_budget_bytes = 0;
  uint64_t nvme_bytes = 0, nvme_budget_bytes = 0;  ///< nvme_budget 0 = unlimited
  uint64_t objects = 0;
};

/// An extent (one chunk's NVMe copy) of at least this many times
/// NvmeDirSpace::extent_align_bytes starts on a multiple of extent_align_bytes (docs/store.md).
inline constexpr uint64_t kAlignedExtentFactor = 16;

/// The space of one NVMe directory (Store::nvme_space()), in bytes.
struct NvmeDirSpace {
  std::string path;  ///< the directory
  /// Its file system (st_dev): directories with one fs_id share its free_bytes.
  uint64_t fs_id = 0;
  /// Free for unprivileged use on that file system (statvfs f_bavail * f_frsize).
  uint64_t free_bytes = 0;
  /// Disk blocks the directory's data file holds beyond the extents in use (preallocated
  /// growth, free extents not yet punched): allocatable without taking free_bytes.
  uint64_t reusable_bytes = 0;
  uint64_t used_bytes = 0;  ///< extents in use (the NVMe copies of objects, every version)
  /// An extent of at least kAlignedExtentFactor x this many bytes starts on a multiple of
  /// it (a power of two, 4 KiB..4 MiB: the I/O engine's block size), so one that follows an
  /// extent ending off that boundary leaves a free gap of less than this before it
  /// (docs/store.md).
  uint64_t extent_align_bytes = 4096;
};

/// A verify() finding: a chunk whose bytes do not match its checksum (or cannot be read).
struct VerifyReport {
  uint64_t objects = 0;
  uint64_t chunks = 0;
  uint64_t bytes = 0;
  std::vector<Status> errors;  ///< DataLoss / IoError naming key, chunk and offset
};

/// The NVMe contents of some objects at one moment, restorable by Store::rollback(): a
/// transaction-abort for copy-on-write updates (write_range), such as a speculative optimizer
/// step. It holds the objects' chunk layouts of that moment, so the chunks that later
/// write_range() calls replace stay allocated on disk (not reused) while it lives: at most
/// one extra copy of what is rewritten. Copyable (copies share the layouts); destroying the
/// last copy releases them. Thread-safety: a const value, usable from any thread.
class Savepoint {
 public:
  Savepoint() = default;
  /// The keys saved, in the order given to Store::savepoint().
  const std::vector<std::string>& keys() const { return keys_; }
  bool empty() const { return keys_.empty(); }

 private:
  friend class store_detail::StoreImpl;
  std::vector<std::string> keys_;
  std::shared_ptr<const void> state_;  // the store's private record of the versions
};

/// The tiered object store. Create with Store::open(); close() (or the destructor) flushes.
///
/// Buffers: every `src`/`dst` passed to an async call must stay valid and unmodified
/// (src) / untouched (dst) until the returned future is ready. Buffers may be pageable or
/// pinned host memory; with CUDA, also device memory (detected with
/// cudaPointerGetAttributes). Host buffers aligned to 4096 bytes go to the disk with
/// O_DIRECT without a copy; others stream through the pinned staging buffers.
///
/// Errors (each leaves the store usable):
///  - NotFound: the key is absent.
///  - AlreadyExists: put of a present key without `overwrite`.
///  - InvalidArgument: dtype/shape/size mismatch on get, a bad option, Tier::kDevice without
///    a GPU (Unimplemented when built without CUDA).
///  - OutOfRange: read_range/write_range past the end of the object.
///  - ResourceExhausted: a tier budget is full and nothing is evictable (all pinned or
///    busy), the object is larger than the tier's budget, or a directory is out of space
///    (sys_errno() == ENOSPC, message names the path).
///  - DataLoss: a chunk's checksum does not match (message names key, chunk and offset).
///  - FailedPrecondition: store locked by another process ("store DIR is locked by pid N"),
///    store closed or read-only, evict of a pinned object.
///
/// Thread-safety: every member may be called concurrently from any thread. Concurrent
/// write_range() calls on one object must touch different chunks; a read concurrent with a
/// write of the same bytes returns the old or the new bytes of each chunk. A future may
/// complete on one of the store's worker threads or on an I/O engine completion thread:
/// callbacks registered on it (Future::on_ready/then) must be short and must not block.
class Store {
 public:
  /// Opens (or creates) the store at options.path and takes its write lock (unless
  /// read_only). Loads the catalog; space not referenced by any committed object (e.g.
  /// from a put interrupted by a crash) is reused.
  /// A catalog row that is damaged does not fail the open: that object is reported
  /// damaged (ObjectInfo::damage, verify()) and reading it fails with DataLoss.
  /// \error FailedPrecondition when another process holds the lock, or when an NVMe
  ///     directory outside the root holds the data file of another existing store of which
  ///     this one is a copy; NotFound when the store is absent and !create; InvalidArgument
  ///     for bad options, an empty path or one with a NUL byte, nvme_dirs listing one
  ///     directory twice (same realpath or st_dev/st_ino), or nvme_dirs that differ from
  ///     the recorded ones; DataLoss for a corrupt catalog, a catalog missing beside existing
  ///     data files (unless recreate_catalog), or a missing NVMe directory / data file that
  ///     the catalog says holds chunks; PermissionDenied (errno EROFS/EACCES) for a writable
  ///     open on a read-only filesystem or directory; IoError.
  static Result<std::unique_ptr<Store>> open(StoreOptions options);

  virtual ~Store() = default;

  /// Writes `desc.nbytes()` bytes from `src` as object `key` into `opts.tier`.
  /// \returns a future that completes once the put is done (durable as the contract above
  ///     says); `src` must stay valid until then. The errors below arrive through it.
  /// \error AlreadyExists, InvalidArgument (empty key, no GPU, a negative extent, a
  ///     shape whose numel or nbytes overflows 64 bits, a dtype or tier value outside its
  ///     enum, a null `src` for a non-empty tensor: nothing is written),
  ///     ResourceExhausted (budget/ENOSPC; data file space preallocated for the failed put
  ///     is given back), IoError, FailedPrecondition (closed/read-only).
  virtual Future<void> put_async(const std::string& key, const void* src, const TensorDesc& desc,
                                 const PutOptions& opts = {}) = 0;

  /// Reads object `key` into `dst` from its fastest tier. `desc` must equal the object's
  /// dtype and shape. Does not change the object's tier.
  /// \error NotFound; InvalidArgument naming both descs on a mismatch; DataLoss; IoError.
  virtual Future<void> get_async(const std::string& key, void* dst, const TensorDesc& desc) = 0;
  /// Reads object `key` into `dst` (`nbytes` must equal the object's size), any dtype.
  /// \error NotFound; InvalidArgument on a size mismatch; DataLoss; IoError.
  virtual Future<void> get_bytes_async(const std::string& key, void* dst, uint64_t nbytes) = 0;
  /// Reads object `key` whole, whatever its dtype and shape, into memory the caller
  /// provides once the version to read is known: `allocate(desc)` is called on a store
  /// worker thread with that version's dtype and shape and returns a destination of
  /// desc.nbytes() bytes (or an error, which becomes the future's). The bytes that land
  /// there are that version's, even when another thread overwrites `key` with another
  /// dtype or shape meanwhile (the version is fixed before `allocate` runs and cannot be
  /// freed until the read is done), so no stat-then-get retry loop is needed.
  /// `allocate` may run more than once only in a read-only open, when another process
  /// replaced the object meanwhile: the buffer of the last call holds the result.
  /// `allocate` must not call into this store.
  /// \error NotFound; DataLoss (a damaged object, a checksum mismatch); IoError;
  ///     InvalidArgument when `allocate` is empty or returns null for a non-empty object; whatever
  ///     `allocate` returns.
  virtual Future<void> get_alloc_async(const std::string& key,
                                       std::function<Result<void*>(const TensorDesc&)> allocate) = 0;

  /// Reads bytes [offset_bytes, offset_bytes + nbytes) of object `key` into `dst`.
  /// \error NotFound; OutOfRange past the end; DataLoss (whole chunks are verified).
  virtual Future<void> read_range_async(const std::string& key, uint64_t offset_bytes, uint64_t nbytes,
                                        void* dst) = 0;
  /// Overwrites bytes [offset_bytes, offset_bytes + nbytes) of object `key` from `src`,
  /// in whichever tier holds it; checksums of touched chunks are recomputed. Durable at the
  /// next flush() (copy-on-write for NVMe chunks; see the contract). Cheapest when the
  /// range covers whole chunks (multiples of chunk_bytes()); partial chunks are
  /// read-modify-written. All or nothing: for an NVMe-resident object the new chunks
  /// replace the old ones only once every one is written, so after an error the object
  /// reads as before and the data file space placed for the call is given back.
  /// \error NotFound; OutOfRange; ResourceExhausted; IoError; DataLoss (reading a partial
  ///     chunk).
  virtual Future<void> write_range_async(const std::string& key, uint64_t offset_bytes,
                                         uint64_t nbytes, const void* src) = 0;

  /// Moves object `key` to `tier`: promotion copies up and keeps the NVMe copy; demotion
  /// to kNvme writes back a dirty copy (committed before the future is ready) and frees
  /// the memory tiers. Pinned objects can move between host and device but not to kNvme.
  /// \error NotFound; InvalidArgument (a tier value outside the enum); ResourceExhausted;
  ///     FailedPrecondition (pinned to nvme); IoError.
  virtual Future<void> move_async(const std::string& key, Tier tier) = 0;
  /// Promotes `key` to `tier` (default host) unless it already is in that tier or a
  /// faster one. Errors as move().
  virtual Future<void> prefetch_async(const std::string& key, Tier tier = Tier::kHost) = 0;
  /// Demotes `key` to NVMe (write-back when dirty) and frees its memory.
  /// \error NotFound; FailedPrecondition when pinned.
  virtual Future<void> evict_async(const std::string& key) = 0;

  /// Pins / unpins `key` in its memory tier: a pinned object is never evicted by LRU.
  /// Pins nest (counted). Pinning an NVMe-only object first promotes it to host.
  /// \error NotFound; FailedPrecondition for unpin of an unpinned object.
  virtual Future<void> pin_async(const std::string& key) = 0;
  virtual Future<void> unpin_async(const std::string& key) = 0;

  /// Deletes `key` from every tier; committed before the future is ready (kOnPut).
  /// \error NotFound.
  virtual Future<void> remove_async(const std::string& key) = 0;

  /// Makes everything durable: writes back dirty objects, fdatasyncs, commits pending
  /// changes in one transaction. An object that cannot be written back (ResourceExhausted:
  /// NVMe budget or disk full; IoError) stays dirty in memory; every other object is still
  /// written back and committed, and the first such error is returned.
  virtual Future<void> flush_async() = 0;

  /// Holds `keys` out of flush() and close(): a held key's uncommitted changes (pending
  /// write_range chunks, a dirty memory copy, a put under Durability::kOnFlush) are
  /// committed only by commit(); flush() and close() leave them out, so a close() drops
  /// them and a reopen finds the key's last committed version. For an owner that keeps
  /// several objects consistent with one another (the offloaded optimizer: masters,
  /// states and the record naming their step) and must not have another user's flush()
  /// commit some of them. Puts committed at once (Durability::kOnPut to NVMe), remove(),
  /// evict() and demotions still commit the key they change. Keys need not exist; holding
  /// a held key again is a no-op. In memory only: holds end when the store closes.
  /// \error FailedPrecondition when the store is closed or read-only.
  virtual Status hold(const std::vector<std::string>& keys) = 0;
  /// Ends the holds of `keys` (keys not held are ignored): later flush() calls commit them.
  virtual void release(const std::vector<std::string>& keys) = 0;
  /// As flush(), for `keys` only (held or not; absent keys are skipped): writes back their
  /// dirty memory copies, fdatasyncs, and commits their pending changes in one catalog
  /// transaction, so after a crash either all of them or none show the changes since their
  /// previous commit. Errors as flush().
  virtual Future<void> commit_async(std::vector<std::string> keys) = 0;

  /// Metadata of `key`. \error NotFound; FailedPrecondition when the store is closed.
  virtual Result<ObjectInfo> stat(const std::string& key) const = 0;
  /// Objects whose key starts with `prefix`, sorted by key (bytewise UTF-8). A read-only
  /// open re-reads the committed catalog rows of the prefix first (a writer in another
  /// process may have created, replaced or removed keys since the open); when that read
  /// fails it logs a warning and lists what it knew. A closed store lists nothing.
  virtual std::vector<ObjectInfo> list(std::string_view prefix = {}) const = 0;
  /// True when `key` is an object; false also when the store is closed.
  virtual bool contains(const std::string& key) const = 0;

  /// Re-reads every NVMe chunk and checks its checksum (ignores verify_checksums). A
  /// read-only open first re-reads the committed catalog (as list()).
  /// \error FailedPrecondition when the store is closed; close() waits for a verify().
  virtual Result<VerifyReport> verify() = 0;

  /// Bytes used and budgeted per tier, and the object count (all 0 once closed).
  virtual StoreUsage usage() const = 0;
  /// The store's counters since open() or the last reset_stats() (stats.hpp; docs/store.md
  /// "Stats" defines each): bytes and operations per tier and direction, tier moves, waits
  /// on NVMe, checksum failures, prefetch hits, pinned-pool occupancy. Cheap (relaxed loads
  /// and the pools' gauges); any thread, also after close() (the counters then stay as
  /// they were).
  virtual StoreStats stats() const = 0;
  /// Zeroes every counter and starts a new interval (elapsed_seconds); the pools' peaks
  /// restart at their use now. Operations in flight may count partly before, partly after.
  virtual void reset_stats() = 0;
  /// The space of each NVMe directory (same order as options().nvme_dirs). Space is
  /// given back after each commit: extents no version names any more (e.g. the originals
  /// of copy-on-write chunks) are punched out of the data files, so free_bytes grows again.
  /// \error FailedPrecondition when closed; IoError (errno of statvfs / fstat).
  virtual Result<std::vector<NvmeDirSpace>> nvme_space() const = 0;
  virtual uint64_t chunk_bytes() const = 0;
  virtual const StoreOptions& options() const = 0;
  virtual std::shared_ptr<IoEngine> engine() const = 0;
  /// True when the device tier is usable (CUDA build and a GPU).
  virtual bool has_device() const = 0;
  /// Orders the store's device-tier copies (host<->device, device<->device) on `stream`, a
  /// cudaStream_t of the caller's (as void*), from the next copy on; nullptr = back to the
  /// store's own streams. A copy waits for the work queued on the stream before it (it is
  /// ordered there), and the operation that issued it completes only when it is done.
  /// The stream must belong to options().device_id's context and outlive its use (until
  /// set_device_stream() replaces it or the store is closed). Same as
  /// StoreOptions::device_stream at open.
  /// \error InvalidArgument when stream is not null and the store has no GPU (or strata
  ///     was built without CUDA).
  /// \threadsafety may be called while operations run; copies already started keep their
  ///     stream.
  virtual Status set_device_stream(void* stream) = 0;
  /// The NUMA placement chosen at open (StoreOptions::numa_node): one node per NVMe
  /// directory (same order as options().nvme_dirs), the host tier's and the GPU's.
  virtual const StorePlacement& placement() const = 0;

  /// Saves the current NVMe contents of `keys` (objects that live only in NVMe: no host or
  /// device copy) for rollback(). Cheap: no I/O, no copy (it holds the chunk layouts).
  /// Call it when no write_range() of these keys is in flight.
  /// \error NotFound (naming the key) for an absent key; InvalidArgument for a key given
  ///     twice; FailedPrecondition for an object
  ///     with a memory copy (host/device tier), a damaged one, or a closed or read-only
  ///     store. Nothing is saved on error.
  virtual Result<Savepoint> savepoint(const std::vector<std::string>& keys) = 0;
  /// Restores every object of `sp` to its NVMe contents at savepoint(): the chunks written
  /// since by write_range() are dropped (their space is free again) and reads return the
  /// saved bytes at once; the next flush() commits the saved version (it may be the
  /// committed one already). Waits for write_range() calls in flight on those objects.
  /// \error FailedPrecondition (naming the key, nothing restored) when an object of `sp`
  ///     was removed or replaced by a put since, or got a memory copy (move/prefetch to
  ///     host or device), or when the store is closed or read-only, or `sp` is of another
  ///     store. Thread-safety: as every member; do not rollback() while other threads
  ///     write the same objects.
  virtual Status rollback(const Savepoint& sp) = 0;

  /// Waits for every operation, flushes, releases the lock. Later calls fail with
  /// FailedPrecondition. Idempotent; concurrent calls wait for the first.
  /// When the flush fails (e.g. ResourceExhausted: dirty host/device objects do not fit
  /// the NVMe budget or the disk), nothing is dropped: the error is returned and the store
  /// stays open, so the caller can make room (remove objects) and close again. The
  /// destructor closes regardless, dropping dirty objects it cannot write back (logged).
  virtual Status close() = 0;

  // Blocking forms (the naming rule: x_async() returns a future, x() blocks). Each calls its
  // *_async twin above, waits, and returns the future's Status: same arguments, same errors,
  // same thread-safety; the caller's buffers need only live for the call.
  Status put(const std::string& key, const void* src, const TensorDesc& desc,
             const PutOptions& opts = {}) {
    return put_async(key, src, desc, opts).result().status();
  }
  Status get(const std::string& key, void* dst, const TensorDesc& desc) {
    return get_async(key, dst, desc).result().status();
  }
  Status get_bytes(const std::string& key, void* dst, uint64_t nbytes) {
    return get_bytes_async(key, dst, nbytes).result().status();
  }
  Status get_alloc(const std::string& key,
                   std::function<Result<void*>(const TensorDesc&)> allocate) {
    return get_alloc_async(key, std::move(allocate)).result().status();
  }
  Status read_range(const std::string& key, uint64_t offset_bytes, uint64_t nbytes, void* dst) {
    return read_range_async(key, offset_bytes, nbytes, dst).result().status();
  }
  Status write_range(const std::string& key, uint64_t offset_bytes, uint64_t nbytes,
                     const void* src) {
    return write_range_async(key, offset_bytes, nbytes, src).result().status();
  }
  Status move(const std::string& key, Tier tier) { return move_async(key, tier).result().status(); }
  Status prefetch(const std::string& key, Tier tier = Tier::kHost) {
    return prefetch_async(key, tier).result().status();
  }
  Status evict(const std::string& key) { return evict_async(key).result().status(); }
  Status pin(const std::string& key) { return pin_async(key).result().status(); }
  Status unpin(const std::string& key) { return unpin_async(key).result().status(); }
  Status remove(const std::string& key) { return remove_async(key).result().status(); }
  Status flush() { return flush_async().result().status(); }
  Status commit(std::vector<std::string> keys) {
    return commit_async(std::move(keys)).result().status();
  }
};

/// Reads the catalog of the store at `path` without the write lock and without opening
/// data files for writing (for `strata store ls/stat`). Works on a read-only filesystem.
/// Damaged rows are listed with ObjectInfo::damage set.
/// \error NotFound when no store is there; InvalidArgument when `path` is empty or holds a
///     NUL byte.
Result<std::vector<ObjectInfo>> list_store(const std::string& path, std::string_view prefix = {});

}  // namespace strata
