#include "emulated_drives.hpp"

#include <fcntl.h>
#include <linux/loop.h>
#include <spawn.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <optional>
#include <thread>

#include "command.hpp"
#include "strata/base/child_process.hpp"
#include "strata/base/units.hpp"

extern char** environ;

namespace strata::cli {
namespace {

namespace fs = std::filesystem;

// SIGINT/SIGTERM/SIGHUP while a set exists (create() to teardown()): recorded, forwarded to
// the program run_program() is waiting for, re-raised after teardown. Kept after teardown
// (restored, its pending signal intact) until reraise_pending_signal() or the next set.
std::optional<SignalForwarder> g_signals;

void install_handlers() {
  if (g_signals && g_signals->installed()) return;
  g_signals.emplace();
}

void restore_handlers() {
  if (g_signals) g_signals->restore();
}

int pending_signal_now() { return g_signals ? g_signals->pending() : 0; }

Status refused(const std::string& what) {
  return failed_precondition("emulated drives refused: " + what);
}

Status cancelled_by_signal(const char* step) {
  const int sig = pending_signal_now();
  return cancelled(std::string("emulated drives: signal ") + std::to_string(sig) + " (" +
                   strsignal(sig) + ") during " + step);
}

/// Writes `text` to the file `path` (a sysfs/cgroupfs attribute) in one write().
Status write_attr(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return errno_status(errno, "open '" + path + "' for writing");
  ssize_t n = ::write(fd, text.data(), text.size());
  int e = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(text.size())) {
    return errno_status(n < 0 ? e : EIO, "write '" + text + "' to '" + path + "'");
  }
  return Status::OK();
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// This process's cgroup path (relative to its hierarchy's mount) for the v1 controller
/// `controller`, or for the v2 hierarchy when `controller` is empty; nullopt-like "" when
/// /proc/self/cgroup has no such line.
std::string own_cgroup(const std::string& controller) {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    // "<id>:<controllers>:<path>"
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string ctrls = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (controller.empty()) {
      if (line.compare(0, a, "0") == 0 && ctrls.empty()) return path;
      continue;
    }
    std::stringstream ss(ctrls);
    for (std::string c; std::getline(ss, c, ',');) {
      if (c == controller) return path;
    }
  }
  return "";
}

bool in_path(const std::string& program) {
  const char* p = std::getenv("PATH");
  std::stringstream ss(p ? p : "");
  for (std::string dir; std::getline(ss, dir, ':');) {
    if (!dir.empty() && ::access((dir + "/" + program).c_str(), X_OK) == 0) return true;
  }
  return false;
}

std::string loop_sysfs(const std::string& dev) {
  return "/sys/block/" + fs::path(dev).filename().string() + "/loop";
}

}  // namespace

Result<uint64_t> parse_bandwidth_arg(const std::string& text, const std::string& option) {
  std::string t = text;
  if (t.size() > 2 && t.compare(t.size() - 2, 2, "/s") == 0) t.resize(t.size() - 2);
  STRATA_ASSIGN_OR_RETURN(uint64_t bw, parse_size_arg(t, option));
  if (bw == 0) return invalid_argument(option + " must be > 0 bytes/s, got '" + text + "'");
  return bw;
}

std::vector<std::string> emulated_drive_dirs_from_env() {
  std::vector<std::string> dirs;
  const char* v = std::getenv(kEmulatedDrivesEnv);
  if (v == nullptr) return dirs;
  std::stringstream ss(v);
  for (std::string d; std::getline(ss, d, ':');) {
    if (!d.empty()) dirs.push_back(d);
  }
  return dirs;
}

uint64_t emulated_drive_bw_from_env() {
  const char* v = std::getenv(kEmulatedDriveBwEnv);
  if (v == nullptr || *v == 0) return 0;
  char* end = nullptr;
  errno = 0;
  unsigned long long x = std::strtoull(v, &end, 10);
  return errno == 0 && end != nullptr && *end == 0 ? x : 0;
}

Result<int> run_program(const std::vector<std::string>& argv, std::string* output) {
  if (argv.empty()) return invalid_argument("run_program: empty argv");
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int pipefd[2] = {-1, -1};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (output != nullptr) {
    if (::pipe2(pipefd, O_CLOEXEC) != 0) {
      posix_spawn_file_actions_destroy(&fa);
      return errno_status(errno, "pipe for " + argv[0]);
    }
    posix_spawn_file_actions_adddup2(&fa, pipefd[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&fa, pipefd[1], STDERR_FILENO);
  }
  pid_t pid = -1;
  int rc = posix_spawnp(&pid, argv[0].c_str(), &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (output != nullptr) ::close(pipefd[1]);
  if (rc != 0) {
    if (output != nullptr) ::close(pipefd[0]);
    return errno_status(rc, "start '" + argv[0] + "'");
  }
  if (g_signals) g_signals->set_target(pid);
  if (output != nullptr) {
    char buf[4096];
    for (;;) {
      ssize_t n = ::read(pipefd[0], buf, sizeof buf);
      if (n > 0) output->append(buf, static_cast<size_t>(n));
      else if (n == 0 || errno != EINTR) break;
    }
    ::close(pipefd[0]);
  }
  Result<ChildExit> e = wait_child(pid, "waitpid for '" + argv[0] + "'");
  if (g_signals) g_signals->set_target(0);
  if (!e.ok()) return e.status();
  return e->shell_code();
}

int EmulatedDrives::pending_signal() { return pending_signal_now(); }

void EmulatedDrives::reraise_pending_signal() {
  if (g_signals) g_signals->reraise();
}

Result<std::unique_ptr<EmulatedDrives>> EmulatedDrives::create(const EmulatedDriveOptions& o) {
  if (o.count < 1 || o.count > kMaxEmulatedDrives) {
    return invalid_argument("emulated drives: count " + std::to_string(o.count) +
                            " out of range 1.." + std::to_string(kMaxEmulatedDrives));
  }
  if (o.bytes_per_s == 0) return invalid_argument("emulated drives: bandwidth must be > 0 bytes/s");
  if (o.size_bytes < kMinEmulatedDriveBytes || o.size_bytes % 4096 != 0) {
    return invalid_argument("emulated drives: size " + std::to_string(o.size_bytes) +
                            " bytes must be >= " + format_bytes(kMinEmulatedDriveBytes) +
                            " and a multiple of 4096");
  }
  std::unique_ptr<EmulatedDrives> d(new EmulatedDrives());
  install_handlers();
  Status s = d->setup(o);
  if (!s.ok()) {
    Status t = d->teardown();
    if (!t.ok()) return s.with_context("(and cleanup failed: " + t.to_string() + ")");
    return s;
  }
  return d;
}

Status EmulatedDrives::setup(const EmulatedDriveOptions& o) {
  bytes_per_s_ = o.bytes_per_s;
  // 1. What the machine must permit, before anything is created.
  if (::geteuid() != 0) {
    return refused("not root (euid " + std::to_string(::geteuid()) +
                   "): loop devices, mount(2) and cgroup throttles need root");
  }
  const int ctl = ::open("/dev/loop-control", O_RDWR | O_CLOEXEC);
  if (ctl < 0) {
    return refused("no loop control: open '/dev/loop-control': " + std::string(strerror(errno)) +
                   " (modprobe loop; a container needs access to it)");
  }
  struct CloseCtl {
    int fd;
    ~CloseCtl() { ::close(fd); }
  } close_ctl{ctl};
  const char* root_env = std::getenv("STRATA_CGROUP_ROOT");
  const std::string cg_root = root_env && *root_env ? root_env : "/sys/fs/cgroup";
  std::string v1 = cg_root + "/blkio", v2;
  if (::access((v1 + "/blkio.throttle.read_bps_device").c_str(), W_OK) != 0) {
    v1.clear();
    for (const std::string& c : {cg_root, cg_root + "/unified"}) {
      std::stringstream ctrls(read_text(c + "/cgroup.controllers"));
      for (std::string w; ctrls >> w;) {
        if (w == "io") v2 = c;
      }
      if (!v2.empty()) break;
    }
    if (v2.empty()) {
      return refused("no blkio controller: neither cgroup v1 '" + cg_root +
                     "/blkio/blkio.throttle.read_bps_device' is writable nor a cgroup v2 "
                     "hierarchy at '" + cg_root + "' or '" + cg_root +
                     "/unified' offers the io controller");
    }
  }
  if (!in_path("mkfs.ext4")) {
    return refused("mkfs.ext4 missing: not found in PATH (Debian: apt-get install e2fsprogs; "
                   "it is in /usr/sbin)");
  }
  std::error_code ec;
  if (!fs::is_directory(o.base_dir, ec)) {
    if (fs::exists(o.base_dir, ec)) {
      return invalid_argument("emulated drives: base directory '" + o.base_dir +
                              "' is not a directory");
    }
    return not_found("emulated drives: base directory '" + o.base_dir + "' does not exist");
  }

  // 2. The cgroup (so that a failure there leaves nothing else to undo).
  static int serial = 0;
  const std::string name =
      "strata-emul-" + std::to_string(::getpid()) + "-" + std::to_string(serial++);
  cgroup_v2_ = v1.empty();
  const std::string hier = cgroup_v2_ ? v2 : v1;
  const std::string home = own_cgroup(cgroup_v2_ ? "" : "blkio");
  cgroup_home_procs_ = hier + (home == "/" ? "" : home) + "/cgroup.procs";
  if (cgroup_v2_) {
    STRATA_RETURN_IF_ERROR(write_attr(v2 + "/cgroup.subtree_control", "+io")
                               .with_context("emulated drives: enabling the io controller"));
  }
  const std::string cg = hier + "/" + name;
  if (::mkdir(cg.c_str(), 0755) != 0) return errno_status(errno, "mkdir cgroup '" + cg + "'");
  cgroup_dir_ = cg;

  // 3. The drives.
  dir_ = (fs::path(o.base_dir) / ("strata-emul-" + std::to_string(::getpid()))).string();
  if (::mkdir(dir_.c_str(), 0755) != 0) {
    const int e = errno;
    const std::string d = dir_;
    dir_.clear();  // not ours: never removed
    return errno_status(e, "mkdir '" + d + "'");
  }
  for (int i = 0; i < o.count; ++i) {
    if (pending_signal_now() != 0) return cancelled_by_signal("setup");
    Drive dr;
    dr.backing_file = dir_ + "/drive" + std::to_string(i) + ".img";
    dr.mount_dir = dir_ + "/mnt" + std::to_string(i);
    drives_.push_back(dr);
    loop_fds_.push_back(-1);
    mounted_.push_back(false);
    node_created_.push_back(false);
    Drive& d = drives_.back();
    {
      int bfd = ::open(d.backing_file.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      if (bfd < 0) return errno_status(errno, "create '" + d.backing_file + "'");
      if (::ftruncate(bfd, static_cast<off_t>(o.size_bytes)) != 0) {
        const int e = errno;
        ::close(bfd);
        return errno_status(e, "ftruncate '" + d.backing_file + "' to " +
                                   std::to_string(o.size_bytes) + " bytes");
      }
      // Attach to a free loop device; another process may take the one offered first.
      Status last = Status::OK();
      for (int attempt = 0; attempt < 16 && loop_fds_.back() < 0; ++attempt) {
        const int n = ::ioctl(ctl, LOOP_CTL_GET_FREE);
        if (n < 0) {
          last = errno_status(errno, "ioctl LOOP_CTL_GET_FREE on /dev/loop-control");
          break;
        }
        const std::string dev = "/dev/loop" + std::to_string(n);
        bool created = false;
        if (::access(dev.c_str(), F_OK) != 0) {
          if (::mknod(dev.c_str(), S_IFBLK | 0600, makedev(7, n)) != 0 && errno != EEXIST) {
            last = errno_status(errno, "mknod '" + dev + "'");
            break;
          }
          created = true;
        }
        const int lfd = ::open(dev.c_str(), O_RDWR | O_CLOEXEC);
        if (lfd < 0) {
          last = errno_status(errno, "open '" + dev + "'");
          if (created) ::unlink(dev.c_str());
          break;
        }
        struct loop_config cfg {};
        cfg.fd = static_cast<uint32_t>(bfd);
        cfg.block_size = 4096;
        cfg.info.lo_flags = LO_FLAGS_DIRECT_IO | LO_FLAGS_AUTOCLEAR;
        std::strncpy(reinterpret_cast<char*>(cfg.info.lo_file_name), d.backing_file.c_str(),
                     LO_NAME_SIZE - 1);
        if (::ioctl(lfd, LOOP_CONFIGURE, &cfg) != 0) {
          const int e = errno;
          last = errno_status(e, "ioctl LOOP_CONFIGURE on '" + dev + "' with '" +
                                     d.backing_file + "' (direct I/O)");
          ::close(lfd);
          if (created) ::unlink(dev.c_str());
          if (e == EBUSY) continue;  // taken meanwhile: ask for another
          break;
        }
        struct stat st {};
        ::fstat(lfd, &st);
        d.loop_device = dev;
        d.major = major(st.st_rdev);
        d.minor = minor(st.st_rdev);
        loop_fds_.back() = lfd;
        node_created_.back() = created;
      }
      ::close(bfd);
      if (loop_fds_.back() < 0) {
        return last.ok() ? unavailable("emulated drives: no free loop device after 16 tries")
                         : last;
      }
    }
    const std::string dio = read_text(loop_sysfs(d.loop_device) + "/dio");
    if (dio.rfind('1', 0) != 0) {
      return failed_precondition("emulated drives: direct I/O is off on " + d.loop_device +
                                 " (" + loop_sysfs(d.loop_device) + "/dio = '" + dio +
                                 "'): the file system of '" + o.base_dir +
                                 "' does not take O_DIRECT with 4096-byte blocks");
    }
    std::string out;
    STRATA_ASSIGN_OR_RETURN(
        int rc, run_program({"mkfs.ext4", "-q", "-F", "-m", "0", "-E",
                             "lazy_itable_init=0,lazy_journal_init=0", d.loop_device},
                            &out));
    if (pending_signal_now() != 0) return cancelled_by_signal("mkfs.ext4");
    if (rc != 0) {
      return internal_error("emulated drives: mkfs.ext4 " + d.loop_device + " exited with " +
                            std::to_string(rc) + ": " + out);
    }
    if (::mkdir(d.mount_dir.c_str(), 0755) != 0) {
      return errno_status(errno, "mkdir '" + d.mount_dir + "'");
    }
    if (::mount(d.loop_device.c_str(), d.mount_dir.c_str(), "ext4", MS_NOATIME, nullptr) != 0) {
      return errno_status(errno, "mount " + d.loop_device + " (ext4) on '" + d.mount_dir + "'");
    }
    mounted_.back() = true;
    const std::string dev = std::to_string(d.major) + ":" + std::to_string(d.minor);
    const std::string bw = std::to_string(o.bytes_per_s);
    if (cgroup_v2_) {
      STRATA_RETURN_IF_ERROR(write_attr(cg + "/io.max", dev + " rbps=" + bw + " wbps=" + bw));
    } else {
      STRATA_RETURN_IF_ERROR(write_attr(cg + "/blkio.throttle.read_bps_device", dev + " " + bw));
      STRATA_RETURN_IF_ERROR(write_attr(cg + "/blkio.throttle.write_bps_device", dev + " " + bw));
    }
  }
  if (pending_signal_now() != 0) return cancelled_by_signal("setup");
  return Status::OK();
}

std::string EmulatedDrives::mount_dirs_joined() const {
  std::string s;
  for (const auto& d : drives_) s += (s.empty() ? "" : ":") + d.mount_dir;
  return s;
}

Status EmulatedDrives::enter_cgroup() {
  if (cgroup_dir_.empty()) return failed_precondition("emulated drives: no cgroup");
  return write_attr(cgroup_dir_ + "/cgroup.procs", std::to_string(::getpid()));
}

Status EmulatedDrives::teardown() {
  if (torn_down_) return Status::OK();
  torn_down_ = true;
  Status first = Status::OK();
  auto note = [&](Status s) {
    if (first.ok() && !s.ok()) first = std::move(s);
  };
  using namespace std::chrono_literals;
  // The cgroup: every process still in it goes back to this process's original cgroup.
  if (!cgroup_dir_.empty()) {
    Status rm = Status::OK();
    for (int attempt = 0; attempt < 40; ++attempt) {
      std::ifstream procs(cgroup_dir_ + "/cgroup.procs");
      for (std::string pid; std::getline(procs, pid);) {
        if (!pid.empty()) (void)write_attr(cgroup_home_procs_, pid);
      }
      if (::rmdir(cgroup_dir_.c_str()) == 0 || errno == ENOENT) {
        rm = Status::OK();
        break;
      }
      rm = errno_status(errno, "rmdir cgroup '" + cgroup_dir_ + "'");
      std::this_thread::sleep_for(50ms);
    }
    note(rm);
  }
  for (size_t i = drives_.size(); i-- > 0;) {
    const Drive& d = drives_[i];
    if (mounted_[i]) {
      int rc = -1;
      for (int attempt = 0; attempt < 100; ++attempt) {  // 5 s
        rc = ::umount2(d.mount_dir.c_str(), 0);
        if (rc == 0 || errno != EBUSY) break;
        std::this_thread::sleep_for(50ms);
      }
      if (rc != 0) {
        note(errno_status(errno, "umount '" + d.mount_dir + "' (detached lazily)"));
        (void)::umount2(d.mount_dir.c_str(), MNT_DETACH);
      }
      mounted_[i] = false;
    }
    if (loop_fds_[i] >= 0) {
      if (::ioctl(loop_fds_[i], LOOP_CLR_FD) != 0 && errno != ENXIO) {
        note(errno_status(errno, "ioctl LOOP_CLR_FD on " + d.loop_device));
      }
      ::close(loop_fds_[i]);
      loop_fds_[i] = -1;
      // Detaching completes asynchronously: wait until the device names no backing file.
      const std::string bf = loop_sysfs(d.loop_device) + "/backing_file";
      for (int attempt = 0; attempt < 500; ++attempt) {  // 10 s (a loaded machine)
        if (read_text(bf).find(d.backing_file) == std::string::npos) break;
        std::this_thread::sleep_for(20ms);
      }
      if (read_text(bf).find(d.backing_file) != std::string::npos) {
        note(unavailable("emulated drives: " + d.loop_device + " still attached to '" +
                         d.backing_file + "'"));
      }
      if (node_created_[i]) ::unlink(d.loop_device.c_str());
    }
    if (::rmdir(d.mount_dir.c_str()) != 0 && errno != ENOENT) {
      note(errno_status(errno, "rmdir '" + d.mount_dir + "'"));
    }
    if (::unlink(d.backing_file.c_str()) != 0 && errno != ENOENT) {
      note(errno_status(errno, "unlink '" + d.backing_file + "'"));
    }
  }
  if (!dir_.empty() && ::rmdir(dir_.c_str()) != 0 && errno != ENOENT) {
    note(errno_status(errno, "rmdir '" + dir_ + "'"));
  }
  restore_handlers();
  return first;
}

EmulatedDrives::~EmulatedDrives() { (void)teardown(); }

int with_emulated_drives(const EmulatedDriveOptions& o,
                         const std::function<int(const EmulatedDrives&)>& body) {
  auto drives = EmulatedDrives::create(o);
  if (!drives.ok()) {
    const int rc = report_error(drives.status());
    EmulatedDrives::reraise_pending_signal();
    return rc;
  }
  EmulatedDrives& d = **drives;
  int rc = 1;
  Status s = d.enter_cgroup();
  if (s.ok()) {
    ::setenv(kEmulatedDrivesEnv, d.mount_dirs_joined().c_str(), 1);
    ::setenv(kEmulatedDriveBwEnv, std::to_string(o.bytes_per_s).c_str(), 1);
    try {
      rc = body(d);
    } catch (const std::exception& e) {
      s = internal_error(std::string("emulated drives: the run threw: ") + e.what());
    }
    ::unsetenv(kEmulatedDrivesEnv);
    ::unsetenv(kEmulatedDriveBwEnv);
  }
  if (!s.ok()) rc = report_error(s);
  Status t = d.teardown();
  if (!t.ok()) rc = report_error(t.with_context("emulated drives cleanup"));
  EmulatedDrives::reraise_pending_signal();
  return rc;
}

}  // namespace strata::cli
