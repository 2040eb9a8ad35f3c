// strata::store (private) — a store's NVMe directories on disk and in its catalog.
//
//  - Relocatable catalogs: NVMe directories inside the store root are recorded relative
//    to it, so a copied or moved root keeps working.
//  - Identity: each NVMe directory holds the marker `strata-<uuid>.id` (store_markers.hpp)
//    next to the data file `strata-<uuid>.data`, naming the root of the store that owns it.
//    A store that finds another live store's marker in a directory outside its root (a copy
//    that would share the original's data file) refuses to open; a missing data file of a
//    directory that the catalog says holds chunks is DataLoss (never replaced by an empty
//    one).
//  - Orphaned data: a missing catalog beside existing data files is DataLoss.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "catalog_sqlite.hpp"
#include "strata/base/status.hpp"

namespace strata::store_detail {

/// Catalog form of NVMe directory `dir` (absolute, normalized) of the store at `root`:
/// "." or a relative path when inside the root, else the absolute path.
std::string encode_dir(const std::string& root, const std::string& dir);
/// Inverse of encode_dir (absolute paths pass through).
std::string decode_dir(const std::string& root, const std::string& recorded);
/// True when `dir` is `root` or below it (both absolute, normalized).
bool inside_root(const std::string& root, const std::string& dir);

/// The catalog's nvme_dirs record of the store at `root`: one encode_dir() form per line,
/// each ended by '\n', decoded with decode_dir(). Thread-safe (reads the file system only
/// to tell aliases apart, as check_distinct_directories).
/// \error DataLoss naming `cat_path` when the record is empty, its last line lacks '\n', or
///     it lists one directory twice (the message quotes the record, NUL bytes as "\0").
Result<std::vector<std::string>> parse_dirs_record(const std::string& root,
                                                   const std::string& record,
                                                   const std::string& cat_path);

/// Rewrites the catalog's nvme_dirs record in the relocatable form of encode_dir() when it
/// differs (older catalogs recorded absolute paths). \error as Catalog::set_meta.
Status record_dirs_relocatable(catalog::Catalog& cat, const std::string& root,
                               const std::vector<std::string>& dirs);

/// Data and marker file names of the store `uuid` in `dir`.
std::string data_file_path(const std::string& dir, const std::string& uuid);
std::string marker_file_path(const std::string& dir, const std::string& uuid);

/// When the catalog at `cat_path` of the store at `root` is missing: DataLoss "catalog ...
/// missing but data files exist in DIR (...)" when the root holds a strata data or marker
/// file, or another of `nvme_dirs` holds a marker naming this root.
Status check_orphaned_data(const std::string& cat_path, const std::string& root,
                           const std::vector<std::string>& nvme_dirs);

/// Checks (and, when writable, creates or updates) the NVMe directories of the store at
/// `root` with identity `uuid` before its data files are opened. `chunks[i]`: chunks the
/// catalog places in dirs[i].
/// \error DataLoss when a directory or data file holding chunks is missing;
///     FailedPrecondition when a directory outside the root carries the marker of another
///     existing store with the same uuid (this store is a copy that would share its data);
///     IoError / PermissionDenied writing a marker.
Status prepare_nvme_dirs(const std::string& root, const std::string& uuid,
                         const std::vector<std::string>& dirs, const std::vector<uint64_t>& chunks,
                         bool read_only);

/// Creates NVMe directory `dir` (one level: mkdir, never its parents). A missing parent is
/// an unmounted drive or a typo (`/mnt/nvmee0/strata`) far more often than a wish, and
/// creating it would quietly put the data file on whatever disk holds the path.
/// \error NotFound "nvme directory D: its parent P does not exist (an unmounted drive or a
///     typo?); create P first" when the parent is missing or not a directory; errno_status
///     naming the directory when mkdir fails otherwise (EEXIST of a directory is success).
Status create_nvme_dir(const std::string& dir);

}  // namespace strata::store_detail
