// The local launcher (see launcher.hpp): posix_spawn, one pipe pair per rank, poll().
#include "strata/collectives/launcher.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>

#include "strata/base/child_process.hpp"

extern char** environ;

namespace strata {

namespace {

using Clock = std::chrono::steady_clock;

struct Stream {
  int fd = -1;
  std::string partial;
};

struct Child {
  RankExit exit;
  bool running = false;
  Stream out, err;
};

void default_line(int rank, bool is_stderr, std::string_view line) {
  std::string s = "[rank " + std::to_string(rank) + "] ";
  s.append(line);
  s.push_back('\n');
  FILE* f = is_stderr ? stderr : stdout;
  std::fwrite(s.data(), 1, s.size(), f);
  std::fflush(f);
}

}  // namespace

Status LaunchReport::status() const {
  if (first_failed_rank < 0 && !timed_out) {
    for (const auto& r : ranks)
      if (!r.ok()) return unavailable("rank " + std::to_string(r.rank) + " did not exit cleanly");
    return Status::OK();
  }
  if (first_failed_rank < 0) return unavailable("the ranks ran past the launcher's timeout and were stopped");
  const RankExit& r = ranks[first_failed_rank];
  std::string how = r.term_signal ? "was killed by signal " + std::to_string(r.term_signal) + " (" +
                                        strsignal(r.term_signal) + ")"
                                  : "exited with status " + std::to_string(r.exit_code);
  return unavailable("rank " + std::to_string(r.rank) + " " + how + "; the other ranks were stopped");
}

int LaunchReport::exit_code() const {
  if (status().ok()) return 0;
  if (first_failed_rank < 0) return 124;
  const RankExit& r = ranks[first_failed_rank];
  if (r.term_signal) return 128 + r.term_signal;
  return r.exit_code > 0 ? r.exit_code : 1;
}

Result<uint16_t> find_free_port(const std::string& host) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status(StatusCode::kUnavailable, "find_free_port: socket failed", errno);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    int e = errno;
    ::close(fd);
    return Status(StatusCode::kUnavailable, "find_free_port: cannot bind a port on " + host, e);
  }
  ::close(fd);
  return static_cast<uint16_t>(ntohs(a.sin_port));
}

Result<LaunchReport> launch_local(const LaunchOptions& opt) {
  if (opt.nproc < 1) return invalid_argument("launch: --nproc must be >= 1, got " + std::to_string(opt.nproc));
  if (opt.argv.empty() || opt.argv[0].empty()) return invalid_argument("launch: no program to run");
  LaunchReport report;
  report.master_port = opt.master_port;
  if (report.master_port == 0) {
    STRATA_ASSIGN_OR_RETURN(report.master_port, find_free_port(opt.master_addr));
  }
  auto on_line = opt.on_line ? opt.on_line : default_line;

  // Environment: ours, minus the contract's variables, plus them per rank.
  static const char* kContract[] = {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
                                    "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"};
  std::vector<std::string> base_env;
  for (char** e = environ; *e; ++e) {
    std::string_view kv(*e);
    bool contract = false;
    for (const char* c : kContract) {
      size_t n = std::strlen(c);
      if (kv.size() > n && kv.substr(0, n) == c && kv[n] == '=') contract = true;
    }
    for (const auto& [k, v] : opt.env)
      if (kv.size() > k.size() && kv.substr(0, k.size()) == k && kv[k.size()] == '=') contract = true;
    if (!contract) base_env.emplace_back(kv);
  }

  std::vector<char*> argv;
  for (const auto& a : opt.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  // forward_signals: caught signals are only recorded here (no target); the loop below
  // takes each one and sends it to every running rank's process group.
  std::optional<SignalForwarder> signals;
  if (opt.forward_signals) signals.emplace();

  std::vector<Child> kids(opt.nproc);
  Status spawn_error;
  for (int r = 0; r < opt.nproc; ++r) {
    Child& c = kids[r];
    c.exit.rank = r;
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0) {
      spawn_error = errno_status(errno, "launch: pipe for rank " + std::to_string(r));
      break;
    }
    if (pipe2(err, O_CLOEXEC) != 0) {
      spawn_error = errno_status(errno, "launch: pipe for rank " + std::to_string(r));
      ::close(out[0]);
      ::close(out[1]);
      break;
    }
    std::vector<std::string> env = base_env;
    env.push_back("MASTER_ADDR=" + opt.master_addr);
    env.push_back("MASTER_PORT=" + std::to_string(report.master_port));
    env.push_back("RANK=" + std::to_string(r));
    env.push_back("WORLD_SIZE=" + std::to_string(opt.nproc));
    env.push_back("LOCAL_RANK=" + std::to_string(r));
    env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(opt.nproc));
    env.push_back("GROUP_RANK=0");
    for (const auto& [k, v] : opt.env) env.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);

    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&fa, err[1], STDERR_FILENO);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t none, defaults;
    sigemptyset(&none);
    sigemptyset(&defaults);
    for (int s : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD}) sigaddset(&defaults, s);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setpgroup(&attr, 0);  // own process group: we can kill its children too
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                        POSIX_SPAWN_SETSIGDEF);
    pid_t pid = 0;
    int rc = posix_spawnp(&pid, argv[0], &fa, &attr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    ::close(out[1]);
    ::close(err[1]);
    c.out.fd = out[0];
    c.err.fd = err[0];
    if (rc != 0) {
      on_line(r, true, "strata launch: cannot execute '" + opt.argv[0] + "': " + std::strerror(rc));
      c.exit.exit_code = 127;
      c.running = false;
      ::close(c.out.fd);
      ::close(c.err.fd);
      c.out.fd = c.err.fd = -1;
      if (report.first_failed_rank < 0) report.first_failed_rank = r;
      continue;
    }
    c.exit.pid = pid;
    c.running = true;
  }

  const auto start = Clock::now();
  bool stopping = !spawn_error.ok() || report.first_failed_rank >= 0;
  Clock::time_point kill_at{};
  bool killed_hard = false;
  auto stop_all = [&](int sig) {
    for (auto& c : kids) {
      if (c.running) {
        ::kill(-c.exit.pid, sig);
        c.exit.stopped_by_launcher = true;
      }
    }
  };
  if (stopping) {
    stop_all(SIGTERM);
    kill_at = Clock::now() + opt.kill_grace;
  }
  Clock::time_point all_exited_at{};

  auto drain = [&](int rank, Stream& s, bool is_err, bool eof) {
    size_t pos;
    while ((pos = s.partial.find('\n')) != std::string::npos) {
      on_line(rank, is_err, std::string_view(s.partial).substr(0, pos));
      s.partial.erase(0, pos + 1);
    }
    if (eof && !s.partial.empty()) {
      on_line(rank, is_err, s.partial);
      s.partial.clear();
    }
  };

  while (true) {
    // Reap.
    bool any_running = false;
    for (auto& c : kids) {
      if (!c.running) continue;
      if (std::optional<ChildExit> e = try_wait_child(c.exit.pid)) {
        c.running = false;
        c.exit.exit_code = e->exit_code;
        c.exit.term_signal = e->term_signal;
        bool failed = !c.exit.ok();
        if (failed && !c.exit.stopped_by_launcher && report.first_failed_rank < 0 &&
            opt.stop_on_failure) {
          report.first_failed_rank = c.exit.rank;
        }
        if (failed && opt.stop_on_failure && !stopping) {
          stopping = true;
          stop_all(SIGTERM);
          kill_at = Clock::now() + opt.kill_grace;
        }
      } else {
        any_running = true;
      }
    }
    if (!stopping && opt.timeout.count() > 0 && Clock::now() - start > opt.timeout) {
      report.timed_out = true;
      stopping = true;
      stop_all(SIGTERM);
      kill_at = Clock::now() + opt.kill_grace;
    }
    if (const int sig = signals ? signals->take() : 0; sig != 0) {
      if (report.forwarded_signal == 0) report.forwarded_signal = sig;
      stop_all(sig);
      if (!stopping) {
        stopping = true;
        kill_at = Clock::now() + opt.kill_grace;
      }
    }
    if (stopping && !killed_hard && any_running && Clock::now() >= kill_at) {
      stop_all(SIGKILL);
      killed_hard = true;
    }
    // Output.
    std::vector<pollfd> fds;
    std::vector<std::pair<int, bool>> who;
    for (auto& c : kids) {
      if (c.out.fd >= 0) { fds.push_back({c.out.fd, POLLIN, 0}); who.push_back({c.exit.rank, false}); }
      if (c.err.fd >= 0) { fds.push_back({c.err.fd, POLLIN, 0}); who.push_back({c.exit.rank, true}); }
    }
    if (!any_running) {
      if (all_exited_at == Clock::time_point{}) all_exited_at = Clock::now();
      // Grandchildren may keep a pipe open: give them a second after the ranks are gone.
      if (fds.empty() || Clock::now() - all_exited_at > std::chrono::seconds(1)) break;
    }
    if (fds.empty()) {
      ::usleep(20000);
      continue;
    }
    int n = ::poll(fds.data(), fds.size(), 20);
    if (n <= 0) continue;  // timeout or EINTR (a forwarded signal)
    char buf[65536];
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Child& c = kids[who[i].first];
      Stream& s = who[i].second ? c.err : c.out;
      ssize_t got = ::read(s.fd, buf, sizeof(buf));
      if (got > 0) {
        s.partial.append(buf, static_cast<size_t>(got));
        drain(c.exit.rank, s, who[i].second, false);
      } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
        drain(c.exit.rank, s, who[i].second, true);
        ::close(s.fd);
        s.fd = -1;
      }
    }
  }
  for (auto& c : kids) {
    for (Stream* s : {&c.out, &c.err}) {
      if (s->fd >= 0) {
        drain(c.exit.rank, *s, s == &c.err, true);
        ::close(s->fd);
        s->fd = -1;
      }
    }
    report.ranks.push_back(c.exit);
  }
  signals.reset();  // the previous handlers again
  if (!spawn_error.ok()) return spawn_error;
  return report;
}

}  // namespace strata
