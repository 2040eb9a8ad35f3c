// SignalForwarder (record, forward to a child or process group, nest, restore, reraise) and
// the waits on a child (wait_child, try_wait_child, decode_wait_status).
#include "strata/base/child_process.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>

using namespace strata;

namespace {

volatile sig_atomic_t g_old_handler_calls = 0;
void old_handler(int) { g_old_handler_calls = g_old_handler_calls + 1; }

/// The handler now installed for `sig`.
void (*handler_of(int sig))(int) {
  struct sigaction sa {};
  sigaction(sig, nullptr, &sa);
  return sa.sa_handler;
}

/// Installs old_handler for SIGINT, SIGTERM and SIGHUP; puts back what was there on exit.
struct OldHandlers {
  struct sigaction saved[3];
  static constexpr int kSigs[3] = {SIGINT, SIGTERM, SIGHUP};
  OldHandlers() {
    g_old_handler_calls = 0;
    struct sigaction sa {};
    sa.sa_handler = old_handler;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 3; ++i) sigaction(kSigs[i], &sa, &saved[i]);
  }
  ~OldHandlers() {
    for (int i = 0; i < 3; ++i) sigaction(kSigs[i], &saved[i], nullptr);
  }
};

/// Forks a child that takes the default action for SIGTERM/SIGINT/SIGHUP (in its own
/// process group when `own_group`), tells the parent it is ready, and sleeps (30 s at most:
/// SIGALRM ends it should the test fail to).
pid_t start_sleeper(bool own_group) {
  int ready[2];
  if (pipe(ready) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    for (int s : {SIGINT, SIGTERM, SIGHUP}) signal(s, SIG_DFL);
    if (own_group) setpgid(0, 0);
    alarm(30);
    char c = 1;
    (void)!write(ready[1], &c, 1);
    for (;;) pause();
  }
  if (own_group && pid > 0) setpgid(pid, pid);  // either side may run first
  char c = 0;
  if (pid > 0) (void)!read(ready[0], &c, 1);
  close(ready[0]);
  close(ready[1]);
  return pid;
}

}  // namespace

TEST(SignalForwarder, ForwardsToTheChildRecordsAndRestoresTheOldHandler) {
  OldHandlers old;
  const pid_t child = start_sleeper(false);
  ASSERT_GT(child, 0);
  {
    SignalForwarder f;
    EXPECT_TRUE(f.installed());
    EXPECT_EQ(f.pending(), 0);
    EXPECT_NE(handler_of(SIGTERM), &old_handler);
    f.set_target(child);
    ASSERT_EQ(raise(SIGTERM), 0);  // the handler runs before raise() returns
    EXPECT_EQ(f.pending(), SIGTERM);
    auto e = wait_child(child);
    f.set_target(0);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    EXPECT_EQ(e->term_signal, SIGTERM);
    EXPECT_EQ(e->exit_code, -1);
    EXPECT_EQ(e->shell_code(), 128 + SIGTERM);
    f.restore();
    EXPECT_FALSE(f.installed());
    EXPECT_EQ(handler_of(SIGINT), &old_handler);
    EXPECT_EQ(handler_of(SIGTERM), &old_handler);
    EXPECT_EQ(handler_of(SIGHUP), &old_handler);
    EXPECT_EQ(f.pending(), SIGTERM);  // survives restore()
    EXPECT_EQ(f.take(), SIGTERM);
    EXPECT_EQ(f.pending(), 0);
    f.restore();  // idempotent
  }
  EXPECT_EQ(handler_of(SIGTERM), &old_handler);
  EXPECT_EQ(g_old_handler_calls, 0);  // the forwarder caught it, not the old handler
}

TEST(SignalForwarder, ForwardsToAProcessGroup) {
  OldHandlers old;
  const pid_t child = start_sleeper(true);
  ASSERT_GT(child, 0);
  SignalForwarder f;
  f.set_target(-child);
  ASSERT_EQ(raise(SIGHUP), 0);
  auto e = wait_child(child);
  f.set_target(0);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_EQ(e->term_signal, SIGHUP);
  EXPECT_EQ(f.pending(), SIGHUP);
}

TEST(SignalForwarder, WithoutATargetOnlyRecordsTheLastSignal) {
  OldHandlers old;
  SignalForwarder f;
  ASSERT_EQ(raise(SIGINT), 0);
  EXPECT_EQ(f.pending(), SIGINT);
  ASSERT_EQ(raise(SIGHUP), 0);
  EXPECT_EQ(f.pending(), SIGHUP);
  EXPECT_EQ(f.take(), SIGHUP);
  EXPECT_EQ(f.take(), 0);
  f.restore();
  ASSERT_EQ(raise(SIGINT), 0);  // the old handler again
  EXPECT_EQ(g_old_handler_calls, 1);
  EXPECT_EQ(f.pending(), 0);
}

TEST(SignalForwarder, NestedTheInnermostCatchesThenTheEnclosingAgain) {
  OldHandlers old;
  SignalForwarder outer;
  {
    SignalForwarder inner;
    ASSERT_EQ(raise(SIGTERM), 0);
    EXPECT_EQ(inner.pending(), SIGTERM);
    EXPECT_EQ(outer.pending(), 0);
    inner.restore();
    ASSERT_EQ(raise(SIGINT), 0);
    EXPECT_EQ(outer.pending(), SIGINT);
    EXPECT_EQ(inner.pending(), SIGTERM);
  }
  EXPECT_NE(handler_of(SIGINT), &old_handler);  // outer still installed
  outer.restore();
  EXPECT_EQ(handler_of(SIGINT), &old_handler);
  EXPECT_EQ(handler_of(SIGTERM), &old_handler);
  EXPECT_EQ(handler_of(SIGHUP), &old_handler);
  EXPECT_EQ(g_old_handler_calls, 0);
}

TEST(SignalForwarder, ReraiseEndsTheProcessByThePendingSignal) {
  EXPECT_EXIT(
      {
        SignalForwarder f;
        raise(SIGTERM);
        f.restore();
        f.reraise();
        _exit(0);  // not reached
      },
      testing::KilledBySignal(SIGTERM), "");
  OldHandlers old;
  SignalForwarder f;
  f.reraise();  // nothing pending: a no-op
  EXPECT_EQ(f.pending(), 0);
}

TEST(ChildProcess, WaitChildReturnsTheExitStatus) {
  const pid_t pid = fork();
  if (pid == 0) _exit(3);
  ASSERT_GT(pid, 0);
  auto e = wait_child(pid);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_EQ(e->exit_code, 3);
  EXPECT_EQ(e->term_signal, 0);
  EXPECT_EQ(e->shell_code(), 3);
}

TEST(ChildProcess, WaitChildOnANonChildFailsWithItsErrno) {
  auto e = wait_child(getpid());
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().sys_errno(), ECHILD);
  EXPECT_NE(e.status().message().find("waitpid " + std::to_string(getpid())), std::string::npos)
      << e.status().to_string();
  auto named = wait_child(getpid(), "waitpid for 'x'");
  ASSERT_FALSE(named.ok());
  EXPECT_EQ(named.status().message().rfind("waitpid for 'x'", 0), 0u) << named.status().to_string();
}

TEST(ChildProcess, TryWaitChildIsEmptyWhileItRuns) {
  const pid_t child = start_sleeper(false);
  ASSERT_GT(child, 0);
  EXPECT_FALSE(try_wait_child(child).has_value());
  ASSERT_EQ(kill(child, SIGKILL), 0);
  std::optional<ChildExit> e;
  for (int i = 0; i < 1000 && !e; ++i) {  // 10 s at most
    e = try_wait_child(child);
    if (!e) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->term_signal, SIGKILL);
  EXPECT_EQ(e->exit_code, -1);
  EXPECT_FALSE(try_wait_child(child).has_value());  // reaped: ECHILD
}

TEST(ChildProcess, DecodeWaitStatus) {
  const pid_t pid = fork();
  if (pid == 0) _exit(0);
  ASSERT_GT(pid, 0);
  int st = -1;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  const ChildExit e = decode_wait_status(st);
  EXPECT_EQ(e.exit_code, 0);
  EXPECT_EQ(e.term_signal, 0);
  EXPECT_EQ(e.shell_code(), 0);
}
