// Progress lines for long CLI work (benchmarks, tune, verify of a large store).
//
//   Progress p("verify", total_bytes, Progress::Unit::kBytes);
//   for (...) p.update(done_bytes);      // redraws at most every 200 ms
//   p.finish();                          // clears the line (also done by the destructor)
//
// Shown on stderr only when it is a terminal, so output that is piped or redirected (and
// every --json run's stdout) stays free of it. STRATA_PROGRESS=1 shows it regardless,
// STRATA_PROGRESS=0 never (any other value: the terminal decides).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace strata::cli {

class Progress {
 public:
  /// How update()'s counts are shown: kBytes as "1.2 GiB / 4.0 GiB, 950 MB/s", kItems as
  /// "12 / 40".
  enum class Unit { kBytes, kItems };

  /// A progress line labelled `label` for work of `total` units (0: unknown, no percentage
  /// or ETA shown). Nothing is drawn until the first update().
  Progress(std::string label, uint64_t total, Unit unit = Unit::kItems);
  /// finish()es.
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  /// Whether lines are drawn (the terminal test and STRATA_PROGRESS above, decided at
  /// construction). Thread-safety: any thread.
  bool enabled() const { return enabled_; }

  /// Records that `done` units (of `total`) are done and redraws the line when at least
  /// 200 ms passed since the last redraw. Cheap when disabled. Not thread-safe: one thread
  /// calls update() and finish().
  void update(uint64_t done);
  /// Changes the label (e.g. "tune: bs 1 MiB qd 32") and redraws at the next update().
  void set_label(std::string label);
  /// Erases the line (when one was drawn). Idempotent.
  void finish();

 private:
  void draw(uint64_t done);

  std::string label_;
  uint64_t total_;
  Unit unit_;
  bool enabled_;
  bool drawn_ = false;
  size_t width_ = 0;  // characters of the last line drawn, to erase it
  std::chrono::steady_clock::time_point start_, last_;
};

/// Whether progress lines are wanted: STRATA_PROGRESS=1 yes, =0 no, otherwise whether stderr
/// is a terminal. Thread-safety: any thread (reads the environment).
bool progress_wanted();

}  // namespace strata::cli
