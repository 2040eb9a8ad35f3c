// The `strata` command-line tool: each command file (cli/<command>_cmd.cpp) registers its
// subcommands here.
//
//   static void register_my_command(strata::cli::Registry& r) { ... }
//   STRATA_CLI_COMMAND(register_my_command);
//
// A registrar adds CLI11 subcommands under r.root(), r.group("store", "...") or
// bench_group(r), each with add_command(), whose callback stores the exit code its run
// function returns (Registry::set_exit_code()).
#pragma once

#include <CLI/CLI.hpp>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
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

/// After a failed parse of `root`: InvalidArgument naming every argument the command line
/// held that no (sub)command took, e.g. "strata bench io: unknown option '--pth' (did you mean
/// '--path'?); see 'strata bench io --help'"; OK when there is none.
Status unknown_arguments_error(CLI::App& root);

/// CLI11 validator/transformer for byte sizes with suffixes (KiB, MiB, GiB, K, M, G).
uint64_t parse_size_or_throw(const std::string& text, const std::string& option);

/// The byte size `text` (suffixes as parse_size_or_throw()) given for `option`.
/// \error InvalidArgument "<option>: <why>" when `text` is not a size.
Result<uint64_t> parse_size_arg(const std::string& text, const std::string& option);

/// The `strata bench` group, under which every benchmark adds its subcommand.
CLI::App& bench_group(Registry& r);

using Clock = std::chrono::steady_clock;

/// Seconds elapsed since `t0` (steady clock).
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// User + system CPU seconds of the whole process so far, all threads (getrusage
/// RUSAGE_SELF): around a timed transfer, the CPU it cost (engine and kernel threads
/// included).
inline double process_cpu_seconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6; };
  return sec(ru.ru_utime) + sec(ru.ru_stime);
}

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

/// Adds subcommand `name` of `parent` whose callback runs `run(*args)` and sets the exit code
/// to what it returns; `args` holds what the subcommand's options are bound to.
/// \returns the subcommand (to add its options to).
template <class Args>
CLI::App* add_command(CLI::App& parent, const std::string& name, const std::string& help,
                      const std::shared_ptr<Args>& args, int (*run)(const Args&)) {
  CLI::App* sub = parent.add_subcommand(name, help);
  sub->callback([args, run] { Registry::set_exit_code(run(*args)); });
  return sub;
}

/// Adds option `name` bound to `value`, its default shown in --help; an option bound to an
/// unsigned integer also refuses negative values (non_negative()).
/// \returns the option (for chaining).
template <class T>
CLI::Option* add_defaulted(CLI::App* app, const std::string& name, T& value,
                           const std::string& help) {
  CLI::Option* opt = app->add_option(name, value, help);
  if constexpr (std::is_integral_v<T> && std::is_unsigned_v<T> && !std::is_same_v<T, bool>) {
    non_negative(opt);
  }
  return opt->capture_default_str();
}

}  // namespace strata::cli

#define STRATA_CLI_COMMAND(fn) \
  static ::strata::cli::AutoRegister STRATA_CONCAT(strata_cli_reg_, __LINE__)(fn)
