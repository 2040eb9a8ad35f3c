// Re-executes this `strata` binary as N local ranks (torchrun's environment contract) for the
// multi-rank benchmarks; rank 0 writes its one-line JSON result to a file the caller reads.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "strata/base/status.hpp"

namespace strata::cli {

/// The options every multi-rank benchmark takes besides its own (add_rank_options()).
struct RankOptions {
  bool json = false;         ///< --json: print one JSON object
  bool from_env = false;     ///< --from-env: be one rank of a job (torchrun's variables)
  std::string result_file;   ///< --result-file (internal): where rank 0 writes its JSON
  uint16_t master_port = 0;  ///< --master-port for the launched ranks (0: a free port)
};

/// Registers --master-port, --json, --from-env and --result-file on `cmd`, bound to `o`
/// (which must outlive the parse).
void add_rank_options(CLI::App* cmd, RankOptions& o);

/// What rank 0 of a --from-env run prints: its result as one JSON line into --result-file
/// when the launching command passed one, else one JSON object (--json) or `print_human(j)`.
/// Other ranks print nothing.
void emit_rank_result(const RankOptions& o, int rank, const nlohmann::json& j,
                      const std::function<void(const nlohmann::json&)>& print_human);

struct RanksRun {
  Status ranks_status;  ///< OK when every rank exited 0; else names the failing rank
  std::string result;   ///< the first line rank 0 wrote to --result-file ("" when none)
};

/// Runs `/proc/self/exe <args...> --result-file TMP` as `nproc` local ranks on `master_port`
/// (0 = a free port), waits for all of them, and returns rank 0's result line.
/// \error IoError when the executable or the temporary file cannot be set up; the launcher's
///     own errors (e.g. fork failure). A rank's failure is reported in ranks_status instead.
///     A SIGINT/SIGTERM/SIGHUP this process got meanwhile (forwarded to the ranks) is raised
///     again here once they are gone, then Cancelled (when a handler let it return).
Result<RanksRun> run_self_as_ranks(int nproc, uint32_t master_port, std::vector<std::string> args);

/// Prints rank 0's result line of `run` (a run_self_as_ranks() result): one JSON object
/// with o.json, else `print_human(j)`.
/// \returns the result, parsed.
/// \error Internal "rank 0 wrote no result" when run.result is not JSON (nothing printed).
Result<nlohmann::json> print_ranks_result(
    const RankOptions& o, const RanksRun& run,
    const std::function<void(const nlohmann::json&)>& print_human);

}  // namespace strata::cli
