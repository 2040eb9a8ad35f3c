// The `strata` command-line tool: each cli/*.cpp registers its subcommands here.
//
//   static void register_my_command(strata::cli::Registry& r) { ... }
//   STRATA_CLI_COMMAND(register_my_command);
//
// A registrar adds CLI11 subcommands under r.root() (or r.group("bench", "...")) and sets
// each subcommand's callback to store the exit code via r.set_exit_code().
#pragma once

#include <CLI/CLI.hpp>
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "strata/base/status.hpp"

namespace strata::cli {

class Registry {
 public:
  explicit Registry(CLI::App& root) : root_(root) {}
  CLI::App& root() { return root_; }
  /// The subcommand `name` of the root, created on first use (e.g. "bench", "store").
  CLI::App& group(const std::string& name, const std::string& description);
  static void set_exit_code(int code);
  static int exit_code();

 private:
  CLI::App& root_;
};

using Registrar = void (*)(Registry&);
std::vector<Registrar>& registrars();

struct AutoRegister {
  explicit AutoRegister(Registrar r) { registrars().push_back(r); }
};

/// Prints "strata: error: <status>" to stderr and returns the exit code for it (1).
int report_error(const Status& status);

/// CLI11 validator/transformer for byte sizes with suffixes (KiB, MiB, GiB, K, M, G).
uint64_t parse_size_or_throw(const std::string& text, const std::string& option);

/// Median of `v` (the mean of the two middle values for an even count; 0 when empty): how
/// every benchmark summarizes its repeated runs.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// An option value refused by a strata validator (see non_negative()). It carries the
/// Status to report: main() prints it as "strata: error: <status>" and exits 1, like the
/// checks the commands make themselves, instead of CLI11's "<name>: <message>" form.
class OptionStatusError : public CLI::ParseError {
 public:
  explicit OptionStatusError(Status status)
      : CLI::ParseError(status.to_string(), CLI::ExitCodes::ValidationError),
        status_(std::move(status)) {}
  const Status& status() const { return status_; }

 private:
  Status status_;
};

/// Makes `opt`, bound to an unsigned integer, refuse a value whose first non-blank character
/// is '-'. CLI11 2.1 converts unsigned options with strtoull, which wraps "-5" to 2^64 - 5
/// instead of failing. Apply it to every option bound to an unsigned type.
/// \returns opt (for chaining).
/// \error parsing then throws OptionStatusError holding InvalidArgument
///     "<name> must be a non-negative integer, got '<value>'" (name: the option's first long
///     name, e.g. "--params").
CLI::Option* non_negative(CLI::Option* opt);

/// True when stdout/stderr is a terminal (progress lines are shown only then).
bool stderr_is_tty();

}  // namespace strata::cli

#define STRATA_CLI_COMMAND(fn) \
  static ::strata::cli::AutoRegister STRATA_CONCAT(strata_cli_reg_, __LINE__)(fn)
