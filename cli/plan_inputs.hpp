// Where `strata plan` gets its measurements: the "measured" section of a configuration file
// and the JSON that `strata bench ... --json` prints (docs/planner.md, "Inputs").
#pragma once

#include <string>

#include "planner.hpp"
#include "strata/base/status.hpp"

namespace strata::cli::planner {

/// Adds the "measured" section of configuration file `path` (JSON; docs/configuration.md) to
/// `m`, each figure with source "config PATH". Other sections are not read here. A file
/// without a "measured" section adds nothing.
/// \error NotFound / PermissionDenied (with errno) when `path` cannot be read;
///     InvalidArgument "PATH: ..." when it is not JSON, not an object, "measured" is not an
///     object, a key of it is unknown ("measured.nvme_read_bytes_per_sec"), or a figure is
///     not a positive number ("measured.adam_params_per_s").
Status read_config_measured(const std::string& path, Measurements& m);

/// Adds the figures of one `strata bench` JSON result in file `path` to `m` (replacing
/// earlier ones), with source "bench PATH":
///   io (op read/write): nvme_read/nvme_write_bytes_per_s = gbps x 1e9;
///   store: nvme_write/nvme_read_bytes_per_s = put_gbps/get_gbps x 1e9 (through the store:
///         checksums, chunking; what the optimizer step and the fetch get);
///   adam: adam_params_per_s = numel / seconds_per_step;
///   step: adam_params_per_s = params / compute_seconds and nvme_mixed_bytes_per_s =
///         24 x params / io_seconds (its I/O probe: 12 B/param read and written at once);
///   allgather: allgather_bytes_per_s = busbw_gbps x 1e9 (nproc > 1);
///   partitioned-read: allgather_bytes_per_s = allgather_algbw_gbps x 1e9 x (n - 1) / n
///         (n > 1), and drive_read_bytes_per_s = per_drive_gbps x 1e9 when "emulated" is
///         true (every rank on its own drive; otherwise the ranks share one).
/// The file is one JSON object, or progress lines followed by the object on the last line.
/// \error NotFound / PermissionDenied (errno) when unreadable; InvalidArgument "PATH: ..."
///     when it is not JSON, not one of those results, or a field it needs is missing or not
///     a positive number (naming the field).
Status read_bench_json(const std::string& path, Measurements& m);

}  // namespace strata::cli::planner
