// strata::store (private) — completion-driven transfers: the pieces of one chunk go through
// the I/O engine and the CPU as completions arrive (run_pieces), chunks one after another
// (run_in_sequence), and the first error of many parts by position (FirstError). Nothing
// here waits: every step runs on the thread that completed the step before it, except the
// CPU step of a transfer that names a pool for it (PieceSteps::cpu).
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <mutex>
#include <vector>

#include "strata/base/future.hpp"
#include "strata/base/thread_pool.hpp"

namespace strata::store_detail {

/// What run_pieces() does with piece i (0 <= i < count) of a transfer.
struct PieceSteps {
  uint64_t count = 0;
  /// Pieces started and not yet finished, at most (one staging buffer each: piece i uses
  /// buffer i % window). 0: every piece at once (each has its own memory).
  uint32_t window = 0;
  /// Starts moving piece i into memory (e.g. an engine read into its buffer). Null: the
  /// piece is ready at once.
  std::function<Future<uint64_t>(uint64_t i)> load;
  /// CPU work on piece i once loaded (hash, copy), called in piece order, one call at a
  /// time. Null: none.
  std::function<Status(uint64_t i)> process;
  /// Starts moving piece i out of memory once processed (e.g. an engine write); the piece
  /// (its buffer) is finished when that completes. Null: finished once processed.
  std::function<Future<uint64_t>(uint64_t i)> store;
  /// Called once, after every piece went through without an error; its status is the
  /// outcome. Null: OK.
  std::function<Status()> finish;
  /// Where process() (and what follows it: the piece's store, the next load, finish) runs:
  /// null, on the thread that completed the load (an engine completion thread); else as a
  /// task of this pool, still one call at a time and in piece order. A pool keeps hashing
  /// and copying off the engine's completion thread, which then only reaps and submits
  /// (one ring thread that hashes a 64 MiB chunk -- ~5 ms -- lets a queue of 32 x 1 MiB
  /// run dry at 8 GB/s), and spreads the CPU work of concurrent transfers over the pool's
  /// threads. Its tasks must never block (they only hash, copy and submit).
  ThreadPool* cpu = nullptr;
};

/// Runs the pieces of `steps`: starts up to `window` of them, processes each in order as
/// its load completes, starts its store, and starts the next piece when one finishes.
/// After an error no piece starts; the future completes once the pieces in flight have
/// completed (so no buffer is in use any more) with the error of the lowest piece.
/// Steps run on the thread that completed the step before (an engine completion thread, or
/// the caller's for futures already complete), or on `steps.cpu` (see there), so process()
/// and finish() must not block.
Future<void> run_pieces(PieceSteps steps);

/// Runs parts[0](), then parts[1]() once the future of the first is complete, and so on;
/// stops at the first error (the later parts are not started) and completes with it, or
/// with OK after the last one.
Future<void> run_in_sequence(std::vector<std::function<Future<void>()>> parts);

/// The error of the lowest position among those noted (e.g. chunk index).
/// \threadsafety note() and status() may be called concurrently.
class FirstError {
 public:
  void note(uint64_t at, const Status& st) {
    if (st.ok()) return;
    std::lock_guard<std::mutex> lk(mu_);
    if (st_.ok() || at < at_) {
      st_ = st;
      at_ = at;
    }
  }
  Status status() const {
    std::lock_guard<std::mutex> lk(mu_);
    return st_;
  }

 private:
  mutable std::mutex mu_;
  Status st_;
  uint64_t at_ = std::numeric_limits<uint64_t>::max();
};

/// `f` with `context` added to its error (Status::with_context); a value passes unchanged.
Future<uint64_t> with_context(const Future<uint64_t>& f, std::string context);

}  // namespace strata::store_detail
