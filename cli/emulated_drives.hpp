// Emulated drives: N block devices of B bytes/s each on one real disk, so that multi-rank
// benchmarks can show how bandwidth grows with one drive per rank (ZeRO-Infinity's
// bandwidth-centric partitioning) on a machine with a single disk.
//
// Drive i is a sparse file `<base>/strata-emul-<pid>/drive<i>.img` of `size_bytes`, attached
// to a free loop device with direct I/O on (LOOP_CONFIGURE with LO_FLAGS_DIRECT_IO, checked
// in /sys/block/loopN/loop/dio: the loop device never caches in the backing file's page
// cache), formatted ext4 (mkfs.ext4, e2fsprogs) and mounted on `<base>/strata-emul-<pid>/mnt<i>`.
// One cgroup per set throttles every drive's reads and writes to B bytes/s:
//   cgroup v1: <root>/blkio/strata-emul-<pid>-<k>, blkio.throttle.{read,write}_bps_device
//              = "MAJ:MIN B" per loop device;
//   cgroup v2: <root>/strata-emul-<pid>-<k> (io controller enabled in the root's
//              cgroup.subtree_control), io.max = "MAJ:MIN rbps=B wbps=B".
// <root> is /sys/fs/cgroup, or $STRATA_CGROUP_ROOT. Throttling applies to I/O submitted by
// processes in that cgroup: enter_cgroup() moves this process there, and the processes it
// starts afterwards (the ranks) inherit it. Reads bypass the page cache only when the
// reader uses O_DIRECT (the store does); buffered writes are not throttled by cgroup v1.
//
// Teardown (teardown(), also run by the destructor) undoes every step that was done, in
// reverse, continuing past failures: processes still in the cgroup are moved back to this
// process's original cgroup and the cgroup removed; each file system unmounted (lazily
// after 5 s of EBUSY); each loop device detached (and its /dev node removed if it was
// created here); backing files, mount points and the directory removed. While a set
// exists, SIGINT, SIGTERM and SIGHUP are caught (see pending_signal()) so that a signal
// during setup or a run ends in teardown; SIGKILL cannot be caught and leaves the set
// behind (docs/partitioned.md says how to remove it by hand).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "strata/base/status.hpp"

namespace strata::cli {

struct EmulatedDriveOptions {
  int count = 1;                ///< number of drives, 1..kMaxEmulatedDrives
  uint64_t bytes_per_s = 0;     ///< read and write throttle per drive, bytes/s (> 0)
  uint64_t size_bytes = 0;      ///< each drive's size (>= 64 MiB, a multiple of 4096)
  std::string base_dir;         ///< existing directory on the real disk for the backing files
};

/// The most drives one set may have (the loop devices and mounts of one benchmark).
inline constexpr int kMaxEmulatedDrives = 64;

/// Smallest emulated drive (ext4's metadata and journal need room besides the data).
inline constexpr uint64_t kMinEmulatedDriveBytes = 64ull << 20;

/// The environment variable that names the drives' mount points, ':'-separated, in order
/// (set by the commands that create drives for the processes they start).
inline constexpr const char* kEmulatedDrivesEnv = "STRATA_EMULATED_DRIVES";
/// The environment variable holding the per-drive throttle in bytes/s (decimal).
inline constexpr const char* kEmulatedDriveBwEnv = "STRATA_EMULATED_DRIVE_BW";

/// Parses a bandwidth for `option`: a byte size as parse_size() reads it (binary suffixes:
/// "200MiB" and "200MB" both mean 209715200), optionally followed by "/s".
/// \error InvalidArgument "<option>: ..." for a non-size, and for 0 ("must be > 0").
Result<uint64_t> parse_bandwidth_arg(const std::string& text, const std::string& option);

/// Reads kEmulatedDrivesEnv: the mount points, or an empty vector when it is unset or empty.
std::vector<std::string> emulated_drive_dirs_from_env();

/// Reads kEmulatedDriveBwEnv: bytes/s, or 0 when it is unset or not a number.
uint64_t emulated_drive_bw_from_env();

class EmulatedDrives {
 public:
  struct Drive {
    std::string backing_file;  ///< the sparse file on the real disk
    std::string mount_dir;     ///< where its file system is mounted
    std::string loop_device;   ///< e.g. "/dev/loop3"
    unsigned major = 0, minor = 0;
  };

  /// Checks what emulation needs before creating anything, then creates `o.count` drives
  /// and their throttling cgroup (see the file comment). On failure everything created so
  /// far is removed before returning.
  /// \error FailedPrecondition "emulated drives refused: <what>" when the machine does not
  ///     permit them: not root (euid != 0), /dev/loop-control cannot be opened, no cgroup
  ///     v1 blkio hierarchy and no cgroup v2 io controller, mkfs.ext4 not in PATH;
  ///     InvalidArgument for out-of-range options; errno_status naming the step and path
  ///     (loop configure, mkfs output, mount, cgroup file) when a step fails;
  ///     Cancelled when SIGINT/SIGTERM/SIGHUP arrived during setup.
  /// \threadsafety one set per process at a time (the signal handlers are process-wide).
  static Result<std::unique_ptr<EmulatedDrives>> create(const EmulatedDriveOptions& o);

  ~EmulatedDrives();
  EmulatedDrives(const EmulatedDrives&) = delete;
  EmulatedDrives& operator=(const EmulatedDrives&) = delete;

  const std::vector<Drive>& drives() const { return drives_; }
  /// The mount points joined with ':' (the value for kEmulatedDrivesEnv).
  std::string mount_dirs_joined() const;
  /// The throttling cgroup's directory.
  const std::string& cgroup_dir() const { return cgroup_dir_; }
  uint64_t bytes_per_s() const { return bytes_per_s_; }

  /// Moves this process (all its threads) into the throttling cgroup; children started
  /// afterwards inherit it. \error errno_status naming the cgroup.procs file.
  Status enter_cgroup();

  /// Undoes everything (idempotent). \returns the first failure, after trying every step.
  Status teardown();

  /// The signal (SIGINT, SIGTERM, SIGHUP) caught while a set existed and not forwarded to
  /// a child, or 0. The caller re-raises it after teardown (reraise_pending_signal()).
  static int pending_signal();
  /// When pending_signal() is set: restores its default action and raises it (ends the
  /// process with that signal). Call after teardown.
  static void reraise_pending_signal();

 private:
  EmulatedDrives() = default;
  Status setup(const EmulatedDriveOptions& o);

  std::vector<Drive> drives_;
  std::vector<int> loop_fds_;          // open while attached
  std::vector<bool> mounted_, node_created_;
  std::string dir_;                    // <base>/strata-emul-<pid>
  std::string cgroup_dir_;             // empty until created
  std::string cgroup_home_procs_;      // cgroup.procs of this process's original cgroup
  bool cgroup_v2_ = false;
  uint64_t bytes_per_s_ = 0;
  bool torn_down_ = false;
};

/// Creates the drives of `o` (EmulatedDrives::create), exports kEmulatedDrivesEnv (their
/// mount points) and kEmulatedDriveBwEnv (o.bytes_per_s) into this process's environment,
/// moves this process into the throttling cgroup, runs `body`, then tears everything down,
/// also when `body` throws; a signal caught meanwhile is re-raised after the teardown.
/// \returns body's exit code; 1 after printing "strata: error: <status>" when setup or
///     teardown fails (setup: nothing is left behind; `body` does not run).
int with_emulated_drives(const EmulatedDriveOptions& o,
                         const std::function<int(const EmulatedDrives&)>& body);

/// Runs `argv` (argv[0] looked up in PATH), waiting for it; SIGTERM/SIGHUP caught by an
/// EmulatedDrives set are forwarded to it. With `output` set its stdout and stderr are
/// captured there instead of inherited.
/// \returns its exit status, or 128 + the signal that ended it.
/// \error errno_status when it cannot be started (NotFound: not in PATH).
Result<int> run_program(const std::vector<std::string>& argv, std::string* output = nullptr);

}  // namespace strata::cli
