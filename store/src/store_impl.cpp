// strata::store — the tiered object store (see store.hpp and docs/store.md).
//
// Internals in brief:
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
#include <fcntl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxh_x86dispatch.h>
#include <xxhash.h>

#include <algorithm>
#include <charconv>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "catalog_sqlite.hpp"
#include "store_device.hpp"
#include "store_validate.hpp"
#include "strata/base/env.hpp"
#include "strata/base/logging.hpp"
#include "strata/base/units.hpp"
#include "strata/store/pinned_pool.hpp"
#include "strata/store/placement.hpp"
#include "strata/store/store.hpp"
#include "strata/store/topology.hpp"

namespace strata {

// ---------------------------------------------------------------- small public helpers

std::string_view tier_name(Tier t) {
  switch (t) {
    case Tier::kDevice: return "device";
    case Tier::kHost: return "host";
    case Tier::kNvme: return "nvme";
  }
  return "unknown";
}

std::optional<Tier> tier_from_name(std::string_view s) {
  if (s == "device" || s == "gpu" || s == "hbm") return Tier::kDevice;
  if (s == "host" || s == "dram" || s == "cpu") return Tier::kHost;
  if (s == "nvme" || s == "disk") return Tier::kNvme;
  return std::nullopt;
}

uint64_t TensorDesc::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d < 0 ? 0 : d);
  return n;
}

std::string to_string(const TensorDesc& d) {
  std::string s(dtype_name(d.dtype));
  s += '[';
  for (size_t i = 0; i < d.shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(d.shape[i]);
  }
  return s + ']';
}

Result<StoreOptions> StoreOptions::from_env() {
  StoreOptions o;
  STRATA_ASSIGN_OR_RETURN(o.host_budget_bytes, env_size("STRATA_HOST_BUDGET", o.host_budget_bytes));
  STRATA_ASSIGN_OR_RETURN(o.nvme_budget_bytes, env_size("STRATA_NVME_BUDGET", o.nvme_budget_bytes));
  STRATA_ASSIGN_OR_RETURN(o.device_budget_bytes,
                          env_size("STRATA_DEVICE_BUDGET", o.device_budget_bytes));
  STRATA_ASSIGN_OR_RETURN(o.chunk_bytes, env_size("STRATA_CHUNK_SIZE", o.chunk_bytes));
  STRATA_ASSIGN_OR_RETURN(o.staging_bytes, env_size("STRATA_STAGING_BYTES", o.staging_bytes));
  STRATA_ASSIGN_OR_RETURN(o.verify_checksums, env_bool("STRATA_VERIFY", o.verify_checksums));
  STRATA_ASSIGN_OR_RETURN(o.engine_options, IoEngineOptions::from_env());
  return o;
}

namespace {

// Chunk checksums: XXH3-64 through libxxhash's run-time dispatched entry points, which pick
// the widest vector unit the CPU has (AVX-512 / AVX2 / SSE2). Debian builds the plain
// XXH3_64bits() for baseline x86-64 (SSE2): measured on the development VM, 3.9 GB/s per core
// against 12 GB/s dispatched (AVX2/AVX-512), on 64 MiB buffers. Same digests either way: the
// vector width is not part of the XXH3 definition.
inline uint64_t xxh3_64(const void* p, uint64_t n) { return XXH3_64bits_dispatch(p, n); }
inline void xxh3_update(XXH3_state_t* h, const void* p, uint64_t n) {
  (void)XXH3_64bits_update_dispatch(h, p, n);
}

/// Streaming XXH3-64 state (the digest equals xxh3_64() over the concatenated updates).
class Xxh3Stream {
 public:
  Xxh3Stream() : h_(XXH3_createState()) {
    STRATA_CHECK(h_ != nullptr);
    XXH3_64bits_reset(h_);
  }
  ~Xxh3Stream() { XXH3_freeState(h_); }
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;
  void update(const void* p, uint64_t n) { xxh3_update(h_, p, n); }
  uint64_t digest() const { return XXH3_64bits_digest(h_); }

 private:
  XXH3_state_t* h_;
};

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
/// \error DataLoss quoting the value.
Result<uint64_t> parse_chunk_bytes(const std::string& v, const std::string& cat_path) {
  uint64_t cb = 0;
  auto [end, err] = std::from_chars(v.data(), v.data() + v.size(), cb);
  if (err != std::errc() || end != v.data() + v.size() || cb == 0 || cb % kAlign != 0 ||
      cb > (1ull << 40)) {
    return data_loss("catalog " + cat_path + ": chunk_bytes '" + v +
                     "' is not a positive multiple of 4096 (at most 1 TiB)");
  }
  return cb;
}

// ---------------------------------------------------------------- worker pool

class WorkerPool {
 public:
  void start(uint32_t n) {
    for (uint32_t i = 0; i < n; ++i) threads_.emplace_back([this] { loop(); });
  }
  void submit(std::function<void()> f) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      q_.push_back(std::move(f));
    }
    cv_.notify_one();
  }
  void stop() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> f;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
        if (q_.empty()) return;
        f = std::move(q_.front());
        q_.pop_front();
      }
      f();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
};

// ---------------------------------------------------------------- extents

class ExtentAllocator;

/// A 4 KiB-aligned range of one directory's data file; returned to the allocator when the
/// last reference (catalog mirror, a version's layout, a reader's snapshot) drops.
struct Extent {
  std::shared_ptr<ExtentAllocator> alloc;
  uint32_t dir = 0;
  uint64_t offset = 0;
  uint64_t len = 0;
  ~Extent();
};

class ExtentAllocator : public std::enable_shared_from_this<ExtentAllocator> {
 public:
  ExtentAllocator(uint32_t ndirs, uint64_t budget) : dirs_(ndirs), budget_(budget) {}

  /// First fit in the free list, else the end of the file.
  Result<std::shared_ptr<Extent>> allocate(uint32_t dir, uint64_t len, const std::string& key) {
    std::lock_guard<std::mutex> lk(mu_);
    if (budget_ && used_ + len > budget_) {
      return resource_exhausted("nvme tier budget " + format_bytes(budget_) + " full (" +
                                format_bytes(used_) + " used): cannot place " +
                                format_bytes(len) + " of object '" + key + "'");
    }
    Dir& d = dirs_[dir];
    uint64_t off = d.end;
    bool found = false;
    for (auto it = d.free.begin(); it != d.free.end(); ++it) {
      if (it->second >= len) {
        off = it->first;
        uint64_t rest = it->second - len;
        d.free.erase(it);
        if (rest) d.free.emplace(off + len, rest);
        found = true;
        break;
      }
    }
    if (!found) d.end += len;
    used_ += len;
    return make(dir, off, len);
  }

  /// Marks a committed extent used while loading the catalog (before finish_load()).
  std::shared_ptr<Extent> adopt(uint32_t dir, uint64_t off, uint64_t len) {
    std::lock_guard<std::mutex> lk(mu_);
    dirs_[dir].loaded.emplace_back(off, len);
    used_ += len;
    return make(dir, off, len);
  }

  /// Builds the free lists from the gaps between adopted extents.
  /// \error DataLoss when two committed extents overlap.
  Status finish_load() {
    std::lock_guard<std::mutex> lk(mu_);
    for (size_t di = 0; di < dirs_.size(); ++di) {
      Dir& d = dirs_[di];
      std::sort(d.loaded.begin(), d.loaded.end());
      uint64_t pos = 0;
      for (auto [off, len] : d.loaded) {
        if (off < pos) {
          return data_loss("catalog: extents overlap in directory " + std::to_string(di) +
                           " at offset " + std::to_string(off));
        }
        if (off > pos) d.free.emplace(pos, off - pos);
        pos = off + len;
      }
      d.end = pos;
      d.loaded.clear();
      d.loaded.shrink_to_fit();
    }
    return Status::OK();
  }

  void release(uint32_t dir, uint64_t off, uint64_t len) {
    std::lock_guard<std::mutex> lk(mu_);
    used_ -= len;
    Dir& d = dirs_[dir];
    auto next = d.free.lower_bound(off);
    if (next != d.free.end() && off + len == next->first) {  // merge with the next
      len += next->second;
      next = d.free.erase(next);
    }
    if (next != d.free.begin()) {  // merge with the previous
      auto prev = std::prev(next);
      if (prev->first + prev->second == off) {
        off = prev->first;
        len += prev->second;
        d.free.erase(prev);
      }
    }
    if (off + len == d.end) {
      d.end = off;
    } else {
      d.free.emplace(off, len);
    }
  }

  uint64_t used() const {
    std::lock_guard<std::mutex> lk(mu_);
    return used_;
  }

  /// End of the allocated part of `dir`'s data file (no extent lies at or past it).
  uint64_t end(uint32_t dir) const {
    std::lock_guard<std::mutex> lk(mu_);
    return dirs_[dir].end;
  }

 private:
  std::shared_ptr<Extent> make(uint32_t dir, uint64_t off, uint64_t len) {
    auto e = std::make_shared<Extent>();
    e->alloc = shared_from_this();
    e->dir = dir;
    e->offset = off;
    e->len = len;
    return e;
  }
  struct Dir {
    std::map<uint64_t, uint64_t> free;  // offset -> length
    uint64_t end = 0;
    std::vector<std::pair<uint64_t, uint64_t>> loaded;
  };
  mutable std::mutex mu_;
  std::vector<Dir> dirs_;
  uint64_t used_ = 0;
  uint64_t budget_;
};

Extent::~Extent() {
  if (alloc) alloc->release(dir, offset, len);
}

struct ChunkRef {
  std::shared_ptr<Extent> ext;
  uint64_t nbytes = 0;
  uint64_t checksum = 0;
};
using Layout = std::vector<ChunkRef>;
using LayoutPtr = std::shared_ptr<const Layout>;

// ---------------------------------------------------------------- objects

struct DeviceMem {
  int id = 0;
  void* ptr = nullptr;
  uint64_t nbytes = 0;
  std::shared_ptr<std::atomic<uint64_t>> used;
  ~DeviceMem() {
    store_detail::device_free(id, ptr);
    if (used) used->fetch_sub(nbytes);
  }
};

/// One version of one key. Fields after `io` are guarded by StoreImpl::mu_.
struct Obj {
  std::string key;
  TensorDesc desc;
  uint64_t nbytes = 0;
  uint32_t first_dir = 0;
  /// Shared: readers and write_range. Exclusive: tier changes, write-back, replacement.
  std::shared_mutex io;

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

/// OutOfRange for `n` bytes at offset `off` of an object of `size` bytes (off + n may not
/// fit 64 bits, so the message gives the offset and the length, not the end).
Status range_error(const char* op, const std::string& key, uint64_t off, uint64_t n,
                   uint64_t size) {
  return out_of_range(std::string(op) + " '" + key + "': " + std::to_string(n) +
                      " bytes at offset " + std::to_string(off) +
                      " go past the end of the object (" + std::to_string(size) + " bytes)");
}

std::string hex64(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};
using AlignedBlock = std::unique_ptr<uint8_t, AlignedFree>;
AlignedBlock aligned_block(uint64_t n) {
  void* p = std::aligned_alloc(kAlign, align_up(std::max<uint64_t>(n, 1), kAlign));
  STRATA_CHECK(p != nullptr);
  return AlignedBlock(static_cast<uint8_t*>(p));
}

// ---------------------------------------------------------------- the store

class StoreImpl final : public Store {
 public:
  ~StoreImpl() override {
    Status st = close_impl(false);
    if (!st.ok()) log_warn("store " + opts_.path + ": close: " + st.to_string());
  }

  Status init(StoreOptions options);

  // ---- Store API
  Future<void> put(const std::string& key, const void* src, const TensorDesc& desc,
                   const PutOptions& opts) override;
  Future<void> get(const std::string& key, void* dst, const TensorDesc& desc) override {
    return get_impl(key, dst, desc.nbytes(), &desc);
  }
  Future<void> get_bytes(const std::string& key, void* dst, uint64_t nbytes) override {
    return get_impl(key, dst, nbytes, nullptr);
  }
  Future<void> get_alloc(const std::string& key,
                         std::function<Result<void*>(const TensorDesc&)> allocate) override;
  Future<void> read_range(const std::string& key, uint64_t off, uint64_t n, void* dst) override;
  Future<void> write_range(const std::string& key, uint64_t off, uint64_t n,
                           const void* src) override;
  Future<void> move(const std::string& key, Tier tier) override {
    return run_op(true, [=, this] { return move_impl(key, tier, false); });
  }
  Future<void> prefetch(const std::string& key, Tier tier) override {
    return run_op(true, [=, this] { return move_impl(key, tier, true); });
  }
  Future<void> evict(const std::string& key) override {
    return run_op(true, [=, this] { return move_impl(key, Tier::kNvme, false); });
  }
  Future<void> pin(const std::string& key) override;
  Future<void> unpin(const std::string& key) override;
  Future<void> remove(const std::string& key) override;
  Future<void> flush() override { return run_op(true, [this] { return flush_impl(); }); }
  Result<ObjectInfo> stat(const std::string& key) const override;
  std::vector<ObjectInfo> list(std::string_view prefix) const override;
  bool contains(const std::string& key) const override {
    CallScope call(this);
    if (!call.status.ok()) return false;  // closed
    if (read_only_) (void)const_cast<StoreImpl*>(this)->refresh_key(key, find(key));  // see stat()
    std::lock_guard<std::mutex> lk(mu_);
    return objects_.count(key) != 0;
  }
  Result<VerifyReport> verify() override;
  StoreUsage usage() const override;
  uint64_t chunk_bytes() const override { return chunk_bytes_; }
  const StoreOptions& options() const override { return opts_; }
  std::shared_ptr<IoEngine> engine() const override { return engine_; }
  bool has_device() const override { return has_device_; }
  const StorePlacement& placement() const override { return placement_; }
  Status close() override { return close_impl(true); }
  /// close(); when the write-back fails and `stay_open_on_failure`, the store reopens for
  /// operations and returns the error (the destructor passes false: it always closes).
  Status close_impl(bool stay_open_on_failure);

 private:
  // ---- plumbing
  template <class F>
  Future<void> run_op(bool mutating, F f);
  template <class F>
  Future<void> run_op_async(F f);  // f returns Future<void>; the worker does not wait
  /// Admits an operation (writable when `mutating`, store not closing) and counts it in
  /// flight; end_op() uncounts it and wakes close().
  Status begin_op(bool mutating);
  void end_op();
  /// A synchronous call that is not an operation of run_op (stat, list, contains, usage,
  /// verify) counted in flight like one, so close() waits for it and does not free what it
  /// uses; `status` is FailedPrecondition when the store is closed (or closing).
  struct CallScope {
    explicit CallScope(const StoreImpl* s)
        : self(const_cast<StoreImpl*>(s)), status(self->begin_op(false)) {}
    ~CallScope() {
      if (status.ok()) self->end_op();
    }
    CallScope(const CallScope&) = delete;
    CallScope& operator=(const CallScope&) = delete;
    StoreImpl* self;
    Status status;
  };
  Status check_writable() const;
  ObjPtr find(const std::string& key) const;
  /// An in-memory object for a committed catalog row. With `alloc`, its extents are adopted
  /// by the allocator (open); without (read-only refresh), they are only read.
  ObjPtr obj_from_row(const catalog::ObjectRow& r, const std::vector<bool>& adopt, bool alloc);
  /// Read-only opens: another process may hold the store open for writing and may have
  /// replaced or removed `key` (and reused its extents) since this open loaded the catalog.
  /// Re-reads the key's row and installs it; true when it differs from `seen` (null: absent).
  Result<bool> refresh_key(const std::string& key, const ObjPtr& seen);
  /// Read-only opens: installs the committed rows of every key starting with `prefix`
  /// (new, changed and removed keys), for list().
  Status refresh_prefix(const std::string& prefix);
  /// An object for a row read by a read-only refresh (damaged when it names a directory
  /// whose data file this open has not).
  ObjPtr refreshed_obj(const catalog::ObjectRow& row);
  /// Runs `attempt` on the object `key` (NotFound when absent). In a read-only open, a
  /// NotFound or DataLoss is checked against the key's current catalog row first: when a
  /// writer changed it, the attempt runs again on the new version (at most 8 retries).
  Status with_current_object(const std::string& key,
                             const std::function<Status(const ObjPtr&)>& attempt);
  ObjPtr lock_live(const std::string& key);         // exclusive; null when absent
  ObjPtr lock_live_shared(const std::string& key);  // shared; null when absent
  void install_locked(const ObjPtr& obj);           // under mu_
  void lru_add_locked(const ObjPtr& o);
  void lru_remove_locked(const ObjPtr& o);
  void lru_touch(const ObjPtr& o);

  // ---- commit
  struct CommitReq {
    std::vector<catalog::Op> ops;
    std::function<void(bool)> on_done;  // under mu_, after the transaction (true: committed)
    Promise<void> promise;
  };
  Future<void> enqueue_commit(std::vector<catalog::Op> ops, std::function<void(bool)> on_done);
  void committer_loop();
  catalog::ObjectRow row_of(const Obj& o, const Layout& l) const;

  // ---- data movement
  /// Writes a new version of `nbytes` from `src` into newly placed extents (put, flush,
  /// demotion). On failure the new extents are released and the data files trimmed.
  Result<LayoutPtr> write_layout(const std::string& key, const uint8_t* src, uint64_t nbytes,
                                 uint32_t first_dir, bool src_dev);
  Result<LayoutPtr> write_layout_once(const std::string& key, const uint8_t* src,
                                      uint64_t nbytes, uint32_t first_dir, bool src_dev);
  Status read_layout(const std::string& key, const Layout& l, uint64_t off, uint64_t n,
                     uint8_t* dst, bool dst_dev, bool verify);
  Result<uint64_t> staged_write_chunk(
      const Extent& ext, uint64_t len,
      const std::function<Status(uint8_t*, uint64_t, uint64_t)>& fill);
  Status staged_read_chunk(const std::string& key, uint32_t j, uint64_t chunk_start,
                           const ChunkRef& c, uint64_t lo, uint64_t hi, bool verify,
                           const std::function<Status(const uint8_t*, uint64_t, uint64_t)>& sink);
  Status copy_mem(void* dst, const void* src, uint64_t n, bool any_dev);
  /// Submits the write of `len` bytes from host memory `s` (aligned for O_DIRECT on the
  /// data file of NVMe directory `dir`)
  /// at `offset` (4 KiB-aligned); a partial last 4 KiB block goes through a zero-padded
  /// block appended to `tails`. Appends the engine futures to `futs` (the caller waits for
  /// them, and hashes `s` while they are in flight).
  void write_direct(uint32_t dir, const uint8_t* s, uint64_t len,
                    uint64_t offset, std::vector<Future<uint64_t>>& futs,
                    std::vector<AlignedBlock>& tails);
  /// Fills placement_ (placement.hpp) for dirs_ and the store's GPU (has_device_).
  /// \error InvalidArgument for a bad StoreOptions::numa_node.
  Status plan_placement();
  /// Pinned staging memory of `nbytes` from the pool serving NVMe directory `dir` (on its
  /// NUMA node).
  Result<PinnedBuffer> staging(uint32_t dir, uint64_t nbytes);
  /// The I/O engine serving NVMe directory `dir` (its threads on the directory's node).
  IoEngine& io(uint32_t dir) { return *groups_[dir_group_[dir]].engine; }
  Status checksum_error(const std::string& key, uint32_t j, uint64_t chunk_start,
                        const ChunkRef& c, uint64_t got) const;
  void mark_dir_dirty(uint32_t dir) { dir_dirty_[dir].store(true); }
  /// Grows the data file of `dir` (fallocate) so that [0, end) is allocated before a
  /// direct write lands there: O_DIRECT writes past EOF extend i_size one at a time.
  Status ensure_file_size(uint32_t dir, uint64_t end);
  /// The catalog ballast: a small preallocated file beside catalog.db, deleted when a
  /// commit fails for lack of space so that the commit (e.g. a remove() freeing space) can
  /// go through, recreated after a later successful commit. Returns true when a ballast
  /// was there and is now deleted. Committer thread (and open) only.
  bool release_ballast();
  void restore_ballast();
  /// After a failed write (put, write_range, flush, demotion), once its new extents are
  /// released: gives back data file space preallocated past the allocator's end.
  void trim_data_files();

  // ---- tiers
  Result<PinnedBuffer> alloc_host(uint64_t nbytes, const Obj* self);
  Result<std::shared_ptr<DeviceMem>> alloc_device(uint64_t nbytes, const Obj* self);
  ObjPtr pick_victim(bool device, const Obj* self);
  Status demote_locked(const ObjPtr& o);  // o exclusively locked
  Status promote_locked(const ObjPtr& o, Tier tier);
  Status move_impl(const std::string& key, Tier tier, bool prefetch_only);
  Status flush_impl();
  Status get_from(const ObjPtr& o, uint64_t off, uint64_t n, uint8_t* dst);
  Future<void> get_impl(const std::string& key, void* dst, uint64_t nbytes,
                        const TensorDesc* desc);
  Status write_range_impl(const ObjPtr& o, uint64_t off, uint64_t n, const uint8_t* src);
  ObjectInfo info_locked(const Obj& o) const;

  StoreOptions opts_;
  std::vector<std::string> dirs_;
  uint64_t chunk_bytes_ = 0;
  uint64_t piece_bytes_ = 0;
  std::string uuid_;
  int lock_fd_ = -1;
  std::mutex refresh_mu_;        // read-only opens: one catalog reader at a time
  std::string ballast_path_;     // <root>/catalog.ballast ("" when read-only)
  std::atomic<bool> ballast_missing_{false};  // written by the committer thread (and open)
  bool read_only_ = false;
  bool has_device_ = false;
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
  std::unique_ptr<std::atomic<uint64_t>[]> file_end_;  // allocated size of each data file
  std::mutex grow_mu_;
  std::shared_ptr<ExtentAllocator> alloc_;
  std::shared_ptr<PinnedPool> host_pool_;
  std::unique_ptr<catalog::Catalog> catalog_;

  mutable std::mutex mu_;
  std::map<std::string, ObjPtr> objects_;
  std::unordered_map<std::string, LayoutPtr> durable_;
  std::unordered_map<std::string, int> pending_creates_;
  std::unordered_map<std::string, int> inflight_;  // commits enqueued, not yet applied, per key
  std::list<ObjPtr> host_lru_, device_lru_;
  std::atomic<uint32_t> next_dir_{0};

  std::mutex commit_mu_;
  std::condition_variable commit_cv_;
  std::deque<std::shared_ptr<CommitReq>> commit_q_;
  bool commit_stop_ = false;
  std::thread committer_;

  WorkerPool pool_;
  std::mutex ops_mu_;
  std::condition_variable ops_cv_;
  uint64_t ops_in_flight_ = 0;
  std::atomic<bool> closed_{false};
  bool closing_ = false;
  bool started_ = false;
};

// ---------------------------------------------------------------- open / close

Result<std::string> read_lock_holder(int fd) {
  char buf[32] = {0};
  ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return std::string("?");
  std::string s(buf, static_cast<size_t>(n));
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}


Status StoreImpl::init(StoreOptions options) {
  opts_ = std::move(options);
  read_only_ = opts_.read_only;
  STRATA_RETURN_IF_ERROR(store_detail::check_store_paths(opts_));  // empty/NUL, duplicate dirs
  if (opts_.numa_node != kNumaAuto) {  // before anything is created
    // Nodes only of this machine's topology (with HWLOC_XMLFILE naming another one, nothing
    // is bound: see plan_placement()).
    auto topo = Topology::system();
    if (topo.ok() && (*topo)->is_this_system()) {
      STRATA_RETURN_IF_ERROR(check_numa_node_option(**topo, opts_.numa_node));
    } else if (opts_.numa_node < kNumaNone) {
      return invalid_argument("StoreOptions.numa_node=" + std::to_string(opts_.numa_node) +
                              ": expected a node number, -1 (automatic) or -2 (none)");
    }
  }
  if (opts_.chunk_bytes == 0 || opts_.chunk_bytes % kAlign != 0) {
    return invalid_argument("StoreOptions.chunk_bytes " + std::to_string(opts_.chunk_bytes) +
                            " is not a positive multiple of 4096");
  }
  if (opts_.staging_bytes < 2 * kAlign) {
    return invalid_argument("StoreOptions.staging_bytes " + std::to_string(opts_.staging_bytes) +
                            " is below 8 KiB");
  }
  if (opts_.worker_threads == 0) return invalid_argument("StoreOptions.worker_threads is 0");
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string root = opts_.path;
  if (!fs::is_directory(root, ec)) {
    if (!opts_.create || read_only_) return not_found("no store at " + root);
    fs::create_directories(root, ec);
    if (ec) return errno_status(ec.value(), "create store directory " + root);
  }
  root = fs::absolute(root, ec).lexically_normal().string();
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  opts_.path = root;

  std::string cat_path = root + "/catalog.db";
  bool fresh = !fs::exists(cat_path, ec);
  if (fresh && !opts_.recreate_catalog) {  // data files without their catalog: DataLoss
    STRATA_RETURN_IF_ERROR(store_detail::check_orphaned_data(cat_path, root, opts_.nvme_dirs));
  }
  // Opening without `create` leaves a directory that is not a store untouched (no LOCK).
  if (fresh && (read_only_ || !opts_.create)) return not_found("no store catalog at " + cat_path);

  // Opening without `create` leaves a directory whose catalog.db is not a strata catalog
  // (e.g. 0 bytes) untouched too: check before the LOCK is written.
  if (!fresh && !read_only_ && !opts_.create) {
    auto probe = catalog::Catalog::open(cat_path, false, true);
    if (!probe.ok() && probe.status().code() == StatusCode::kDataLoss) return probe.status();
  }
  // Lock first: a second writer must fail before touching anything.
  if (!read_only_) {
    std::string lock_path = root + "/LOCK";
    lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock_fd_ < 0) return errno_status(errno, "open lock file " + lock_path);
    if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
      int e = errno;
      std::string holder = read_lock_holder(lock_fd_).value_or("?");
      ::close(lock_fd_);
      lock_fd_ = -1;
      if (e == EWOULDBLOCK) {
        return failed_precondition("store " + root + " is locked by pid " + holder);
      }
      return errno_status(e, "flock " + lock_path);
    }
    std::string pid = std::to_string(::getpid()) + "\n";
    if (::ftruncate(lock_fd_, 0) != 0 ||
        ::pwrite(lock_fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
      log_warn("store " + root + ": cannot write the pid into " + lock_path);
    }
  }

  fresh = !fs::exists(cat_path, ec);  // again, under the lock
  if (fresh && (read_only_ || !opts_.create)) return not_found("no store catalog at " + cat_path);
  if (fresh && !opts_.recreate_catalog) {
    STRATA_RETURN_IF_ERROR(store_detail::check_orphaned_data(cat_path, root, opts_.nvme_dirs));
  }
  if (!read_only_) {
    // On a (nearly) full file system SQLite cannot even open the catalog in WAL mode:
    // release the ballast first. It is recreated below once the data files are trimmed.
    ballast_path_ = root + "/catalog.ballast";
    ballast_missing_ = !fs::exists(ballast_path_, ec);
    struct statvfs vfs;
    if (!ballast_missing_ && ::statvfs(root.c_str(), &vfs) == 0 &&
        static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize < 2 * kBallastBytes) {
      release_ballast();
    }
  }
  STRATA_ASSIGN_OR_RETURN(catalog_, catalog::Catalog::open(cat_path, opts_.create, read_only_));

  // Store identity and layout: recorded at creation, checked at reopen.
  STRATA_ASSIGN_OR_RETURN(auto uuid, catalog_->get_meta("store_uuid"));
  std::vector<std::string> want;
  for (const auto& d : opts_.nvme_dirs) {
    std::string a = fs::absolute(d, ec).lexically_normal().string();
    while (a.size() > 1 && a.back() == '/') a.pop_back();
    want.push_back(a);
  }
  if (want.empty()) want.push_back(root);
  if (!uuid) {
    if (read_only_) return data_loss("catalog " + cat_path + " has no store_uuid");
    unsigned char rnd[8];
    if (::getrandom(rnd, sizeof rnd, 0) != sizeof rnd) return errno_status(errno, "getrandom");
    uint64_t v;
    std::memcpy(&v, rnd, sizeof v);
    uuid_ = hex64(v);
    std::string joined;
    for (auto& d : want) joined += store_detail::encode_dir(root, d) + "\n";
    STRATA_RETURN_IF_ERROR(catalog_->set_meta("format", "1"));
    STRATA_RETURN_IF_ERROR(catalog_->set_meta("chunk_bytes", std::to_string(opts_.chunk_bytes)));
    STRATA_RETURN_IF_ERROR(catalog_->set_meta("nvme_dirs", joined));
    STRATA_RETURN_IF_ERROR(catalog_->set_meta("store_uuid", uuid_));
    dirs_ = want;
    chunk_bytes_ = opts_.chunk_bytes;
  } else {
    uuid_ = *uuid;
    STRATA_ASSIGN_OR_RETURN(auto cb, catalog_->get_meta("chunk_bytes"));
    STRATA_ASSIGN_OR_RETURN(auto nd, catalog_->get_meta("nvme_dirs"));
    if (!cb || !nd) return data_loss("catalog " + cat_path + " lacks chunk_bytes/nvme_dirs");
    STRATA_ASSIGN_OR_RETURN(chunk_bytes_, parse_chunk_bytes(*cb, cat_path));
    std::string rest = *nd;
    size_t pos;
    while ((pos = rest.find('\n')) != std::string::npos) {
      dirs_.push_back(store_detail::decode_dir(root, rest.substr(0, pos)));
      rest.erase(0, pos + 1);
    }
    if (dirs_.empty() || !rest.empty()) {
      return data_loss("catalog " + cat_path + ": nvme_dirs record is malformed ('" + *nd + "')");
    }
    // A directory listed twice would give two directory slots one data file (and trimming
    // one slot's file to its extents would cut the other's).
    if (Status dup = check_distinct_directories(
            dirs_, [](size_t i) { return "nvme_dirs[" + std::to_string(i) + "]"; });
        !dup.ok()) {
      return data_loss("catalog " + cat_path + ": nvme_dirs record is damaged: " + dup.message());
    }
    if (!opts_.nvme_dirs.empty() && want != dirs_) {
      std::string rec;
      for (auto& d : dirs_) rec += (rec.empty() ? "" : ", ") + d;
      return invalid_argument("store " + root + " was created with nvme_dirs [" + rec +
                              "]; reopen it with the same directories (or none)");
    }
  }
  opts_.nvme_dirs = dirs_;
  opts_.chunk_bytes = chunk_bytes_;
  {  // NVMe directories and data files must carry this store's identity (store_validate).
    STRATA_ASSIGN_OR_RETURN(auto held, catalog_->chunks_per_dir(dirs_.size()));
    STRATA_RETURN_IF_ERROR(store_detail::prepare_nvme_dirs(root, uuid_, dirs_, held, read_only_));
    if (!read_only_) {
      STRATA_RETURN_IF_ERROR(store_detail::record_dirs_relocatable(*catalog_, root, dirs_));
    }
  }

  dir_dirty_.reset(new std::atomic<bool>[dirs_.size()]);
  file_end_.reset(new std::atomic<uint64_t>[dirs_.size()]);
  for (size_t i = 0; i < dirs_.size(); ++i) {
    dir_dirty_[i].store(false);
    file_end_[i].store(0);
    if (!fs::is_directory(dirs_[i], ec)) {
      if (read_only_) return not_found("nvme directory " + dirs_[i] + " is missing");
      fs::create_directories(dirs_[i], ec);
      if (ec) return errno_status(ec.value(), "create nvme directory " + dirs_[i]);
    }
  }

  // NUMA placement, then one engine per node of the directories (its threads bound there),
  // or the shared engine for all.
  has_device_ = store_detail::device_available(opts_.device_id);
  STRATA_RETURN_IF_ERROR(plan_placement());
  dir_group_.resize(dirs_.size());
  for (size_t i = 0; i < dirs_.size(); ++i) {
    const int node = placement_.dir_nodes[i];
    size_t g = 0;
    while (g < groups_.size() && groups_[g].node != node) ++g;
    if (g == groups_.size()) {
      IoGroup grp;
      grp.node = node;
      if (opts_.engine) {
        grp.engine = opts_.engine;
      } else {
        IoEngineOptions eo = opts_.engine_options;
        if (eo.numa_node < 0) eo.numa_node = node;
        STRATA_ASSIGN_OR_RETURN(grp.engine, IoEngine::create(eo));
      }
      groups_.push_back(std::move(grp));
    }
    dir_group_[i] = static_cast<uint32_t>(g);
  }
  engine_ = groups_[0].engine;

  // Data files: <dir>/strata-<uuid>.data, one per NVMe directory.
  for (size_t i = 0; i < dirs_.size(); ++i) {
    std::string fpath = dirs_[i] + "/strata-" + uuid_ + ".data";
    bool existed = fs::exists(fpath, ec);
    if (existed) file_end_[i].store(fs::file_size(fpath, ec));
    auto f = io(static_cast<uint32_t>(i)).open(fpath, read_only_ ? OpenMode::kRead
                                                                 : OpenMode::kReadWrite);
    if (!f.ok()) {
      if (read_only_ && !existed) {
        files_.push_back(nullptr);
        continue;
      }
      return f.status();
    }
    files_.push_back(*f);
    if (!existed) STRATA_RETURN_IF_ERROR(store_detail::fsync_directory(dirs_[i]));
    if (!read_only_) {
      int fd = ::open(fpath.c_str(), O_RDWR | O_CLOEXEC);
      if (fd < 0) return errno_status(errno, "open " + fpath);
      grow_fds_.push_back(fd);
    }
  }

  // Catalog -> in-memory objects; committed extents are in use, everything else is free.
  alloc_ = std::make_shared<ExtentAllocator>(static_cast<uint32_t>(dirs_.size()),
                                             opts_.nvme_budget_bytes);
  STRATA_ASSIGN_OR_RETURN(auto rows, catalog_->load_all());
  store_detail::ExtentClaims claims(dirs_.size(), chunk_bytes_);  // overlapping rows: damaged
  std::vector<bool> adopt;
  for (auto& r : rows) {
    std::string overlap = claims.claim(r, &adopt);
    ObjPtr o = obj_from_row(r, adopt, true);
    if (o->damage.empty()) o->damage = overlap;
    if (!o->damage.empty()) log_warn("store " + root + ": damaged catalog row: " + o->damage);
    durable_[r.key] = o->current;
    objects_[r.key] = o;
  }
  STRATA_RETURN_IF_ERROR(alloc_->finish_load());
  next_dir_ = static_cast<uint32_t>(rows.size());
  // Space preallocated past the last committed extent (growth slack of a process that
  // crashed, or an older version of strata) goes back to the file system.
  if (!read_only_) {
    trim_data_files();
    restore_ballast();  // best effort: a store on a full file system still opens
  }

  // Pinned memory: host tier and staging buffers.
  piece_bytes_ = std::max<uint64_t>(
      kAlign, align_down(std::min<uint64_t>(chunk_bytes_, opts_.staging_bytes / 8), kAlign));
  // Staging memory: staging_bytes per group, on the group's node. The host tier: on
  // placement_.host_node, registered with the engine of that node's directories (if any).
  PinnedPoolOptions so;
  so.budget_bytes = align_up(opts_.staging_bytes, kAlign);
  for (auto& g : groups_) {
    so.numa_node = g.node;
    STRATA_ASSIGN_OR_RETURN(g.staging, PinnedPool::create(so, g.engine));
  }
  if (opts_.host_budget_bytes > 0 && !read_only_) {
    PinnedPoolOptions ho = so;
    ho.budget_bytes = align_up(opts_.host_budget_bytes, kAlign);
    ho.numa_node = placement_.host_node;
    std::shared_ptr<IoEngine> he = engine_;
    for (const auto& g : groups_) {
      if (g.node == placement_.host_node) he = g.engine;
    }
    STRATA_ASSIGN_OR_RETURN(host_pool_, PinnedPool::create(ho, he));
  }
  if (has_device_) {
    device_budget_ = opts_.device_budget_bytes ? opts_.device_budget_bytes
                                               : store_detail::device_free_bytes(opts_.device_id) / 2;
  }

  if (!read_only_) committer_ = std::thread([this] { committer_loop(); });
  pool_.start(opts_.worker_threads);
  started_ = true;
  return Status::OK();
}

Status StoreImpl::plan_placement() {
  const int opt = opts_.numa_node;
  auto topo = Topology::system();
  if (topo.ok() && (*topo)->is_this_system()) {
    auto p = plan_store_placement_for_paths(**topo, dirs_, has_device_ ? opts_.device_id : -1,
                                            opt);
    if (p.ok()) {
      placement_ = std::move(*p);
      log_debug("store " + opts_.path + ": NUMA placement:\n" + placement_.describe(dirs_));
      return Status::OK();
    }
    if (p.status().code() == StatusCode::kInvalidArgument) return p.status();
    log_warn("store " + opts_.path + ": no NUMA placement (" + p.status().to_string() + ")");
  } else if (!topo.ok()) {
    log_warn("store " + opts_.path + ": no NUMA placement (" + topo.status().to_string() + ")");
  }
  // No topology of this machine (e.g. HWLOC_XMLFILE names another one): no binding, as
  // nodes of another machine's topology cannot be bound here. (init() refused bad values.)
  if (opt >= 0) {
    log_warn("store " + opts_.path + ": StoreOptions.numa_node=" + std::to_string(opt) +
             " ignored: the loaded topology is not this machine's (HWLOC_XMLFILE or "
             "HWLOC_SYNTHETIC?)");
  }
  placement_ = StorePlacement{};
  placement_.dir_devices.assign(dirs_.size(), "");
  placement_.dir_nodes.assign(dirs_.size(), -1);
  return Status::OK();
}

Status StoreImpl::close_impl(bool stay_open_on_failure) {
  {
    std::unique_lock<std::mutex> lk(ops_mu_);
    for (;;) {
      if (closed_) return Status::OK();
      if (!closing_) break;
      // Another thread is closing: wait until it has closed, or failed and reopened.
      ops_cv_.wait(lk, [&] { return closed_.load() || !closing_; });
    }
    closing_ = true;
  }
  Status st;
  if (!read_only_ && started_) {
    // Wait for the operations in flight, then make everything durable.
    {
      std::unique_lock<std::mutex> lk(ops_mu_);
      ops_cv_.wait(lk, [&] { return ops_in_flight_ == 0; });
    }
    st = flush_impl();
    if (!st.ok() && stay_open_on_failure) {
      // Dirty objects could not be written back (e.g. ENOSPC, the NVMe budget): closing
      // now would drop them. Stay open so that the caller can make room and close again.
      {
        std::lock_guard<std::mutex> lk(ops_mu_);
        closing_ = false;
      }
      ops_cv_.notify_all();
      return st.with_context("close: the store stays open (dirty objects were not written "
                             "back; make room and close again, or destroy it to drop them)");
    }
  }
  {
    std::unique_lock<std::mutex> lk(ops_mu_);
    ops_cv_.wait(lk, [&] { return ops_in_flight_ == 0; });
  }
  pool_.stop();
  if (committer_.joinable()) {
    {
      std::lock_guard<std::mutex> lk(commit_mu_);
      commit_stop_ = true;
    }
    commit_cv_.notify_all();
    committer_.join();
  }
  // Give back the growth slack while every live version still holds its extents.
  if (!read_only_ && started_) trim_data_files();
  {
    std::lock_guard<std::mutex> lk(mu_);
    host_lru_.clear();
    device_lru_.clear();
    objects_.clear();
    durable_.clear();
  }
  for (auto& g : groups_) g.engine->drain();
  files_.clear();
  for (int fd : grow_fds_) ::close(fd);
  grow_fds_.clear();
  catalog_.reset();
  host_pool_.reset();
  for (auto& g : groups_) g.staging.reset();
  if (lock_fd_ >= 0) {
    ::flock(lock_fd_, LOCK_UN);
    ::close(lock_fd_);
    lock_fd_ = -1;
  }
  {
    std::lock_guard<std::mutex> lk(ops_mu_);
    closed_ = true;
  }
  ops_cv_.notify_all();
  return st;
}

// ---------------------------------------------------------------- plumbing

Status StoreImpl::check_writable() const {
  if (read_only_) return failed_precondition("store " + opts_.path + " is open read-only");
  return Status::OK();
}

Status StoreImpl::begin_op(bool mutating) {
  if (mutating) STRATA_RETURN_IF_ERROR(check_writable());
  std::lock_guard<std::mutex> lk(ops_mu_);
  if (closing_ || closed_) return failed_precondition("store " + opts_.path + " is closed");
  ++ops_in_flight_;
  return Status::OK();
}

void StoreImpl::end_op() {
  {
    std::lock_guard<std::mutex> lk(ops_mu_);
    --ops_in_flight_;
  }
  ops_cv_.notify_all();
}

template <class F>
Future<void> StoreImpl::run_op(bool mutating, F f) {
  if (Status st = begin_op(mutating); !st.ok()) return make_ready_future(Result<void>(st));
  auto p = std::make_shared<Promise<void>>();
  Future<void> fut = p->future();
  pool_.submit([this, p, f = std::move(f)]() mutable {
    p->set(Result<void>(f()));
    end_op();
  });
  return fut;
}

template <class F>
Future<void> StoreImpl::run_op_async(F f) {
  if (Status st = begin_op(true); !st.ok()) return make_ready_future(Result<void>(st));
  auto p = std::make_shared<Promise<void>>();
  Future<void> fut = p->future();
  pool_.submit([this, p, f = std::move(f)]() mutable {
    f().on_ready([this, p](const Result<void>& r) {
      p->set(r);
      end_op();
    });
  });
  return fut;
}

ObjPtr StoreImpl::obj_from_row(const catalog::ObjectRow& r, const std::vector<bool>& adopt,
                               bool alloc) {
  auto o = std::make_shared<Obj>();
  o->key = r.key;
  o->desc = TensorDesc{r.dtype, r.shape};
  o->nbytes = r.nbytes;
  o->first_dir = r.first_dir < dirs_.size() ? r.first_dir : 0;
  // A damaged row makes only that object unreadable (DataLoss), never the whole store.
  o->damage = store_detail::row_damage(r, dirs_.size(), chunk_bytes_);
  auto l = std::make_shared<Layout>();
  for (size_t j = 0; j < r.chunks.size(); ++j) {
    const auto& c = r.chunks[j];
    if (j < adopt.size() && !adopt[j]) continue;  // damaged: outside the store or overlapping
    std::shared_ptr<Extent> e;
    if (alloc) {
      e = alloc_->adopt(c.dir, c.offset, align_up(c.nbytes, kAlign));
    } else {
      e = std::make_shared<Extent>();  // no allocator: never released into a free list
      e->dir = c.dir;
      e->offset = c.offset;
      e->len = align_up(c.nbytes, kAlign);
    }
    l->push_back(ChunkRef{std::move(e), c.nbytes, c.checksum});
  }
  o->current = l;
  // Identity of the row as committed (read-only refresh compares rows, not layouts: a
  // layout without the chunks the overlap check refused still names the same row).
  std::string raw;
  auto add = [&raw](uint64_t v) { raw.append(reinterpret_cast<const char*>(&v), sizeof v); };
  add(static_cast<uint64_t>(r.dtype));
  add(r.shape.size());
  for (int64_t x : r.shape) add(static_cast<uint64_t>(x));
  add(r.nbytes);
  add(r.first_dir);
  for (const auto& c : r.chunks) {
    add(c.dir);
    add(c.offset);
    add(c.nbytes);
    add(c.checksum);
  }
  raw += r.damage;
  o->row_hash = xxh3_64(raw.data(), raw.size()) | 1;  // never 0
  return o;
}

Result<bool> StoreImpl::refresh_key(const std::string& key, const ObjPtr& seen) {
  std::lock_guard<std::mutex> rl(refresh_mu_);
  STRATA_ASSIGN_OR_RETURN(auto row, catalog_->load_one(key));
  std::lock_guard<std::mutex> lk(mu_);
  auto it = objects_.find(key);
  const ObjPtr& now = it == objects_.end() ? nullptr : it->second;
  if (now != seen) return true;  // another thread refreshed it already
  if (!row) {
    if (!seen) return false;
    objects_.erase(it);
    return true;
  }
  ObjPtr o = refreshed_obj(*row);
  if (seen && seen->row_hash == o->row_hash) return false;  // the same committed row
  objects_[key] = o;
  return true;
}

ObjPtr StoreImpl::refreshed_obj(const catalog::ObjectRow& row) {
  ObjPtr o = obj_from_row(row, {}, false);
  for (const auto& c : *o->current) {
    if (c.ext->dir >= files_.size() || !files_[c.ext->dir]) {
      o->damage = "object '" + row.key + "' has a chunk in directory " +
                  std::to_string(c.ext->dir) + ", whose data file this open has not";
    }
  }
  return o;
}

Status StoreImpl::refresh_prefix(const std::string& prefix) {
  std::lock_guard<std::mutex> rl(refresh_mu_);
  STRATA_ASSIGN_OR_RETURN(auto rows, catalog_->load_all(prefix));
  std::lock_guard<std::mutex> lk(mu_);
  std::unordered_set<std::string> present;
  for (const auto& row : rows) {
    present.insert(row.key);
    ObjPtr o = refreshed_obj(row);
    auto it = objects_.find(row.key);
    if (it != objects_.end() && it->second->row_hash == o->row_hash) continue;
    objects_[row.key] = std::move(o);
  }
  for (auto it = objects_.lower_bound(prefix); it != objects_.end();) {
    if (it->first.compare(0, prefix.size(), prefix) != 0) break;
    it = present.count(it->first) ? std::next(it) : objects_.erase(it);
  }
  return Status::OK();
}

Status StoreImpl::with_current_object(const std::string& key,
                                      const std::function<Status(const ObjPtr&)>& attempt) {
  for (int i = 0;; ++i) {
    ObjPtr o = find(key);
    Status st = o ? attempt(o) : not_found("object '" + key + "' is not in store " + opts_.path);
    if (!read_only_ || i == 8 ||
        (st.code() != StatusCode::kDataLoss && st.code() != StatusCode::kNotFound)) {
      return st;
    }
    auto changed = refresh_key(key, o);
    if (!changed.ok() || !*changed) return st;
  }
}

ObjPtr StoreImpl::find(const std::string& key) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = objects_.find(key);
  return it == objects_.end() ? nullptr : it->second;
}

ObjPtr StoreImpl::lock_live(const std::string& key) {
  for (;;) {
    ObjPtr o = find(key);
    if (!o) return nullptr;
    o->io.lock();
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (o->live) return o;
    }
    o->io.unlock();
  }
}

ObjPtr StoreImpl::lock_live_shared(const std::string& key) {
  for (;;) {
    ObjPtr o = find(key);
    if (!o) return nullptr;
    o->io.lock_shared();
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (o->live) return o;
    }
    o->io.unlock_shared();
  }
}

void StoreImpl::lru_add_locked(const ObjPtr& o) {
  // A version replaced by an overwrite (or removed) while it was being promoted is not
  // listed: the LRU's reference would keep its memory allocated for good, where nothing
  // could evict it.
  if (o->in_lru || !o->live || (!o->on_host && !o->on_device)) return;
  auto& l = o->on_device ? device_lru_ : host_lru_;
  o->lru_it = l.insert(l.end(), o);
  o->in_lru = true;
}

void StoreImpl::lru_remove_locked(const ObjPtr& o) {
  if (!o->in_lru) return;
  // The list an entry is in is decided by where it was added; erase from whichever holds it.
  auto& l = (o->on_device ? device_lru_ : host_lru_);
  l.erase(o->lru_it);
  o->in_lru = false;
}

void StoreImpl::lru_touch(const ObjPtr& o) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!o->in_lru || !o->live) return;
  auto& l = o->on_device ? device_lru_ : host_lru_;
  l.splice(l.end(), l, o->lru_it);
}

void StoreImpl::install_locked(const ObjPtr& obj) {
  auto it = objects_.find(obj->key);
  if (it != objects_.end()) {
    it->second->live = false;
    lru_remove_locked(it->second);
    it->second = obj;
  } else {
    objects_.emplace(obj->key, obj);
  }
  obj->live = true;
  lru_add_locked(obj);
}

// ---------------------------------------------------------------- commit

catalog::ObjectRow StoreImpl::row_of(const Obj& o, const Layout& l) const {
  catalog::ObjectRow r;
  r.key = o.key;
  r.dtype = o.desc.dtype;
  r.shape = o.desc.shape;
  r.nbytes = o.nbytes;
  r.first_dir = o.first_dir;
  for (const auto& c : l) r.chunks.push_back({c.ext->dir, c.ext->offset, c.nbytes, c.checksum});
  return r;
}

Future<void> StoreImpl::enqueue_commit(std::vector<catalog::Op> ops,
                                       std::function<void(bool)> on_done) {
  auto req = std::make_shared<CommitReq>();
  req->ops = std::move(ops);
  req->on_done = std::move(on_done);
  Future<void> f = req->promise.future();
  {
    std::lock_guard<std::mutex> lk(commit_mu_);
    commit_q_.push_back(req);
  }
  commit_cv_.notify_one();
  return f;
}

void StoreImpl::committer_loop() {
  for (;;) {
    std::vector<std::shared_ptr<CommitReq>> batch;
    {
      std::unique_lock<std::mutex> lk(commit_mu_);
      commit_cv_.wait(lk, [&] { return commit_stop_ || !commit_q_.empty(); });
      if (commit_q_.empty()) return;
      batch.assign(commit_q_.begin(), commit_q_.end());
      commit_q_.clear();
    }
    // 1. Data first: fdatasync every data file written since the last batch. Every op in
    //    the batch was enqueued after its writes completed, and marked its directories
    //    before submitting them.
    Status st;
    std::vector<Future<void>> syncs;
    for (size_t d = 0; d < files_.size(); ++d) {
      if (dir_dirty_[d].exchange(false)) syncs.push_back(io(d).sync(files_[d]));
    }
    for (auto& f : syncs) {
      const auto& r = f.result();
      if (st.ok() && !r.ok()) st = r.status().with_context("fdatasync before catalog commit");
    }
    // 2. Then the rows, all in one transaction. When the file system is full (SQLite
    //    needs room for its write-ahead log even to delete rows), give back the data
    //    files' growth slack and retry; then the catalog ballast (see open). Without
    //    this a full disk would leave a store where not even remove() can commit.
    if (st.ok()) {
      std::vector<catalog::Op> all;
      for (auto& r : batch) all.insert(all.end(), r->ops.begin(), r->ops.end());
      st = catalog_->apply(all);
      if (st.code() == StatusCode::kResourceExhausted) {
        trim_data_files();
        st = catalog_->apply(all);
      }
      if (st.code() == StatusCode::kResourceExhausted && release_ballast()) {
        st = catalog_->apply(all);
      }
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto& r : batch) {
        if (r->on_done) r->on_done(st.ok());
      }
    }
    for (auto& r : batch) {
      r->on_done = nullptr;  // drop captured versions (and their extents) before waking waiters
      r->ops.clear();
    }
    if (st.ok() && ballast_missing_.load()) {
      trim_data_files();  // removes may have freed the end of a data file
      restore_ballast();
    }
    if (!st.ok()) {
      // The data may be durable but no row names it: mark everything dirty again so a
      // retry syncs (cheap) and report the error to every request of the batch.
      for (size_t d = 0; d < files_.size(); ++d) dir_dirty_[d].store(true);
    }
    for (auto& r : batch) r->promise.set(Result<void>(st));
  }
}

// ---------------------------------------------------------------- data movement

Status StoreImpl::ensure_file_size(uint32_t dir, uint64_t end) {
  if (file_end_[dir].load() >= end) return Status::OK();
  std::lock_guard<std::mutex> lk(grow_mu_);
  uint64_t cur = file_end_[dir].load();
  if (cur >= end) return Status::OK();
  // Grow geometrically: by the current size, at least 4 MiB and at most 1 GiB per step
  // (few metadata updates for big stores, little unused space for small ones); exactly to
  // `end` when that fails.
  uint64_t step = std::clamp<uint64_t>(cur, 4ull << 20, 1ull << 30);
  // Never take more than a quarter of the file system's free space as slack: the catalog
  // and the other directories' users need room too.
  struct statvfs vfs;
  if (::fstatvfs(grow_fds_[dir], &vfs) == 0) {
    const uint64_t avail = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    const uint64_t need = end - cur;
    step = avail > need ? std::min(step, (avail - need) / 4) : 0;
    // While the catalog ballast is released (the file system filled up), keep its room
    // free for the catalog: data may not take it, or nothing could commit again.
    if (ballast_missing_.load() && !ballast_path_.empty() && avail < need + kBallastBytes) {
      return Status(StatusCode::kResourceExhausted,
                    "data file " + files_[dir]->path() + ": growing by " + format_bytes(need) +
                        " would leave less than " + format_bytes(kBallastBytes) +
                        " free for the catalog (" + format_bytes(avail) +
                        " available on its file system)",
                    ENOSPC);
    }
  }
  uint64_t want = std::max(end, align_down(cur + step, kAlign));
  int rc = ::fallocate(grow_fds_[dir], 0, static_cast<off_t>(cur), static_cast<off_t>(want - cur));
  if (rc != 0 && want > end) {
    want = end;
    rc = ::fallocate(grow_fds_[dir], 0, static_cast<off_t>(cur), static_cast<off_t>(want - cur));
  }
  if (rc != 0) {
    int e = errno;
    if (e == EOPNOTSUPP) return Status::OK();  // the direct write will extend the file
    return errno_status(e, "fallocate " + files_[dir]->path() + " offset " + std::to_string(cur) +
                               " length " + std::to_string(want - cur));
  }
  file_end_[dir].store(want);
  return Status::OK();
}

void StoreImpl::trim_data_files() {
  std::lock_guard<std::mutex> lk(grow_mu_);
  for (uint32_t d = 0; d < grow_fds_.size(); ++d) {
    uint64_t keep = align_up(alloc_->end(d), kAlign);
    if (file_end_[d].load() <= keep) continue;
    Status st = store_detail::trim_data_file(grow_fds_[d], files_[d]->path(), keep);
    if (st.ok()) {
      file_end_[d].store(keep);
    } else {
      log_warn("store " + opts_.path + ": " + st.to_string());
    }
  }
}

bool StoreImpl::release_ballast() {
  if (ballast_path_.empty()) return false;
  if (::unlink(ballast_path_.c_str()) != 0) return false;
  log_warn("store " + opts_.path + ": file system full; released the catalog ballast (" +
           format_bytes(kBallastBytes) + ") so the catalog can commit");
  ballast_missing_ = true;
  return true;
}

void StoreImpl::restore_ballast() {
  if (!ballast_missing_ || ballast_path_.empty()) return;
  int fd = ::open(ballast_path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  if (::fallocate(fd, 0, 0, static_cast<off_t>(kBallastBytes)) == 0) {
    ballast_missing_ = false;
    ::close(fd);
  } else {
    ::close(fd);
    ::unlink(ballast_path_.c_str());  // still no room: try again after a later commit
  }
}

Result<PinnedBuffer> StoreImpl::staging(uint32_t dir, uint64_t nbytes) {
  auto r = groups_[dir_group_[dir]].staging->allocate(align_up(nbytes, kAlign),
                                                      std::chrono::minutes(10));
  if (!r.ok()) return r.status().with_context("staging buffer of " + format_bytes(nbytes));
  return r;
}

Status StoreImpl::copy_mem(void* dst, const void* src, uint64_t n, bool any_dev) {
  if (n == 0) return Status::OK();
  if (!any_dev) {
    std::memcpy(dst, src, n);
    return Status::OK();
  }
  store_detail::DeviceStream s(opts_.device_id);
  STRATA_RETURN_IF_ERROR(s.copy_async(dst, src, n));
  return s.synchronize();
}

Status StoreImpl::checksum_error(const std::string& key, uint32_t j, uint64_t chunk_start,
                                 const ChunkRef& c, uint64_t got) const {
  return data_loss("object '" + key + "': checksum mismatch in chunk " + std::to_string(j) +
                   " at object offset " + std::to_string(chunk_start) + " (" +
                   files_[c.ext->dir]->path() + " offset " + std::to_string(c.ext->offset) +
                   ", " + std::to_string(c.nbytes) + " bytes): stored xxh3 " +
                   hex64(c.checksum) + ", read " + hex64(got));
}

Result<uint64_t> StoreImpl::staged_write_chunk(
    const Extent& ext, uint64_t len,
    const std::function<Status(uint8_t*, uint64_t, uint64_t)>& fill) {
  const uint64_t piece = std::min(piece_bytes_, align_up(len, kAlign));
  STRATA_ASSIGN_OR_RETURN(PinnedBuffer buf, staging(ext.dir, 2 * piece));
  uint8_t* bufs[2] = {static_cast<uint8_t*>(buf.data()), static_cast<uint8_t*>(buf.data()) + piece};
  Future<uint64_t> pending[2];
  XXH3_state_t* h = XXH3_createState();
  XXH3_64bits_reset(h);
  Status st;
  mark_dir_dirty(ext.dir);
  uint64_t i = 0;
  for (uint64_t p = 0; p < len && st.ok(); p += piece, ++i) {
    int b = static_cast<int>(i % 2);
    if (pending[b].valid()) {
      const auto& r = pending[b].result();
      if (!r.ok()) {
        st = r.status();
        break;
      }
    }
    uint64_t plen = std::min(piece, len - p);
    st = fill(bufs[b], p, plen);
    if (!st.ok()) break;
    xxh3_update(h, bufs[b], plen);
    uint64_t padded = align_up(plen, kAlign);
    if (padded > plen) std::memset(bufs[b] + plen, 0, padded - plen);
    pending[b] = io(ext.dir).write(files_[ext.dir], bufs[b], padded, ext.offset + p);
  }
  for (auto& f : pending) {
    if (f.valid()) {
      const auto& r = f.result();
      if (st.ok() && !r.ok()) st = r.status();
    }
  }
  uint64_t digest = XXH3_64bits_digest(h);
  XXH3_freeState(h);
  if (!st.ok()) return st;
  return digest;
}

void StoreImpl::write_direct(uint32_t dir, const uint8_t* s,
                             uint64_t len, uint64_t offset, std::vector<Future<uint64_t>>& futs,
                             std::vector<AlignedBlock>& tails) {
  const uint64_t body = align_down(len, kAlign);
  const auto& file = files_[dir];
  IoEngine& engine = io(dir);
  if (body > 0) futs.push_back(engine.write(file, s, body, offset));
  if (len > body) {
    AlignedBlock t = aligned_block(kAlign);
    std::memset(t.get(), 0, kAlign);
    std::memcpy(t.get(), s + body, len - body);
    futs.push_back(engine.write(file, t.get(), kAlign, offset + body));
    tails.push_back(std::move(t));
  }
}

Result<LayoutPtr> StoreImpl::write_layout(const std::string& key, const uint8_t* src,
                                          uint64_t nbytes, uint32_t first_dir, bool src_dev) {
  auto l = write_layout_once(key, src, nbytes, first_dir, src_dev);
  if (!l.ok()) trim_data_files();  // its extents are released by now: give back the space
  return l;
}

Result<LayoutPtr> StoreImpl::write_layout_once(const std::string& key, const uint8_t* src,
                                               uint64_t nbytes, uint32_t first_dir,
                                               bool src_dev) {
  auto layout = std::make_shared<Layout>();
  if (nbytes == 0) return LayoutPtr(layout);
  const uint64_t nchunks = (nbytes + chunk_bytes_ - 1) / chunk_bytes_;
  const uint32_t k = static_cast<uint32_t>(dirs_.size());
  layout->resize(nchunks);
  std::vector<Future<uint64_t>> futs;
  std::vector<AlignedBlock> tails;
  // Place every chunk first, then grow each data file once to cover them, before the first
  // write: growing a file (fallocate) waits for all direct I/O in flight on it (ext4:
  // inode_dio_wait), so growing chunk by chunk would stall this put's own writes and those
  // of concurrent puts at every step.
  std::vector<uint64_t> need(k, 0);
  for (uint64_t j = 0; j < nchunks; ++j) {
    const uint64_t len = std::min(chunk_bytes_, nbytes - j * chunk_bytes_);
    const uint32_t dir = static_cast<uint32_t>((first_dir + j) % k);
    auto ext = alloc_->allocate(dir, align_up(len, kAlign), key);
    if (!ext.ok()) return ext.status().with_context("put '" + key + "'");
    need[dir] = std::max(need[dir], (*ext)->offset + (*ext)->len);
    (*layout)[j].ext = std::move(*ext);
    (*layout)[j].nbytes = len;
  }
  for (uint32_t d = 0; d < k; ++d) {
    if (need[d] == 0) continue;
    Status gs = ensure_file_size(d, need[d]);
    if (!gs.ok()) return gs.with_context("put '" + key + "'");
  }
  // Chunks in aligned host memory go straight from `src` to the disk (O_DIRECT): all of
  // them are submitted first, then hashed while the engine keeps the queue full, so the
  // checksum costs CPU time beside the transfer instead of delaying its submission.
  // Other chunks stream through staging buffers (hashed as they are filled).
  std::vector<uint64_t> hash_later;
  Status st;
  for (uint64_t j = 0; j < nchunks && st.ok(); ++j) {
    const uint64_t cs = j * chunk_bytes_;
    ChunkRef& c = (*layout)[j];
    const uint64_t len = c.nbytes;
    const uint32_t dir = c.ext->dir;
    const auto& file = files_[dir];
    const uint8_t* s = src + cs;
    bool direct = !src_dev && is_aligned_ptr(s, std::max<uint32_t>(file->memory_alignment(), 1));
    if (direct) {
      mark_dir_dirty(dir);
      write_direct(dir, s, len, c.ext->offset, futs, tails);
      hash_later.push_back(j);
    } else {
      auto h = staged_write_chunk(*c.ext, len, [&](uint8_t* buf, uint64_t off, uint64_t n) {
        return copy_mem(buf, s + off, n, src_dev);
      });
      if (!h.ok()) {
        st = h.status();
        break;
      }
      c.checksum = *h;
    }
  }
  for (uint64_t j : hash_later) {
    (*layout)[j].checksum = xxh3_64(src + j * chunk_bytes_, (*layout)[j].nbytes);
  }
  for (auto& f : futs) {
    const auto& r = f.result();
    if (st.ok() && !r.ok()) st = r.status();
  }
  if (!st.ok()) return st.with_context("put '" + key + "'");
  return LayoutPtr(layout);
}

Status StoreImpl::staged_read_chunk(
    const std::string& key, uint32_t j, uint64_t chunk_start, const ChunkRef& c, uint64_t lo,
    uint64_t hi, bool verify, const std::function<Status(const uint8_t*, uint64_t, uint64_t)>& sink) {
  // Range of the chunk to read: all of it when verifying, else the aligned cover of [lo, hi).
  uint64_t a = verify ? 0 : align_down(lo, kAlign);
  uint64_t b = verify ? c.nbytes : std::min(c.nbytes, align_up(hi, kAlign));
  const uint64_t piece = std::min(piece_bytes_, align_up(b - a, kAlign));
  STRATA_ASSIGN_OR_RETURN(PinnedBuffer buf, staging(c.ext->dir, 2 * piece));
  uint8_t* bufs[2] = {static_cast<uint8_t*>(buf.data()), static_cast<uint8_t*>(buf.data()) + piece};
  const auto& file = files_[c.ext->dir];
  XXH3_state_t* h = XXH3_createState();
  XXH3_64bits_reset(h);
  auto submit = [&](uint64_t p, int bi) {
    uint64_t plen = std::min(piece, b - p);
    return io(c.ext->dir).read(file, bufs[bi], align_up(plen, kAlign), c.ext->offset + p);
  };
  Status st;
  Future<uint64_t> next = submit(a, 0);
  uint64_t i = 0;
  for (uint64_t p = a; p < b; p += piece, ++i) {
    int bi = static_cast<int>(i % 2);
    const auto& r = next.result();
    if (!r.ok()) {
      st = r.status().with_context("object '" + key + "' chunk " + std::to_string(j));
      break;
    }
    uint64_t plen = std::min(piece, b - p);
    if (p + piece < b) next = submit(p + piece, 1 - bi);  // overlaps the hash and the copy
    if (verify) xxh3_update(h, bufs[bi], plen);
    uint64_t s0 = std::max(p, lo), s1 = std::min(p + plen, hi);
    if (s0 < s1) {
      st = sink(bufs[bi] + (s0 - p), s0, s1 - s0);
      if (!st.ok()) break;
    }
  }
  if (!st.ok() && next.valid()) next.wait();
  uint64_t got = XXH3_64bits_digest(h);
  XXH3_freeState(h);
  if (!st.ok()) return st;
  if (verify && got != c.checksum) return checksum_error(key, j, chunk_start, c, got);
  return Status::OK();
}

Status StoreImpl::read_layout(const std::string& key, const Layout& l, uint64_t off, uint64_t n,
                              uint8_t* dst, bool dst_dev, bool verify) {
  if (n == 0) return Status::OK();
  const uint64_t j0 = off / chunk_bytes_, j1 = (off + n - 1) / chunk_bytes_;
  struct Direct {
    uint32_t j;
    std::vector<Future<uint64_t>> futs;
    AlignedBlock tail;
    uint64_t body = 0;
  };
  std::vector<Direct> direct;
  Status st;
  // Whole chunks into aligned host memory: straight from the disk (O_DIRECT), all chunks in
  // flight at once; verified as they complete. The rest streams through staging buffers.
  for (uint64_t j = j0; j <= j1 && st.ok(); ++j) {
    const ChunkRef& c = l[j];
    const uint64_t cs = j * chunk_bytes_;
    const uint64_t lo = std::max(off, cs), hi = std::min(off + n, cs + c.nbytes);
    uint8_t* d = dst + (lo - off);
    const auto& file = files_[c.ext->dir];
    if (!file) return not_found("object '" + key + "': data file of directory " +
                                dirs_[c.ext->dir] + " is missing");
    bool whole = lo == cs && hi == cs + c.nbytes;
    if (whole && !dst_dev && is_aligned_ptr(d, std::max<uint32_t>(file->memory_alignment(), 1))) {
      Direct x;
      x.j = static_cast<uint32_t>(j);
      x.body = align_down(c.nbytes, kAlign);
      for (uint64_t p = 0; p < x.body; p += kHashPiece) {
        x.futs.push_back(io(c.ext->dir).read(file, d + p, std::min(kHashPiece, x.body - p),
                                       c.ext->offset + p));
      }
      if (c.nbytes > x.body) {
        x.tail = aligned_block(kAlign);
        x.futs.push_back(io(c.ext->dir).read(file, x.tail.get(), kAlign,
                                             c.ext->offset + x.body));
      }
      direct.push_back(std::move(x));
    } else {
      st = staged_read_chunk(key, static_cast<uint32_t>(j), cs, c, lo - cs, hi - cs, verify,
                             [&](const uint8_t* b, uint64_t coff, uint64_t len) {
                               return copy_mem(dst + (cs + coff - off), b, len, dst_dev);
                             });
    }
  }
  // Pieces complete in submission order (one FIFO engine queue); each is verified as soon
  // as it is in, while the later pieces are still in flight.
  for (auto& x : direct) {
    const ChunkRef& c = l[x.j];
    const uint64_t cs = static_cast<uint64_t>(x.j) * chunk_bytes_;
    uint8_t* d = dst + (cs - off);
    std::optional<Xxh3Stream> h;
    if (verify && st.ok()) h.emplace();
    for (size_t i = 0; i < x.futs.size(); ++i) {
      const auto& r = x.futs[i].result();
      if (st.ok() && !r.ok()) st = r.status().with_context("object '" + key + "' chunk " +
                                                           std::to_string(x.j));
      const uint64_t p = static_cast<uint64_t>(i) * kHashPiece;
      if (st.ok() && h && p < x.body) h->update(d + p, std::min(kHashPiece, x.body - p));
    }
    if (!st.ok()) continue;
    if (x.tail) {
      std::memcpy(d + x.body, x.tail.get(), c.nbytes - x.body);
      if (h) h->update(d + x.body, c.nbytes - x.body);
    }
    if (h) {
      const uint64_t got = h->digest();
      if (got != c.checksum) st = checksum_error(key, x.j, cs, c, got);
    }
  }
  return st;
}

// ---------------------------------------------------------------- tiers

ObjPtr StoreImpl::pick_victim(bool device, const Obj* self) {
  std::lock_guard<std::mutex> lk(mu_);
  auto& l = device ? device_lru_ : host_lru_;
  for (auto& o : l) {
    if (o.get() == self || o->pins > 0 || !o->live) continue;
    if (o->io.try_lock()) return o;
  }
  return nullptr;
}

Result<PinnedBuffer> StoreImpl::alloc_host(uint64_t nbytes, const Obj* self) {
  if (!host_pool_ || align_up(nbytes, kAlign) > host_pool_->budget_bytes()) {
    return resource_exhausted("host tier: object '" + self->key + "' of " + format_bytes(nbytes) +
                              " exceeds the host budget of " +
                              format_bytes(host_pool_ ? host_pool_->budget_bytes() : 0));
  }
  if (nbytes == 0) return PinnedBuffer();
  for (;;) {
    auto r = host_pool_->try_allocate(align_up(nbytes, kAlign));
    if (r.ok()) return r;
    if (r.status().code() != StatusCode::kResourceExhausted) return r.status();
    ObjPtr v = pick_victim(false, self);
    if (!v) {
      return resource_exhausted("host tier budget " + format_bytes(host_pool_->budget_bytes()) +
                                " is full and nothing is evictable (" +
                                format_bytes(host_pool_->used_bytes()) + " used, pinned or busy): " +
                                "cannot place '" + self->key + "' (" + format_bytes(nbytes) + ")");
    }
    Status st = demote_locked(v);
    v->io.unlock();
    if (!st.ok()) return st.with_context("evicting '" + v->key + "' from host");
  }
}

Result<std::shared_ptr<DeviceMem>> StoreImpl::alloc_device(uint64_t nbytes, const Obj* self) {
  if (!has_device_) {
#ifdef STRATA_HAVE_CUDA
    return invalid_argument("device tier: no GPU (device " + std::to_string(opts_.device_id) +
                            ") for object '" + self->key + "'");
#else
    return unimplemented("device tier: strata was built without CUDA (object '" + self->key + "')");
#endif
  }
  if (nbytes > device_budget_) {
    return resource_exhausted("device tier: object '" + self->key + "' of " + format_bytes(nbytes) +
                              " exceeds the device budget of " + format_bytes(device_budget_));
  }
  for (;;) {
    uint64_t used = device_used_->load();
    if (used + nbytes <= device_budget_) {
      if (!device_used_->compare_exchange_weak(used, used + nbytes)) continue;
      auto m = std::make_shared<DeviceMem>();
      m->id = opts_.device_id;
      m->nbytes = nbytes;
      auto p = store_detail::device_alloc(opts_.device_id, nbytes);
      if (!p.ok()) {
        device_used_->fetch_sub(nbytes);
        return p.status();
      }
      m->ptr = *p;
      m->used = device_used_;
      return m;
    }
    ObjPtr v = pick_victim(true, self);
    if (!v) {
      return resource_exhausted("device tier budget " + format_bytes(device_budget_) +
                                " is full and nothing is evictable: cannot place '" + self->key +
                                "' (" + format_bytes(nbytes) + ")");
    }
    Status st = demote_locked(v);
    v->io.unlock();
    if (!st.ok()) return st.with_context("evicting '" + v->key + "' from device");
  }
}

Status StoreImpl::demote_locked(const ObjPtr& o) {
  bool dirty, on_dev;
  uint8_t* mem;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!o->on_host && !o->on_device) return Status::OK();
    dirty = o->dirty;
    on_dev = o->on_device;
    mem = static_cast<uint8_t*>(o->mem());
  }
  if (dirty) {
    STRATA_ASSIGN_OR_RETURN(LayoutPtr l, write_layout(o->key, mem, o->nbytes, o->first_dir, on_dev));
    std::lock_guard<std::mutex> lk(mu_);
    o->current = l;
    o->dirty = false;
  }
  // Make the NVMe copy durable before the memory copy goes.
  LayoutPtr cur;
  bool need_commit;
  Future<void> commit;
  {
    std::lock_guard<std::mutex> lk(mu_);
    cur = o->current;
    auto it = durable_.find(o->key);
    // A commit in flight for this key (a newer put or a remove) supersedes this version.
    need_commit = o->live && !inflight_.count(o->key) && (it == durable_.end() || it->second != cur);
    if (need_commit) {
      std::vector<catalog::Op> ops(1);
      ops[0].row = row_of(*o, *cur);
      std::string key = o->key;
      ++inflight_[key];
      commit = enqueue_commit(std::move(ops), [this, key, cur](bool ok) {
        if (ok) durable_[key] = cur;
        if (--inflight_[key] == 0) inflight_.erase(key);
      });
    }
  }
  if (need_commit) STRATA_RETURN_IF_ERROR(commit.result().status());
  std::lock_guard<std::mutex> lk(mu_);
  lru_remove_locked(o);
  o->on_host = false;
  o->on_device = false;
  o->host = PinnedBuffer();
  o->dev.reset();
  return Status::OK();
}

Status StoreImpl::promote_locked(const ObjPtr& o, Tier tier) {
  if (!o->damage.empty()) return data_loss("store " + opts_.path + ": " + o->damage);
  Tier from;
  {
    std::lock_guard<std::mutex> lk(mu_);
    from = o->tier();
  }
  if (from == tier) return Status::OK();
  if (tier == Tier::kHost) {
    STRATA_ASSIGN_OR_RETURN(PinnedBuffer buf, alloc_host(o->nbytes, o.get()));
    if (from == Tier::kDevice) {
      STRATA_RETURN_IF_ERROR(copy_mem(buf.data(), o->dev->ptr, o->nbytes, true));
    } else {
      STRATA_RETURN_IF_ERROR(read_layout(o->key, *o->current, 0, o->nbytes,
                                         static_cast<uint8_t*>(buf.data()), false,
                                         opts_.verify_checksums));
    }
    std::lock_guard<std::mutex> lk(mu_);
    lru_remove_locked(o);
    o->dev.reset();
    o->on_device = false;
    o->host = std::move(buf);
    o->on_host = true;
    lru_add_locked(o);
    return Status::OK();
  }
  // tier == kDevice
  STRATA_ASSIGN_OR_RETURN(auto mem, alloc_device(o->nbytes, o.get()));
  if (from == Tier::kHost) {
    STRATA_RETURN_IF_ERROR(copy_mem(mem->ptr, o->host.data(), o->nbytes, true));
  } else {
    // NVMe -> pinned staging -> HBM, pipelined piece by piece (staged_read_chunk).
    STRATA_RETURN_IF_ERROR(read_layout(o->key, *o->current, 0, o->nbytes,
                                       static_cast<uint8_t*>(mem->ptr), true,
                                       opts_.verify_checksums));
  }
  std::lock_guard<std::mutex> lk(mu_);
  lru_remove_locked(o);
  o->host = PinnedBuffer();
  o->on_host = false;
  o->dev = std::move(mem);
  o->on_device = true;
  lru_add_locked(o);
  return Status::OK();
}

Status StoreImpl::move_impl(const std::string& key, Tier tier, bool prefetch_only) {
  ObjPtr o = lock_live(key);
  if (!o) return not_found("object '" + key + "' is not in store " + opts_.path);
  std::unique_lock<std::shared_mutex> held(o->io, std::adopt_lock);
  Tier from;
  int pins;
  {
    std::lock_guard<std::mutex> lk(mu_);
    from = o->tier();
    pins = o->pins;
  }
  if (prefetch_only && static_cast<int>(from) <= static_cast<int>(tier)) return Status::OK();
  if (tier == Tier::kNvme) {
    if (pins > 0 && from != Tier::kNvme) {
      return failed_precondition("object '" + key + "' is pinned in " +
                                 std::string(tier_name(from)) + "; unpin it before evicting");
    }
    return demote_locked(o);
  }
  return promote_locked(o, tier);
}

// ---------------------------------------------------------------- put / get / ranges

Future<void> StoreImpl::put(const std::string& key, const void* src, const TensorDesc& desc,
                            const PutOptions& opts) {
  if (key.empty()) return make_ready_future(Result<void>(invalid_argument("put: empty key")));
  if (Status st = store_detail::check_tensor_desc("put", key, desc); !st.ok()) {
    return make_ready_future(Result<void>(st));  // before anything is written
  }
  if (desc.nbytes() > 0 && src == nullptr) {
    return make_ready_future(Result<void>(invalid_argument("put '" + key + "': src is null")));
  }
  if (Status st = check_writable(); !st.ok()) return make_ready_future(Result<void>(st));
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!opts.overwrite && (objects_.count(key) || pending_creates_.count(key))) {
      return make_ready_future(Result<void>(
          already_exists("object '" + key + "' already exists in store " + opts_.path +
                         " (pass overwrite to replace it)")));
    }
    ++pending_creates_[key];
  }
  auto o = std::make_shared<Obj>();
  o->key = key;
  o->desc = desc;
  o->nbytes = desc.nbytes();
  o->first_dir = next_dir_.fetch_add(1) % static_cast<uint32_t>(dirs_.size());
  const uint8_t* s = static_cast<const uint8_t*>(src);
  auto release = [this, key] {  // under mu_
    if (--pending_creates_[key] == 0) pending_creates_.erase(key);
  };
  return run_op_async([=, this]() -> Future<void> {
    auto fail = [&](Status st) {
      std::lock_guard<std::mutex> lk(mu_);
      release();
      return make_ready_future(Result<void>(std::move(st)));
    };
    bool src_dev = store_detail::is_device_pointer(s);
    if (opts.tier == Tier::kNvme) {
      if (opts.pin) return fail(invalid_argument("put '" + key + "': pin needs the host or device tier"));
      auto l = write_layout(key, s, o->nbytes, o->first_dir, src_dev);
      if (!l.ok()) return fail(l.status());
      o->current = *l;
      std::lock_guard<std::mutex> lk(mu_);
      if (opts_.durability == Durability::kOnFlush) {
        install_locked(o);
        release();
        return make_ready_future();
      }
      // The worker does not wait for the commit: the committer completes the future, so
      // many small puts share one fdatasync + one transaction (group commit).
      ++inflight_[key];
      std::vector<catalog::Op> ops(1);
      ops[0].row = row_of(*o, *o->current);
      return enqueue_commit(std::move(ops), [this, o, release](bool ok) {
        if (ok) {
          install_locked(o);
          durable_[o->key] = o->current;
        }
        if (--inflight_[o->key] == 0) inflight_.erase(o->key);
        release();
      });
    }
    // Memory tiers: the object is dirty until flushed / evicted.
    if (opts.tier == Tier::kHost) {
      auto b = alloc_host(o->nbytes, o.get());
      if (!b.ok()) return fail(b.status());
      o->host = std::move(*b);
      if (Status st = copy_mem(o->host.data(), s, o->nbytes, src_dev); !st.ok()) return fail(st);
      o->on_host = true;
    } else {
      auto m = alloc_device(o->nbytes, o.get());
      if (!m.ok()) return fail(m.status());
      o->dev = *m;
      if (Status st = copy_mem(o->dev->ptr, s, o->nbytes, true); !st.ok()) return fail(st);
      o->on_device = true;
    }
    o->dirty = true;
    o->pins = opts.pin ? 1 : 0;
    std::lock_guard<std::mutex> lk(mu_);
    install_locked(o);
    release();
    return make_ready_future();
  });
}

Status StoreImpl::get_from(const ObjPtr& o, uint64_t off, uint64_t n, uint8_t* dst) {
  if (!o->damage.empty()) return data_loss("store " + opts_.path + ": " + o->damage);
  bool dst_dev = store_detail::is_device_pointer(dst);
  uint8_t* mem;
  bool mem_dev;
  LayoutPtr cur;
  {
    std::lock_guard<std::mutex> lk(mu_);
    mem = static_cast<uint8_t*>(o->mem());
    mem_dev = o->on_device;
    cur = o->current;
  }
  if (o->on_host || o->on_device) return copy_mem(dst, mem + off, n, dst_dev || mem_dev);
  if (!cur) return internal_error("object '" + o->key + "' has no copy in any tier");
  return read_layout(o->key, *cur, off, n, dst, dst_dev, opts_.verify_checksums);
}

Future<void> StoreImpl::get_impl(const std::string& key, void* dst, uint64_t nbytes,
                                 const TensorDesc* desc_ptr) {
  std::optional<TensorDesc> desc;
  if (desc_ptr) desc = *desc_ptr;
  return run_op(false, [=, this]() -> Status {
    return with_current_object(key, [&](const ObjPtr& o) -> Status {
      if (!o->damage.empty()) return data_loss("store " + opts_.path + ": " + o->damage);
      if (desc && (desc->dtype != o->desc.dtype || desc->shape != o->desc.shape)) {
        return invalid_argument("get '" + key + "': the object is " + to_string(o->desc) +
                                ", the destination is " + to_string(*desc));
      }
      if (nbytes != o->nbytes) {
        return invalid_argument("get '" + key + "': the object is " + std::to_string(o->nbytes) +
                                " bytes, the destination " + std::to_string(nbytes) + " bytes");
      }
      if (nbytes > 0 && dst == nullptr) return invalid_argument("get '" + key + "': dst is null");
      std::shared_lock<std::shared_mutex> rl(o->io);
      Status st = get_from(o, 0, nbytes, static_cast<uint8_t*>(dst));
      lru_touch(o);
      return st;
    });
  });
}

Future<void> StoreImpl::get_alloc(const std::string& key,
                                  std::function<Result<void*>(const TensorDesc&)> allocate) {
  return run_op(false, [=, this, allocate = std::move(allocate)]() -> Status {
    return with_current_object(key, [&](const ObjPtr& o) -> Status {
      if (!o->damage.empty()) return data_loss("store " + opts_.path + ": " + o->damage);
      // `o` is one version: an overwrite installs a new Obj, and this one's memory and
      // extents stay valid while `o` is held and its io lock is shared.
      STRATA_ASSIGN_OR_RETURN(void* dst, allocate(o->desc));
      if (o->nbytes > 0 && dst == nullptr) {
        return invalid_argument("get '" + key + "': the allocator returned null for " +
                                std::to_string(o->nbytes) + " bytes");
      }
      std::shared_lock<std::shared_mutex> rl(o->io);
      Status st = get_from(o, 0, o->nbytes, static_cast<uint8_t*>(dst));
      lru_touch(o);
      return st;
    });
  });
}

Future<void> StoreImpl::read_range(const std::string& key, uint64_t off, uint64_t n, void* dst) {
  return run_op(false, [=, this]() -> Status {
    return with_current_object(key, [&](const ObjPtr& o) -> Status {
      if (!o->damage.empty()) return data_loss("store " + opts_.path + ": " + o->damage);
      if (off > o->nbytes || n > o->nbytes - off) {
        return range_error("read_range", key, off, n, o->nbytes);
      }
      if (n > 0 && dst == nullptr) {
        return invalid_argument("read_range '" + key + "': dst is null");
      }
      std::shared_lock<std::shared_mutex> rl(o->io);
      Status st = get_from(o, off, n, static_cast<uint8_t*>(dst));
      lru_touch(o);
      return st;
    });
  });
}

Status StoreImpl::write_range_impl(const ObjPtr& o, uint64_t off, uint64_t n, const uint8_t* src) {
  if (!o->damage.empty()) return data_loss("store " + opts_.path + ": " + o->damage);
  bool src_dev = store_detail::is_device_pointer(src);
  uint8_t* mem;
  bool mem_dev;
  LayoutPtr cur;
  {
    std::lock_guard<std::mutex> lk(mu_);
    mem = static_cast<uint8_t*>(o->mem());
    mem_dev = o->on_device;
    cur = o->current;
  }
  if (o->on_host || o->on_device) {
    STRATA_RETURN_IF_ERROR(copy_mem(mem + off, src, n, src_dev || mem_dev));
    std::lock_guard<std::mutex> lk(mu_);
    o->dirty = true;
    return Status::OK();
  }
  // NVMe only: copy-on-write per chunk. The catalog keeps naming the old extents until the
  // next flush(); a crash restores them. The new chunks replace the old ones in the layout
  // only once all of them are written: a failure leaves the object as it was, and the new
  // extents are released with `written`.
  const uint64_t j0 = off / chunk_bytes_, j1 = (off + n - 1) / chunk_bytes_;
  std::vector<std::pair<uint64_t, ChunkRef>> written;
  written.reserve(j1 - j0 + 1);
  for (uint64_t j = j0; j <= j1; ++j) {
    const ChunkRef old = (*cur)[j];
    const uint64_t cs = j * chunk_bytes_;
    const uint64_t lo = std::max(off, cs) - cs, hi = std::min(off + n, cs + old.nbytes) - cs;
    STRATA_ASSIGN_OR_RETURN(auto ext, alloc_->allocate(old.ext->dir, old.ext->len, o->key));
    STRATA_RETURN_IF_ERROR(ensure_file_size(ext->dir, ext->offset + ext->len));
    const uint8_t* s = src + (cs + lo - off);
    ChunkRef nc{ext, old.nbytes, 0};
    const auto& file = files_[ext->dir];
    if (lo == 0 && hi == old.nbytes && !src_dev &&
        is_aligned_ptr(s, std::max<uint32_t>(file->memory_alignment(), 1)) &&
        old.nbytes % kAlign == 0) {
      mark_dir_dirty(ext->dir);
      std::vector<Future<uint64_t>> futs;
      std::vector<AlignedBlock> tails;
      write_direct(ext->dir, s, old.nbytes, ext->offset, futs, tails);
      nc.checksum = xxh3_64(s, old.nbytes);  // while the write is in flight
      Status wst;
      for (auto& f : futs) {
        const auto& r = f.result();
        if (wst.ok() && !r.ok()) wst = r.status();
      }
      STRATA_RETURN_IF_ERROR(wst);
    } else {
      // Read-modify-write piece by piece: old bytes outside [lo, hi) (verified), new inside.
      XXH3_state_t* vh = nullptr;
      bool partial = !(lo == 0 && hi == old.nbytes);
      if (partial && opts_.verify_checksums) {
        vh = XXH3_createState();
        XXH3_64bits_reset(vh);
      }
      const auto& ofile = files_[old.ext->dir];
      auto h = staged_write_chunk(*ext, old.nbytes, [&](uint8_t* buf, uint64_t p, uint64_t plen) {
        if (partial) {
          STRATA_RETURN_IF_ERROR(io(old.ext->dir).read(ofile, buf, align_up(plen, kAlign),
                                               old.ext->offset + p).result().status());
          if (vh) xxh3_update(vh, buf, plen);
        }
        uint64_t a = std::max(p, lo), b = std::min(p + plen, hi);
        if (a < b) STRATA_RETURN_IF_ERROR(copy_mem(buf + (a - p), src + (cs + a - off), b - a, src_dev));
        return Status::OK();
      });
      uint64_t got = vh ? XXH3_64bits_digest(vh) : 0;
      if (vh) XXH3_freeState(vh);
      if (!h.ok()) return h.status().with_context("write_range '" + o->key + "'");
      if (vh && got != old.checksum) return checksum_error(o->key, static_cast<uint32_t>(j), cs, old, got);
      nc.checksum = *h;
    }
    written.emplace_back(j, std::move(nc));
  }
  // Concurrent write_range calls on this object touch other chunks: start from the layout
  // as it is now, so their chunks are kept.
  std::lock_guard<std::mutex> lk(mu_);
  auto l = std::make_shared<Layout>(*o->current);
  for (auto& [j, nc] : written) (*l)[j] = std::move(nc);
  o->current = l;
  return Status::OK();
}

Future<void> StoreImpl::write_range(const std::string& key, uint64_t off, uint64_t n,
                                    const void* src) {
  return run_op(true, [=, this]() -> Status {
    ObjPtr o = lock_live_shared(key);
    if (!o) return not_found("object '" + key + "' is not in store " + opts_.path);
    std::shared_lock<std::shared_mutex> held(o->io, std::adopt_lock);
    if (off > o->nbytes || n > o->nbytes - off) {
      return range_error("write_range", key, off, n, o->nbytes);
    }
    if (n > 0 && src == nullptr) return invalid_argument("write_range '" + key + "': src is null");
    if (n == 0) return Status::OK();
    Status st = write_range_impl(o, off, n, static_cast<const uint8_t*>(src));
    if (!st.ok()) trim_data_files();  // the failed copy-on-write extents are released
    lru_touch(o);
    return st;
  });
}

// ---------------------------------------------------------------- pin / remove / flush

Future<void> StoreImpl::pin(const std::string& key) {
  return run_op(true, [=, this]() -> Status {
    ObjPtr o = lock_live(key);
    if (!o) return not_found("object '" + key + "' is not in store " + opts_.path);
    std::unique_lock<std::shared_mutex> held(o->io, std::adopt_lock);
    if (!o->on_host && !o->on_device) STRATA_RETURN_IF_ERROR(promote_locked(o, Tier::kHost));
    std::lock_guard<std::mutex> lk(mu_);
    ++o->pins;
    return Status::OK();
  });
}

Future<void> StoreImpl::unpin(const std::string& key) {
  return run_op(true, [=, this]() -> Status {
    ObjPtr o = lock_live(key);
    if (!o) return not_found("object '" + key + "' is not in store " + opts_.path);
    std::unique_lock<std::shared_mutex> held(o->io, std::adopt_lock);
    std::lock_guard<std::mutex> lk(mu_);
    if (o->pins == 0) return failed_precondition("unpin: object '" + key + "' is not pinned");
    --o->pins;
    return Status::OK();
  });
}

Future<void> StoreImpl::remove(const std::string& key) {
  return run_op(true, [=, this]() -> Status {
    ObjPtr o = lock_live(key);
    if (!o) return not_found("object '" + key + "' is not in store " + opts_.path);
    std::unique_lock<std::shared_mutex> held(o->io, std::adopt_lock);
    auto drop = [this, o](bool ok) {
      if (!ok) {
        if (--inflight_[o->key] == 0) inflight_.erase(o->key);
        return;
      }
      auto it = objects_.find(o->key);
      if (it != objects_.end() && it->second == o) objects_.erase(it);
      o->live = false;
      lru_remove_locked(o);
      durable_.erase(o->key);
      if (--inflight_[o->key] == 0) inflight_.erase(o->key);
    };
    Future<void> f;
    {
      std::lock_guard<std::mutex> lk(mu_);
      ++inflight_[key];
      if (!durable_.count(key) && inflight_[key] == 1) {
        drop(true);
        return Status::OK();
      }
      std::vector<catalog::Op> ops(1);
      ops[0].kind = catalog::Op::kDelete;
      ops[0].row.key = key;
      f = enqueue_commit(std::move(ops), drop);
    }
    return f.result().status();
  });
}

Status StoreImpl::flush_impl() {
  // 1. Write back every dirty memory copy (each under its own lock). One that cannot be
  //    written (e.g. the NVMe budget is full) does not stop the others, nor the commit of
  //    everything written: the first such error is returned after the commit.
  Status first_error;
  std::vector<ObjPtr> snapshot;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& [k, o] : objects_) snapshot.push_back(o);
  }
  for (auto& o : snapshot) {
    bool dirty;
    {
      std::lock_guard<std::mutex> lk(mu_);
      dirty = o->dirty && o->live;
    }
    if (!dirty) continue;
    std::unique_lock<std::shared_mutex> held(o->io);
    uint8_t* mem;
    bool on_dev;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!o->dirty || !o->live) continue;
      mem = static_cast<uint8_t*>(o->mem());
      on_dev = o->on_device;
    }
    auto l = write_layout(o->key, mem, o->nbytes, o->first_dir, on_dev);
    if (!l.ok()) {
      if (first_error.ok()) first_error = l.status();
      continue;
    }
    std::lock_guard<std::mutex> lk(mu_);
    o->current = *l;
    o->dirty = false;
  }
  // 2. Lock every changed live version (key order), enqueue one batch, unlock.
  std::vector<catalog::Op> ops;
  std::vector<std::pair<std::string, LayoutPtr>> updates;
  // 2. Under mu_, one batch of every live version whose NVMe copy the catalog does not name
  //    yet. Keys with a commit in flight are skipped: that commit (a newer put or a
  //    remove) supersedes this version and is ordered after it anyway.
  Future<void> f;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& [key, o] : objects_) {
      auto it = durable_.find(key);
      if (!o->current || o->dirty || inflight_.count(key) ||
          (it != durable_.end() && it->second == o->current)) {
        continue;
      }
      catalog::Op op;
      op.row = row_of(*o, *o->current);
      ops.push_back(std::move(op));
      updates.emplace_back(key, o->current);
    }
    for (auto& u : updates) ++inflight_[u.first];
    f = enqueue_commit(std::move(ops), [this, updates](bool ok) {
      for (auto& [k, l] : updates) {
        if (ok) durable_[k] = l;
        if (--inflight_[k] == 0) inflight_.erase(k);
      }
    });
  }
  Status committed = f.result().status();
  return first_error.ok() ? committed : first_error;
}

// ---------------------------------------------------------------- queries

ObjectInfo StoreImpl::info_locked(const Obj& o) const {
  ObjectInfo i;
  i.key = o.key;
  i.dtype = o.desc.dtype;
  i.shape = o.desc.shape;
  i.nbytes = o.nbytes;
  i.tier = o.tier();
  i.on_nvme = o.current != nullptr;
  auto it = durable_.find(o.key);
  i.dirty = o.dirty || it == durable_.end() || it->second != o.current;
  i.pinned = o.pins > 0;
  i.num_chunks = o.current ? static_cast<uint32_t>(o.current->size()) : 0;
  i.damage = o.damage;
  return i;
}

Result<ObjectInfo> StoreImpl::stat(const std::string& key) const {
  CallScope call(this);  // close() waits for it; a closed store: FailedPrecondition
  STRATA_RETURN_IF_ERROR(call.status);
  // Read-only open: the catalog's current row, not the one loaded at open (a writer may
  // have replaced, removed or created the key since). Observing outside state, hence the
  // cast: the in-memory mirror is what changes.
  if (read_only_) (void)const_cast<StoreImpl*>(this)->refresh_key(key, find(key));
  std::lock_guard<std::mutex> lk(mu_);
  auto it = objects_.find(key);
  if (it == objects_.end()) return not_found("object '" + key + "' is not in store " + opts_.path);
  return info_locked(*it->second);
}

std::vector<ObjectInfo> StoreImpl::list(std::string_view prefix) const {
  CallScope call(this);
  if (!call.status.ok()) return {};  // closed
  if (read_only_) {
    // As stat(): another process may be writing; list what is committed now. On a catalog
    // read error, list what this open knows (stat/get of a listed key report the error).
    Status st = const_cast<StoreImpl*>(this)->refresh_prefix(std::string(prefix));
    if (!st.ok()) log_warn("store " + opts_.path + ": list: " + st.to_string());
  }
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<ObjectInfo> out;
  for (auto it = objects_.lower_bound(std::string(prefix)); it != objects_.end(); ++it) {
    if (it->first.compare(0, prefix.size(), prefix) != 0) break;
    out.push_back(info_locked(*it->second));
  }
  return out;
}

StoreUsage StoreImpl::usage() const {
  StoreUsage u;
  CallScope call(this);
  if (!call.status.ok()) return u;  // closed: all zero
  u.device_budget_bytes = device_budget_;
  u.device_bytes = device_used_->load();
  u.host_budget_bytes = host_pool_ ? host_pool_->budget_bytes() : 0;
  u.host_bytes = host_pool_ ? host_pool_->used_bytes() : 0;
  u.nvme_budget_bytes = opts_.nvme_budget_bytes;
  u.nvme_bytes = alloc_->used();
  std::lock_guard<std::mutex> lk(mu_);
  u.objects = objects_.size();
  return u;
}

Result<VerifyReport> StoreImpl::verify() {
  CallScope call(this);
  STRATA_RETURN_IF_ERROR(call.status);
  VerifyReport rep;
  if (read_only_) STRATA_RETURN_IF_ERROR(refresh_prefix(""));  // as list()
  std::vector<ObjPtr> snapshot;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& [k, o] : objects_) snapshot.push_back(o);
  }
  for (const auto& first : snapshot) {
    ObjPtr o = first;
    for (int attempt = 0;; ++attempt) {
      VerifyReport one;  // this object's figures and errors
      LayoutPtr cur;
      {
        std::lock_guard<std::mutex> lk(mu_);
        cur = o->current;
      }
      one.objects = 1;
      if (!o->damage.empty()) {
        one.errors.push_back(data_loss("store " + opts_.path + ": " + o->damage));
      }
      for (uint32_t j = 0; o->damage.empty() && cur && j < cur->size(); ++j) {
        const ChunkRef& c = (*cur)[j];
        ++one.chunks;
        one.bytes += c.nbytes;
        if (!files_[c.ext->dir]) {
          one.errors.push_back(not_found("object '" + o->key + "' chunk " + std::to_string(j) +
                                         ": data file in " + dirs_[c.ext->dir] + " is missing"));
          continue;
        }
        Status st = staged_read_chunk(o->key, j, uint64_t{j} * chunk_bytes_, c, 0, 0, true,
                                      [](const uint8_t*, uint64_t, uint64_t) { return Status::OK(); });
        if (!st.ok()) one.errors.push_back(st);
      }
      // Read-only open beside a writer: an error against a row the writer has replaced
      // since (reusing the old extents) is not damage; check the current version instead.
      if (!one.errors.empty() && read_only_ && attempt < 8) {
        auto changed = refresh_key(o->key, o);
        if (changed.ok() && *changed) {
          o = find(first->key);
          if (!o) break;  // removed by the writer: nothing to verify
          continue;
        }
      }
      rep.objects += one.objects;
      rep.chunks += one.chunks;
      rep.bytes += one.bytes;
      for (auto& e : one.errors) rep.errors.push_back(std::move(e));
      break;
    }
  }
  return rep;
}

}  // namespace

Result<std::unique_ptr<Store>> Store::open(StoreOptions options) {
  auto s = std::make_unique<StoreImpl>();
  Status st = s->init(std::move(options));
  if (!st.ok()) return st;
  return std::unique_ptr<Store>(std::move(s));
}

Result<std::vector<ObjectInfo>> list_store(const std::string& path, std::string_view prefix) {
  STRATA_RETURN_IF_ERROR(store_detail::check_path("store path", path));
  STRATA_ASSIGN_OR_RETURN(auto cat, catalog::Catalog::open(path + "/catalog.db", false, true));
  STRATA_ASSIGN_OR_RETURN(auto rows, cat->load_all(std::string(prefix)));
  STRATA_ASSIGN_OR_RETURN(auto cb, cat->get_meta("chunk_bytes"));
  STRATA_ASSIGN_OR_RETURN(auto nd, cat->get_meta("nvme_dirs"));
  const std::string cat_path = path + "/catalog.db";
  if (!cb) return data_loss("catalog " + cat_path + " lacks chunk_bytes");
  STRATA_ASSIGN_OR_RETURN(const uint64_t chunk, parse_chunk_bytes(*cb, cat_path));
  const size_t ndirs = nd ? static_cast<size_t>(std::count(nd->begin(), nd->end(), '\n')) : 0;
  std::vector<ObjectInfo> out;
  for (auto& r : rows) {
    ObjectInfo i;
    i.key = r.key;
    i.dtype = r.dtype;
    i.shape = r.shape;
    i.nbytes = r.nbytes;
    i.tier = Tier::kNvme;
    i.on_nvme = true;
    i.num_chunks = static_cast<uint32_t>(r.chunks.size());
    i.damage = store_detail::row_damage(r, ndirs, chunk);
    out.push_back(std::move(i));
  }
  return out;
}

}  // namespace strata
