// strata::collectives — the local launcher behind `strata launch`: starts N processes on
// this machine with torchrun's environment contract (MASTER_ADDR, MASTER_PORT, RANK,
// WORLD_SIZE, LOCAL_RANK, plus LOCAL_WORLD_SIZE), relays their output line by line with a
// "[rank R] " prefix, and stops all of them when one fails.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/base/status.hpp"

namespace strata {

struct LaunchOptions {
  /// Number of processes (ranks 0..nproc-1). Must be >= 1.
  int nproc = 1;
  /// MASTER_ADDR given to every rank. Default 127.0.0.1 (single node).
  std::string master_addr = "127.0.0.1";
  /// MASTER_PORT; 0 = pick a free TCP port on master_addr. Default 0.
  uint16_t master_port = 0;
  /// Program and its arguments; argv[0] is looked up in PATH when it has no '/'.
  std::vector<std::string> argv;
  /// Extra environment variables for every rank (applied after the contract's ones).
  std::vector<std::pair<std::string, std::string>> env;
  /// When one rank exits non-zero or is killed, stop the others: SIGTERM to each rank's
  /// process group, then SIGKILL after `kill_grace`. Default true.
  bool stop_on_failure = true;
  /// Time between SIGTERM and SIGKILL. Default 3 s.
  std::chrono::milliseconds kill_grace{3000};
  /// Kill every rank (as on failure) when they run longer than this; 0 = no limit.
  std::chrono::milliseconds timeout{0};
  /// Receives each complete output line (without the newline) of each rank. Default
  /// (empty): write "[rank R] line\n" to this process's stdout or stderr, matching the
  /// stream the rank wrote to.
  std::function<void(int rank, bool is_stderr, std::string_view line)> on_line;
  /// While launch_local runs, SIGINT/SIGTERM/SIGHUP received by this process are forwarded
  /// to every rank (their handlers are restored afterwards). Default false (the CLI sets it).
  bool forward_signals = false;
};

/// How one rank ended.
struct RankExit {
  int rank = 0;
  int pid = 0;
  int exit_code = -1;   ///< exit status when it exited, else -1
  int term_signal = 0;  ///< signal that killed it, else 0
  bool stopped_by_launcher = false;  ///< killed by us after another rank failed / timeout
  bool ok() const { return exit_code == 0; }
};

struct LaunchReport {
  uint16_t master_port = 0;
  std::vector<RankExit> ranks;  ///< indexed by rank
  int first_failed_rank = -1;   ///< the rank whose failure stopped the others, or -1
  bool timed_out = false;
  /// The first SIGINT/SIGTERM/SIGHUP forwarded to the ranks (forward_signals), else 0: the
  /// caller's to act on after the ranks are gone (e.g. re-raise it once it has cleaned up).
  int forwarded_signal = 0;
  /// OK when every rank exited 0; otherwise Unavailable naming the first failed rank and
  /// how it ended ("rank 2 exited with status 3", "rank 1 was killed by signal 9 (Killed)").
  Status status() const;
  /// Exit code for a launcher process: 0, the failed rank's exit status, or 128 + signal.
  int exit_code() const;
};

/// Starts the ranks, relays their output, waits for all of them.
/// \error InvalidArgument for nproc < 1 or an empty argv; IoError (with errno) when a pipe
///     or process cannot be created (a rank that cannot exec exits with status 127 and is
///     reported in the LaunchReport instead); Unavailable when no free port was found.
/// \threadsafety one launch_local at a time per process when forward_signals is set.
Result<LaunchReport> launch_local(const LaunchOptions& options);

/// A TCP port that was free on `host` a moment ago (bind to port 0, read it, close).
/// \error Unavailable with errno when no socket could be bound.
Result<uint16_t> find_free_port(const std::string& host = "127.0.0.1");

}  // namespace strata
