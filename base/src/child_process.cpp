#include "strata/base/child_process.hpp"

#include <sys/wait.h>

#include <cerrno>

namespace strata {
namespace {

// The innermost installed forwarder: the one the handler records into.
std::atomic<SignalForwarder*> g_active{nullptr};

static_assert(std::atomic<SignalForwarder*>::is_always_lock_free &&
                  std::atomic<int>::is_always_lock_free &&
                  std::atomic<pid_t>::is_always_lock_free,
              "the signal handler needs lock-free atomics (async-signal-safety)");

}  // namespace

void SignalForwarder::on_signal(int sig) {
  const int saved_errno = errno;
  SignalForwarder* f = g_active.load();
  if (f != nullptr) {
    f->pending_.store(sig);
    const pid_t target = f->target_.load();
    if (target != 0) ::kill(target, sig);
  }
  errno = saved_errno;
}

SignalForwarder::SignalForwarder() {
  enclosing_ = g_active.load();
  g_active.store(this);  // before the handler can run
  struct sigaction sa {};
  sa.sa_handler = &SignalForwarder::on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int_);
  sigaction(SIGTERM, &sa, &old_term_);
  sigaction(SIGHUP, &sa, &old_hup_);
  installed_ = true;
}

SignalForwarder::~SignalForwarder() { restore(); }

void SignalForwarder::restore() noexcept {
  if (!installed_) return;
  installed_ = false;
  // Order: a signal arriving meanwhile is recorded by this forwarder or the enclosing one,
  // never dropped by the handler. Nested: the enclosing one (same handler) takes over
  // first. Outermost: the previous handlers come back first, then nobody is active.
  if (enclosing_ != nullptr) g_active.store(enclosing_);
  sigaction(SIGINT, &old_int_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
  sigaction(SIGHUP, &old_hup_, nullptr);
  if (enclosing_ == nullptr) g_active.store(nullptr);
}

void SignalForwarder::reraise() noexcept {
  const int sig = take();
  if (sig == 0) return;
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

ChildExit decode_wait_status(int status) noexcept {
  ChildExit e;
  if (WIFEXITED(status)) e.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) e.term_signal = WTERMSIG(status);
  return e;
}

Result<ChildExit> wait_child(pid_t pid, const std::string& what) {
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0) {
    const int e = errno;
    if (e != EINTR) return errno_status(e, what.empty() ? "waitpid " + std::to_string(pid) : what);
  }
  return decode_wait_status(st);
}

std::optional<ChildExit> try_wait_child(pid_t pid) noexcept {
  int st = 0;
  if (::waitpid(pid, &st, WNOHANG) != pid) return std::nullopt;
  return decode_wait_status(st);
}

}  // namespace strata
