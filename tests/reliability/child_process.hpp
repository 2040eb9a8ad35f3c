// A child process for the reliability tests: started with posix_spawn, its stdout on a pipe
// read line by line (with a deadline), its stderr in a file, killed with SIGKILL.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace strata::reliability {

class ChildProcess {
 public:
  /// Starts `argv[0]` with `argv`; stderr goes to `stderr_path`. ok() is false when the
  /// spawn failed.
  ChildProcess(const std::vector<std::string>& argv, const std::string& stderr_path)
      : stderr_path_(stderr_path) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    posix_spawn_file_actions_addopen(&fa, 2, stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
    std::vector<std::string> copy = argv;
    std::vector<char*> args;
    for (auto& a : copy) args.push_back(a.data());
    args.push_back(nullptr);
    if (posix_spawn(&pid_, args[0], &fa, nullptr, args.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
    ::close(p[1]);
    fd_ = p[0];
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess() {
    kill9();
    if (fd_ >= 0) ::close(fd_);
  }

  bool ok() const { return pid_ > 0 && fd_ >= 0; }

  /// The next line of stdout, waiting until `deadline`. False at EOF or at the deadline
  /// (timed_out() tells which).
  bool read_line(std::string& line, std::chrono::steady_clock::time_point deadline) {
    timed_out_ = false;
    for (;;) {
      auto nl = buf_.find('\n');
      if (nl != std::string::npos) {
        line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return true;
      }
      if (eof_) return false;
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                      deadline - std::chrono::steady_clock::now())
                      .count();
      if (left <= 0) {
        timed_out_ = true;
        return false;
      }
      pollfd pfd{fd_, POLLIN, 0};
      int r = ::poll(&pfd, 1, static_cast<int>(left));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) continue;
      char tmp[4096];
      ssize_t n = ::read(fd_, tmp, sizeof tmp);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        eof_ = true;
      } else {
        buf_.append(tmp, static_cast<size_t>(n));
      }
    }
  }
  bool timed_out() const { return timed_out_; }

  /// Kills the child (SIGKILL) and reaps it. The lines it wrote stay readable.
  void kill9() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    wait();
  }
  /// Waits for the child to exit; returns its waitpid status.
  int wait() {
    if (pid_ > 0) {
      while (::waitpid(pid_, &status_, 0) < 0 && errno == EINTR) {
      }
      pid_ = -1;
    }
    return status_;
  }
  /// What the child wrote to stderr.
  std::string stderr_text() const {
    std::ifstream in(stderr_path_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  int status_ = 0;
  bool eof_ = false, timed_out_ = false;
  std::string buf_, stderr_path_;
};

}  // namespace strata::reliability
