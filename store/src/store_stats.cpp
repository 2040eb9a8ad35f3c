// strata::store — the store's counters (stats.hpp): snapshot, reset, deltas, their flat
// names, and the periodic log line (StatsLogger).
#include "store_stats.hpp"

#include <cstdio>

#include "strata/base/logging.hpp"

namespace strata {

namespace {

uint64_t sub(uint64_t a, uint64_t b) { return b >= a ? b - a : b; }  // b < a: reset between
double sub(double a, double b) { return b >= a ? b - a : b; }

void tier_delta(const TierIoStats& a, const TierIoStats& b, TierIoStats& d) {
  d.read_bytes = sub(a.read_bytes, b.read_bytes);
  d.read_ops = sub(a.read_ops, b.read_ops);
  d.write_bytes = sub(a.write_bytes, b.write_bytes);
  d.write_ops = sub(a.write_ops, b.write_ops);
}

}  // namespace

StoreStats stats_delta(const StoreStats& a, const StoreStats& b) {
  StoreStats d = b;  // gauges: b's
  tier_delta(a.device, b.device, d.device);
  tier_delta(a.host, b.host, d.host);
  tier_delta(a.nvme, b.nvme, d.nvme);
  d.promotions = sub(a.promotions, b.promotions);
  d.promotion_bytes = sub(a.promotion_bytes, b.promotion_bytes);
  d.evictions = sub(a.evictions, b.evictions);
  d.eviction_bytes = sub(a.eviction_bytes, b.eviction_bytes);
  d.lru_evictions = sub(a.lru_evictions, b.lru_evictions);
  d.writebacks = sub(a.writebacks, b.writebacks);
  d.writeback_bytes = sub(a.writeback_bytes, b.writeback_bytes);
  d.checksum_failures = sub(a.checksum_failures, b.checksum_failures);
  d.prefetches = sub(a.prefetches, b.prefetches);
  d.prefetch_hits = sub(a.prefetch_hits, b.prefetch_hits);
  d.prefetch_misses = sub(a.prefetch_misses, b.prefetch_misses);
  d.nvme_read_wait_seconds = sub(a.nvme_read_wait_seconds, b.nvme_read_wait_seconds);
  d.nvme_write_wait_seconds = sub(a.nvme_write_wait_seconds, b.nvme_write_wait_seconds);
  d.elapsed_seconds = sub(a.elapsed_seconds, b.elapsed_seconds);
  return d;
}

std::vector<StatField> stat_fields(const StoreStats& s) {
  std::vector<StatField> f;
  auto u = [&](const char* name, uint64_t v) { f.push_back({name, false, v, 0.0}); };
  auto t = [&](const char* name, double v) { f.push_back({name, true, 0, v}); };
  auto tier = [&](const TierIoStats& x, const char* rb, const char* ro, const char* wb,
                  const char* wo) {
    u(rb, x.read_bytes);
    u(ro, x.read_ops);
    u(wb, x.write_bytes);
    u(wo, x.write_ops);
  };
  tier(s.device, "device_read_bytes", "device_read_ops", "device_write_bytes", "device_write_ops");
  tier(s.host, "host_read_bytes", "host_read_ops", "host_write_bytes", "host_write_ops");
  tier(s.nvme, "nvme_read_bytes", "nvme_read_ops", "nvme_write_bytes", "nvme_write_ops");
  u("promotions", s.promotions);
  u("promotion_bytes", s.promotion_bytes);
  u("evictions", s.evictions);
  u("eviction_bytes", s.eviction_bytes);
  u("lru_evictions", s.lru_evictions);
  u("writebacks", s.writebacks);
  u("writeback_bytes", s.writeback_bytes);
  u("checksum_failures", s.checksum_failures);
  u("prefetches", s.prefetches);
  u("prefetch_hits", s.prefetch_hits);
  u("prefetch_misses", s.prefetch_misses);
  t("nvme_read_wait_seconds", s.nvme_read_wait_seconds);
  t("nvme_write_wait_seconds", s.nvme_write_wait_seconds);
  u("host_pool_in_use_bytes", s.host_pool.in_use_bytes);
  u("host_pool_capacity_bytes", s.host_pool.capacity_bytes);
  u("host_pool_peak_bytes", s.host_pool.peak_bytes);
  u("staging_pool_in_use_bytes", s.staging_pool.in_use_bytes);
  u("staging_pool_capacity_bytes", s.staging_pool.capacity_bytes);
  u("staging_pool_peak_bytes", s.staging_pool.peak_bytes);
  t("elapsed_seconds", s.elapsed_seconds);
  // Appended after elapsed_seconds: the C struct's order (strata.h, version 7).
  u("host_pool_committed_bytes", s.host_pool.committed_bytes);
  u("staging_pool_committed_bytes", s.staging_pool.committed_bytes);
  return f;
}

std::string format_stats_line(const StoreStats& s) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "interval=%.2fs", s.elapsed_seconds);
  std::string line = buf;
  for (const StatField& f : stat_fields(s)) {
    if (std::string_view(f.name) == "elapsed_seconds") continue;
    if (f.is_seconds ? f.seconds == 0.0 : f.value == 0) continue;
    if (f.is_seconds) {
      std::snprintf(buf, sizeof buf, "%.3f", f.seconds);
    } else {
      std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(f.value));
    }
    line += ' ';
    line += f.name;
    line += '=';
    line += buf;
  }
  return line;
}

namespace store_detail {

StoreStats StoreCounters::snapshot() const {
  StoreStats s;
  TierIoStats* out[3] = {&s.device, &s.host, &s.nvme};
  for (int i = 0; i < 3; ++i) {
    out[i]->read_bytes = tier[i].read_bytes.get();
    out[i]->read_ops = tier[i].read_ops.get();
    out[i]->write_bytes = tier[i].write_bytes.get();
    out[i]->write_ops = tier[i].write_ops.get();
  }
  s.promotions = promotions.get();
  s.promotion_bytes = promotion_bytes.get();
  s.evictions = evictions.get();
  s.eviction_bytes = eviction_bytes.get();
  s.lru_evictions = lru_evictions.get();
  s.writebacks = writebacks.get();
  s.writeback_bytes = writeback_bytes.get();
  s.checksum_failures = checksum_failures.get();
  s.prefetches = prefetches.get();
  s.prefetch_hits = prefetch_hits.get();
  s.prefetch_misses = prefetch_misses.get();
  s.nvme_read_wait_seconds = static_cast<double>(nvme_read_wait_ns.get()) * 1e-9;
  s.nvme_write_wait_seconds = static_cast<double>(nvme_write_wait_ns.get()) * 1e-9;
  const auto since = StatsClock::time_point(StatsClock::duration(since_ns.load()));
  s.elapsed_seconds = std::chrono::duration<double>(StatsClock::now() - since).count();
  return s;
}

void StoreCounters::reset() {
  for (auto& t : tier) {
    t.read_bytes.reset();
    t.read_ops.reset();
    t.write_bytes.reset();
    t.write_ops.reset();
  }
  for (Counter* c : {&promotions, &promotion_bytes, &evictions, &eviction_bytes, &lru_evictions,
                     &writebacks, &writeback_bytes, &checksum_failures, &prefetches,
                     &prefetch_hits, &prefetch_misses, &nvme_read_wait_ns, &nvme_write_wait_ns}) {
    c->reset();
  }
  since_ns.store(StatsClock::now().time_since_epoch().count());
}

StatsLogger::StatsLogger(std::string name, std::chrono::milliseconds interval,
                         std::function<StoreStats()> read)
    : name_(std::move(name)), interval_(interval), read_(std::move(read)) {
  // The baseline is taken here, not by the thread: operations that run before the thread
  // gets a CPU are counted in its first line.
  last_ = read_();
  thread_ = std::thread([this] { loop(); });
}

bool StatsLogger::end_thread() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) return false;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  return true;
}

void StatsLogger::stop() {
  if (end_thread()) log_since_last(read_());
}

void StatsLogger::log_since_last(const StoreStats& now) {
  const std::string line = "strata [stats] " + log_text(name_) + " " +
                           format_stats_line(stats_delta(last_, now)) + "\n";
  last_ = now;
  std::fwrite(line.data(), 1, line.size(), stderr);  // one write: lines never interleave
}

void StatsLogger::loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    if (cv_.wait_for(lk, interval_, [this] { return stop_; })) return;
    lk.unlock();
    log_since_last(read_());
    lk.lock();
  }
}

}  // namespace store_detail
}  // namespace strata
