// strata::base — child processes and the signals a parent forwards to them: the one
// SignalForwarder (SIGINT/SIGTERM/SIGHUP caught while a program runs children, recorded,
// optionally forwarded, the previous handlers restored afterwards) and the waits on a child.
// Used by the launcher (collectives/launcher.cpp: the ranks) and the CLI's emulated drives
// (cli/emulated_drives.cpp: mkfs and the program run under them).
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <atomic>
#include <optional>
#include <string>

#include "strata/base/status.hpp"

namespace strata {

/// Catches SIGINT, SIGTERM and SIGHUP for as long as it is installed (from construction to
/// restore() or destruction). Its handler records the signal (pending()) and, when a target
/// is set (set_target()), forwards it there with kill(2) at once, from the handler. The
/// handlers are installed without SA_RESTART and with an empty mask, so a blocking call of
/// the interrupted thread (poll, read, waitpid) returns EINTR.
///
/// Nesting: forwarders may be nested (one constructed while another is installed) and must
/// then be restored in reverse order of construction; the innermost installed one receives
/// the signals, and after its restore() the enclosing one does again.
///
/// \threadsafety construct, restore() and destroy from one thread, one forwarder (or one
///     nested chain) per process; set_target(), pending(), take() and reraise() may be
///     called from any thread. The handler itself is async-signal-safe: it touches only
///     lock-free atomics and kill(2), and keeps errno.
class SignalForwarder {
 public:
  /// Installs the handlers for SIGINT, SIGTERM and SIGHUP, remembering the previous ones.
  /// pending() starts at 0, the target at 0 (none).
  SignalForwarder();
  /// restore().
  ~SignalForwarder();
  SignalForwarder(const SignalForwarder&) = delete;
  SignalForwarder& operator=(const SignalForwarder&) = delete;

  /// Where the handler forwards each signal it catches: `pid` > 0 a process, `pid` < -1 the
  /// process group -pid, 0 nobody (the signal is only recorded). Set it to 0 once the
  /// target is reaped, so that a reused pid is never signalled.
  void set_target(pid_t pid) noexcept { target_.store(pid); }

  /// The last signal caught (and not taken), or 0. It survives restore().
  int pending() const noexcept { return pending_.load(); }
  /// pending(), cleared in the same atomic step.
  int take() noexcept { return pending_.exchange(0); }

  /// Whether the handlers are installed (false after restore()).
  bool installed() const noexcept { return installed_; }

  /// Puts back the handlers found at construction and hands the signals to the enclosing
  /// forwarder, if any. Idempotent; pending() keeps its value.
  void restore() noexcept;

  /// When pending() is set: clears it, sets that signal's action to the default (SIG_DFL)
  /// and raises it, which for these three signals ends the process by that signal. Call
  /// after restore(), once everything that must be cleaned up is. No-op when nothing is
  /// pending.
  void reraise() noexcept;

 private:
  static void on_signal(int sig);

  std::atomic<int> pending_{0};
  std::atomic<pid_t> target_{0};
  SignalForwarder* enclosing_ = nullptr;  // the forwarder installed before this one
  bool installed_ = false;
  struct sigaction old_int_ {}, old_term_ {}, old_hup_ {};
};

/// How a child process ended (a waitpid(2) status, decoded).
struct ChildExit {
  int exit_code = -1;   ///< its exit status when it exited, else -1
  int term_signal = 0;  ///< the signal that ended it when one did, else 0
  /// The shell's convention: exit_code when it exited, else 128 + term_signal.
  int shell_code() const noexcept { return exit_code >= 0 ? exit_code : 128 + term_signal; }
};

/// Decodes a waitpid(2) status of a child that ended (WIFEXITED / WIFSIGNALED).
ChildExit decode_wait_status(int status) noexcept;

/// Waits for the child `pid` to end: waitpid(pid, 0), retried while it fails with EINTR
/// (a signal caught meanwhile, e.g. by a SignalForwarder).
/// \returns how it ended.
/// \error errno_status(errno, what) when waitpid fails otherwise (ECHILD: not a child of
///     this process, or already reaped); `what` defaults to "waitpid <pid>".
/// \threadsafety any thread; one waiter per child.
Result<ChildExit> wait_child(pid_t pid, const std::string& what = {});

/// Reaps the child `pid` if it has ended, without blocking (waitpid with WNOHANG).
/// \returns how it ended; nullopt while it runs, and when waitpid fails (the caller keeps
///     treating it as running: its deadline or a kill decides).
/// \threadsafety any thread; one waiter per child.
std::optional<ChildExit> try_wait_child(pid_t pid) noexcept;

}  // namespace strata
