// strata::store (private) — a store's identity marker files and durable directory entries.
//
// Each NVMe directory holds the marker `strata-<uuid>.id` (store_dirs.hpp names it) next to
// the data file, naming the root of the store that owns it. Markers are replaced durably:
// temp file, fsync, rename, fsync of the directory.
#pragma once

#include <optional>
#include <string>

#include "strata/base/status.hpp"

namespace strata::store_detail {

/// fsync() of a directory, so that entries created or renamed in it are durable.
/// \error errno_status naming the directory (open or fsync).
Status fsync_directory(const std::string& dir);

/// What a marker file records: the uuid of the store and the root it belongs to.
struct Marker {
  std::string uuid;
  std::string root;
};

/// Reads the marker file at `path`; nullopt when absent.
/// \error DataLoss when it is not a strata marker or lacks its uuid or root line;
///     errno_status when it cannot be read.
Result<std::optional<Marker>> read_marker(const std::string& path);

/// Writes the marker of store `uuid` at `root` to `path` in directory `dir`, durably
/// (`path`.tmp, fsync, rename over `path`, fsync of `dir`).
/// \error errno_status naming the file or directory that failed.
Status write_marker(const std::string& dir, const std::string& path, const std::string& uuid,
                    const std::string& root);

}  // namespace strata::store_detail
