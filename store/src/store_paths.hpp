// strata::store (private) — checks of the paths a store is given: no empty path, no NUL
// byte or newline, no duplicate or aliased NVMe directories.
#pragma once

#include <string>
#include <string_view>

#include "strata/base/status.hpp"
#include "strata/store/store.hpp"

namespace strata::store_detail {

/// `path` printable in a message: NUL bytes as "\0".
std::string printable_path(std::string_view path);

/// InvalidArgument naming `what` and the path when it is empty or contains a NUL byte.
Status check_path(std::string_view what, std::string_view path);

/// Checks StoreOptions.path and nvme_dirs (paths; duplicates and aliases among nvme_dirs,
/// compared by weakly_canonical path and, for existing directories, st_dev/st_ino).
/// \error InvalidArgument naming both entries of a duplicate pair.
Status check_store_paths(const StoreOptions& o);

}  // namespace strata::store_detail
