// strata::store — the counters of a store (Store::stats()), docs/store.md "Stats".
//
// Counters are per process and per open store: they start at 0 at Store::open() and count
// what this Store object did since then (or since the last Store::reset_stats()). They are
// relaxed atomics updated on the data path without a lock: a snapshot taken while operations
// run is not one instant (two counters of one operation may straddle it), but every counter
// is exact once the operations it counts have completed.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace strata {

/// Bytes and operations one tier served, in one direction each.
///  - nvme: every transfer to or from the data files, whatever caused it (put, get, a
///    promotion's read, a write-back, write_range's read-modify-write, verify()).
///    read_ops / write_ops count chunk transfers (one per chunk read or written, a partial
///    chunk included); read_bytes / write_bytes the bytes the disk moved: a chunk's bytes
///    rounded up to 4 KiB (the extent), and for a partial read without verification the
///    4 KiB-aligned cover of the range.
///  - host, device: the data operations served by that tier's memory copy: read_* the gets
///    and read_ranges served from it, write_* the puts into it and the write_ranges of an
///    object it holds; ops count calls, bytes the bytes copied. Tier moves are counted in
///    StoreStats' promotions / evictions instead (their NVMe I/O in nvme).
struct TierIoStats {
  uint64_t read_bytes = 0;
  uint64_t read_ops = 0;
  uint64_t write_bytes = 0;
  uint64_t write_ops = 0;
};

/// Occupancy of the pinned pools of one kind (host tier or staging), summed over the pools.
/// Gauges, not counters: reset_stats() sets peak_bytes to in_use_bytes and leaves the rest.
struct PinnedPoolStats {
  uint64_t in_use_bytes = 0;   ///< allocated now (requests rounded up to the pool alignment)
  uint64_t capacity_bytes = 0; ///< the pools' budgets
  uint64_t peak_bytes = 0;     ///< most in use at once, since open or reset_stats()
  /// Pinned memory the pools hold now (their segments; grows on demand up to
  /// capacity_bytes, docs/pinned-memory.md).
  uint64_t committed_bytes = 0;
};

/// A snapshot of a store's counters (Store::stats()). Units: bytes, operations, seconds.
struct StoreStats {
  TierIoStats device, host, nvme;

  /// Copies of an object up to a faster tier (move, prefetch, pin of an NVMe-only object),
  /// and their bytes (the object's size).
  uint64_t promotions = 0, promotion_bytes = 0;
  /// Objects that left a memory tier for a slower one: evict(), move() down (device to host
  /// included) and the LRU making room; their bytes. lru_evictions counts the last kind
  /// alone (a put, promotion or pin that needed room in a full tier).
  uint64_t evictions = 0, eviction_bytes = 0;
  uint64_t lru_evictions = 0;
  /// Dirty memory copies written back to NVMe (flush, close, eviction), and their bytes.
  uint64_t writebacks = 0, writeback_bytes = 0;

  /// Chunks read from NVMe whose XXH3-64 did not match (each DataLoss of a get, read_range,
  /// promotion, write_range's read-modify-write or a verify() finding).
  uint64_t checksum_failures = 0;

  /// prefetch() calls that copied an object up (not those that found it there already).
  uint64_t prefetches = 0;
  /// Reads (get, get_bytes, get_alloc, read_range) served from a memory copy that a
  /// prefetch() brought up: the first read after each prefetch.
  uint64_t prefetch_hits = 0;
  /// Reads served from NVMe: the object had no memory copy, so the read waited for the disk.
  uint64_t prefetch_misses = 0;

  /// Time operations waited on the NVMe tier, in seconds, summed over the operations (so
  /// concurrent ones add up: divided by the elapsed time it is the mean number of NVMe
  /// transfers in flight). read: from the first chunk request of a read (get, read_range,
  /// promotion, verify) to the completion of its last chunk; write: from the first chunk
  /// request of a write (put, write-back, write_range) to the completion of its last chunk
  /// (the fdatasync and catalog commit of a put are not included).
  double nvme_read_wait_seconds = 0.0;
  double nvme_write_wait_seconds = 0.0;

  PinnedPoolStats host_pool;     ///< the host tier's pinned memory
  PinnedPoolStats staging_pool;  ///< the staging buffers' pinned memory (all NUMA groups)

  /// Seconds since open() or the last reset_stats() (the interval these counters cover).
  double elapsed_seconds = 0.0;
};

/// `b - a` for every counter (gauges: b's values), e.g. for a rate over an interval.
StoreStats stats_delta(const StoreStats& a, const StoreStats& b);

/// One field of a StoreStats under its flat name, the one Python's Store.stats() dict and the
/// C struct strata_store_stats_t use: "nvme_read_bytes", "host_write_ops", "promotions",
/// "nvme_read_wait_seconds", "host_pool_peak_bytes", ... (docs/store.md lists them all).
struct StatField {
  const char* name;
  bool is_seconds;     ///< a time: `seconds` holds it; else `value`
  uint64_t value;
  double seconds;
};
/// Every field of `s`, in the order of the struct (device, host, nvme, moves, ..., elapsed).
std::vector<StatField> stat_fields(const StoreStats& s);

/// "interval=1.00s nvme_read_bytes=4194304 nvme_read_ops=4 ...": the interval
/// (elapsed_seconds) and then every non-zero field of `s` as name=value (seconds with 3
/// decimals): what the periodic log prints (STRATA_STATS_INTERVAL) for the deltas.
std::string format_stats_line(const StoreStats& s);

}  // namespace strata
