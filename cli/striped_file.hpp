// The `strata bench` baseline file: one logical extent striped RAID-0 over files in several
// directories, read and written through an IoEngine (bench io, bench step's I/O probe, the
// raw-engine side of bench store).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strata/base/future.hpp"
#include "strata/base/status.hpp"
#include "strata/store/io_engine.hpp"

namespace strata::cli {

/// One logical extent striped RAID-0 over one file in each of k directories (one per
/// device), with stripe unit u bytes: logical byte x lives in file (x / u) % k at byte
/// offset (x / u / k) * u + x % u. A read or write becomes one engine request per stripe
/// unit it touches, all submitted before any is waited on, so every device has requests in
/// flight at once. With one directory a transfer is one engine request on its file.
///
/// Sizes, offsets and buffers are what the engine accepts (any size and offset, aligned or
/// not; see IoEngine). The files stay open while the StripedFile lives.
/// \threadsafety read_async(), write_async() and sync_async() may be called concurrently from any thread (as
///     the engine's own calls may); the object is immutable after open().
class StripedFile {
 public:
  /// Opens (or, per `mode`, creates or truncates) the file `name` in each of `dirs`, in
  /// that order: dirs[i] holds stripe units i, i + k, i + 2k, ...
  /// \param stripe_unit bytes per stripe unit (u), a positive multiple of 4096.
  /// \error InvalidArgument on a null engine; InvalidArgument
  ///     "StripedFile::open('<name>'): ..." on no directories, one directory given twice (check_distinct_directories(): entries
  ///     named "StripedFile::open('<name>'): directory #i"), or a stripe_unit that is 0 or
  ///     not a multiple of 4096; InvalidArgument when an entry is not a directory; NotFound
  ///     (errno_status) naming a missing directory; what IoEngine::open() returns.
  static Result<std::shared_ptr<StripedFile>> open(std::shared_ptr<IoEngine> engine,
                                                   const std::vector<std::string>& dirs,
                                                   const std::string& name, OpenMode mode,
                                                   uint64_t stripe_unit = 1ull << 20);

  /// Reads `nbytes` at logical byte `offset` into `dst`, which must stay valid until the
  /// returned future is ready.
  /// \returns future resolving to nbytes.
  /// \error what the engine reports for the lowest-offset failing stripe unit (e.g.
  ///     DataLoss reading past a file's end); InvalidArgument when offset + nbytes
  ///     overflows 64 bits.
  Future<uint64_t> read_async(void* dst, uint64_t nbytes, uint64_t offset);

  /// Writes `nbytes` from `src` at logical byte `offset`; `src` must stay valid until the
  /// returned future is ready. Errors as read_async() (e.g. ResourceExhausted on ENOSPC).
  Future<uint64_t> write_async(const void* src, uint64_t nbytes, uint64_t offset);

  /// fdatasync of every file, in parallel. \error the first failing file's error.
  Future<void> sync_async();

  /// The stripe unit in bytes (u).
  uint64_t stripe_unit() const { return unit_; }
  /// The files, one per directory, in the order of `dirs`.
  const std::vector<std::shared_ptr<IoFile>>& files() const { return files_; }

  /// The striped file over `files` (as open() returns it; call open() instead).
  StripedFile(std::shared_ptr<IoEngine> engine, std::vector<std::shared_ptr<IoFile>> files,
              uint64_t unit)
      : engine_(std::move(engine)), files_(std::move(files)), unit_(unit) {}

 private:
  Future<uint64_t> run(bool write, char* buf, uint64_t nbytes, uint64_t offset);

  std::shared_ptr<IoEngine> engine_;
  std::vector<std::shared_ptr<IoFile>> files_;
  uint64_t unit_;
};

}  // namespace strata::cli
