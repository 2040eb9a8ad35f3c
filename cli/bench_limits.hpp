// Checks the `strata bench` commands make before they start, so that a run too large for
// the machine is refused with a Status naming what it needs instead of crashing (memory)
// or filling a disk (ENOSPC), and so that a directory given twice is refused; and the
// removal of a benchmark's directories when it ends.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/base/status.hpp"

namespace strata::cli {

/// Bytes of memory that new allocations can get without swapping: MemAvailable from
/// /proc/meminfo (Linux >= 3.14), else sysconf(_SC_AVPHYS_PAGES) x sysconf(_SC_PAGESIZE).
/// \error Unavailable when neither can be read.
/// \threadsafety safe.
Result<uint64_t> available_memory_bytes();

/// OK when `need_bytes` fit in available_memory_bytes().
/// \param what who needs it, e.g. "bench partitioned-read (2 ranks x 300.00 GiB)".
/// \error ResourceExhausted "<what> needs <n> bytes (<human>) of memory, but only <m> bytes
///     (<human>) are available (MemAvailable)"; Unavailable as available_memory_bytes().
Status check_memory(uint64_t need_bytes, const std::string& what);

/// Bytes a run will write under one directory.
struct DiskNeed {
  std::string option;  ///< how the user named it, e.g. "--path #2"
  std::string path;    ///< the directory (when missing: its nearest existing ancestor's)
  uint64_t bytes = 0;  ///< bytes the run will add there
};

/// OK when every file system can hold what the run writes there: the needs of directories
/// on one file system (same st_dev) are added up and compared with statvfs's f_bavail x
/// f_frsize (space an unprivileged process may use).
/// \error ResourceExhausted "<what> needs <n> bytes (<human>) on the file system of
///     <option> '<path>' [and ...], which has <m> bytes (<human>) available";
///     errno_status (e.g. NotFound) naming the path when statvfs/stat fails.
Status check_free_space(const std::vector<DiskNeed>& needs, const std::string& what);

/// OK when no directory appears twice in `paths` (the same rule as the store's
/// StoreOptions.nvme_dirs check): two entries are the same when their canonical paths are
/// equal, or when both exist with the same st_dev and st_ino (bind mounts, symlinks).
/// \param option the option name, e.g. "--path"; entries are numbered from 1.
/// \error InvalidArgument "<option> #i '<a>' and <option> #j '<b>' are the same directory
///     (<canonical path> | device D inode I): each directory may be listed once"; entries
///     that are empty strings are left to the caller's own check.
Status check_distinct_dirs(const std::vector<std::string>& paths, const std::string& option);

/// OK when no entry of `paths` is an empty string (an empty --path would put a benchmark's
/// directory at the root of the file system, and remove it afterwards).
/// \error InvalidArgument "<option> must name a directory, got an empty string (<option> #i)"
///     for the first empty entry (numbered from 1).
Status check_nonempty_paths(const std::vector<std::string>& paths, const std::string& option);

/// Removes each of `dirs` with everything in it when destroyed, unless `keep` (errors are
/// ignored): a benchmark's directories, on every return, success or error. Declare it
/// before the stores and files in those directories, so that it runs after they close.
struct RemoveDirsOnExit {
  const std::vector<std::string>& dirs;
  bool keep = false;
  ~RemoveDirsOnExit();
};

/// a x b, or InvalidArgument "<what>: <a> x <b> overflows 64 bits" when it does not fit.
Result<uint64_t> checked_mul(uint64_t a, uint64_t b, const std::string& what);

}  // namespace strata::cli
