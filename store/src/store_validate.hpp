// strata::store (private) — validation of store inputs and of a store's on-disk identity.
//
//  - Tensor shapes: numel and nbytes overflow-checked before anything is written.
//  - Paths: no empty path, no NUL byte.
//  - NVMe directories: no duplicates or aliases (same realpath or same st_dev/st_ino).
//  - Relocatable catalogs: NVMe directories inside the store root are recorded relative
//    to it, so a copied or moved root keeps working.
//  - Identity marker: each NVMe directory holds `strata-<uuid>.id` next to the data file
//    `strata-<uuid>.data`, naming the root of the store that owns it. A store that finds
//    another live store's marker in a directory outside its root (a copy that would share
//    the original's data file) refuses to open; a missing data file of a directory that the
//    catalog says holds chunks is DataLoss (never replaced by an empty one).
//  - Orphaned data: a missing catalog beside existing data files is DataLoss.
//  - Damaged catalog rows: described (not fatal) so that one bad row leaves the rest of the
//    store reachable.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "catalog_sqlite.hpp"
#include "strata/base/status.hpp"
#include "strata/store/store.hpp"

namespace strata::store_detail {

/// numel * dtype_size(dtype) of `desc`, or nullopt when an extent is negative or the
/// product overflows uint64.
std::optional<uint64_t> checked_nbytes(DType dtype, const std::vector<int64_t>& shape);

/// InvalidArgument "<op> '<key>': ..." naming the shape when an extent is negative or
/// numel / nbytes overflows 64 bits.
Status check_tensor_desc(std::string_view op, const std::string& key, const TensorDesc& desc);

/// `path` printable in a message: NUL bytes as "\0".
std::string printable_path(std::string_view path);

/// fsync() of a directory, so that entries created or renamed in it are durable.
/// \error errno_status naming the directory (open or fsync).
Status fsync_directory(const std::string& dir);

/// InvalidArgument naming `what` and the path when it is empty or contains a NUL byte.
Status check_path(std::string_view what, std::string_view path);

/// Checks StoreOptions.path and nvme_dirs (paths; duplicates and aliases among nvme_dirs,
/// compared by weakly_canonical path and, for existing directories, st_dev/st_ino).
/// \error InvalidArgument naming both entries of a duplicate pair.
Status check_store_paths(const StoreOptions& o);

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

/// Empty when catalog row `r` is sound for a store with `ndirs` directories and
/// `chunk_bytes`, else a description of the damage (names the key).
std::string row_damage(const catalog::ObjectRow& r, size_t ndirs, uint64_t chunk_bytes);
/// True when chunk `c` names a valid extent (its space is then kept out of reuse).
bool chunk_adoptable(const catalog::ChunkRow& c, size_t ndirs, uint64_t chunk_bytes);

/// Extents claimed by the catalog rows loaded so far, per directory: two committed rows
/// whose chunks overlap would otherwise make the store unopenable.
class ExtentClaims {
 public:
  ExtentClaims(size_t ndirs, uint64_t chunk_bytes) : dirs_(ndirs), chunk_bytes_(chunk_bytes) {}
  /// Claims the adoptable chunks of `r` that overlap no earlier claim; adopt[j] says which.
  /// \returns "" or a description of the first overlap (the row is then damaged).
  std::string claim(const catalog::ObjectRow& r, std::vector<bool>* adopt);

 private:
  struct Claim {
    uint64_t end;
    std::string key;
  };
  std::vector<std::map<uint64_t, Claim>> dirs_;  // offset -> claim
  uint64_t chunk_bytes_;
};

/// Shrinks the data file open as `fd` (at `path`) to `keep_bytes` when it is larger
/// (space preallocated for a put that failed). \error IoError naming the path.
Status trim_data_file(int fd, const std::string& path, uint64_t keep_bytes);

/// SQLite URI "file:<percent-encoded path>?mode=ro[&immutable=1]" for a read-only open.
std::string sqlite_readonly_uri(const std::string& path, bool immutable);

/// True when new files can be created in `dir` (not a read-only mount, write permission).
bool dir_writable(const std::string& dir);

}  // namespace strata::store_detail
