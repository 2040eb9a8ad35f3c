// strata::base — reading a small text file whole (configuration files, records), with
// errors that name it.
#pragma once

#include <cstddef>
#include <string>

#include "strata/base/status.hpp"

namespace strata {

/// The bytes of file `path`, read whole with read(2) (EINTR retried).
/// \param label how messages name the file, e.g. "config file 'strata.json'".
/// \param max_bytes the largest file accepted, bytes.
/// \error errno_status "cannot open <label>" / "cannot read <label>" (NotFound,
///     PermissionDenied, IoError by errno); InvalidArgument "<label>: larger than
///     <max_bytes / 2^20> MiB" for a larger file.
/// \threadsafety safe (reads the file only).
Result<std::string> read_text_file(const std::string& path, const std::string& label,
                                   size_t max_bytes);

}  // namespace strata
