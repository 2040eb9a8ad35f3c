// strata::store (private) — the live counters behind Store::stats() (stats.hpp): relaxed
// atomics bumped on the data path, no lock; and the optional periodic log of their deltas
// (StoreOptions::stats_interval, STRATA_STATS_INTERVAL).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "strata/store/stats.hpp"
#include "strata/store/store.hpp"

namespace strata::store_detail {

/// One relaxed counter.
struct Counter {
  std::atomic<uint64_t> v{0};
  void add(uint64_t n) { v.fetch_add(n, std::memory_order_relaxed); }
  uint64_t get() const { return v.load(std::memory_order_relaxed); }
  void reset() { v.store(0, std::memory_order_relaxed); }
};

/// The counters of one tier; a cache line of its own (completion threads of different
/// tiers do not contend).
struct alignas(64) TierCounters {
  Counter read_bytes, read_ops, write_bytes, write_ops;
  void read(uint64_t nbytes) {
    read_ops.add(1);
    read_bytes.add(nbytes);
  }
  void write(uint64_t nbytes) {
    write_ops.add(1);
    write_bytes.add(nbytes);
  }
};

using StatsClock = std::chrono::steady_clock;

/// Nanoseconds since `t0` (for the wait counters).
inline uint64_t ns_since(StatsClock::time_point t0) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(StatsClock::now() - t0).count());
}

/// Every counter of StoreStats (stats.hpp documents each). The pools' gauges are read from
/// the pools when a snapshot is taken.
struct StoreCounters {
  TierCounters tier[3];  // indexed by Tier
  alignas(64) Counter promotions, promotion_bytes, evictions, eviction_bytes, lru_evictions,
      writebacks, writeback_bytes, checksum_failures, prefetches, prefetch_hits,
      prefetch_misses;
  alignas(64) Counter nvme_read_wait_ns, nvme_write_wait_ns;
  std::atomic<int64_t> since_ns{StatsClock::now().time_since_epoch().count()};

  TierCounters& nvme() { return tier[static_cast<int>(Tier::kNvme)]; }
  TierCounters& of(Tier t) { return tier[static_cast<int>(t)]; }
  /// The counters (not the pool gauges) as a StoreStats.
  StoreStats snapshot() const;
  /// Every counter to 0; the interval starts now.
  void reset();
};

/// Logs one line of counter deltas (format_stats_line) to stderr every `interval`, from a
/// thread of its own, until stopped (also by the destructor). `read` takes a snapshot.
class StatsLogger {
 public:
  StatsLogger(std::string name, std::chrono::milliseconds interval,
              std::function<StoreStats()> read);
  /// Ends the thread without a last line (the counters `read` reads may be gone by then).
  ~StatsLogger() { end_thread(); }
  StatsLogger(const StatsLogger&) = delete;
  StatsLogger& operator=(const StatsLogger&) = delete;
  /// Logs the last, partial interval (what happened since the last line, so every counted
  /// operation appears in some line) and ends the thread. Idempotent.
  void stop();

 private:
  void loop();
  /// Stops and joins the thread; false when it was already stopped.
  bool end_thread();
  /// Writes one line of the deltas since `last_` and makes `now` the new `last_`.
  void log_since_last(const StoreStats& now);
  std::string name_;
  std::chrono::milliseconds interval_;
  std::function<StoreStats()> read_;
  StoreStats last_;  // the counters at the previous line (at construction for the first)
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace strata::store_detail
