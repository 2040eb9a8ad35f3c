// Re-executes this `strata` binary as N local ranks (torchrun's environment contract) for the
// multi-rank benchmarks; rank 0 writes its one-line JSON result to a file the caller reads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/base/status.hpp"

namespace strata::cli {

struct RanksRun {
  Status ranks_status;  ///< OK when every rank exited 0; else names the failing rank
  std::string result;   ///< the first line rank 0 wrote to --result-file ("" when none)
};

/// Runs `/proc/self/exe <args...> --result-file TMP` as `nproc` local ranks on `master_port`
/// (0 = a free port), waits for all of them, and returns rank 0's result line.
/// \error IoError when the executable or the temporary file cannot be set up; the launcher's
///     own errors (e.g. fork failure). A rank's failure is reported in ranks_status instead.
Result<RanksRun> run_self_as_ranks(int nproc, uint32_t master_port, std::vector<std::string> args);

}  // namespace strata::cli
