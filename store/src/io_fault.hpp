// strata::store — fault injection at the I/O engine's system-call boundary, for the
// reliability tests (tests/reliability/test_io_faults.cpp). With no injector installed
// (always, outside those tests) each hook is one atomic load.
//
// Sites: io_uring_setup (engine creation), open(O_DIRECT), io_uring_enter (submission),
// and the result of every read, write and fdatasync of a piece (CQE res, or the return of
// pread/pwrite/fdatasync in the thread engine). An injector may fail the call with an
// errno, or shorten a read/write to fewer bytes than the kernel transferred: the engine then
// sees exactly what the kernel could have returned, and handles it by its normal paths.
#pragma once

#include <cstdint>
#include <string>

namespace strata::io::fault {

enum class Site : uint8_t { kSetup, kOpenDirect, kSubmit, kRead, kWrite, kSync };
inline constexpr int kNumSites = 6;

/// Decides faults; implemented by the tests. Must be thread-safe (called from engine and
/// worker threads).
class Injector {
 public:
  virtual ~Injector() = default;
  /// For a call at `site` on `path` (empty for kSetup/kSubmit) that would return `res`
  /// (bytes transferred, or 0, or -errno; kSetup/kOpenDirect/kSubmit: 0, before the call):
  /// the result the engine sees instead, or `res` for no fault. A read/write result may
  /// only be shortened (0 < r < res) or replaced by -errno.
  virtual int64_t filter(Site site, const std::string& path, int64_t res) = 0;
};

/// Installs `inj` (null: none). Not owned; must outlive its installation.
void install(Injector* inj);

namespace detail {
Injector* current();
}

/// `res`, or what the installed injector makes of it.
inline int64_t filter(Site site, const std::string& path, int64_t res) {
  Injector* inj = detail::current();
  return inj ? inj->filter(site, path, res) : res;
}

}  // namespace strata::io::fault
