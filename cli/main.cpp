// strata — command-line tool: benchmarks (io, store, adam, step, allgather, ...), topology
// info, store inspection and a local launcher. Subcommands live in cli/*.cpp.
#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "command.hpp"
#include "key_text.hpp"
#include "strata/base/units.hpp"

namespace strata::cli {

namespace {
int g_exit_code = 0;
}

std::vector<Registrar>& registrars() {
  static std::vector<Registrar> r;
  return r;
}

CLI::App& Registry::group(const std::string& name, const std::string& description) {
  for (auto* sub : root_.get_subcommands([](CLI::App*) { return true; })) {
    if (sub->get_name() == name) return *sub;
  }
  CLI::App* sub = root_.add_subcommand(name, description);
  sub->require_subcommand(1);
  return *sub;
}

void Registry::set_exit_code(int code) { g_exit_code = code; }
int Registry::exit_code() { return g_exit_code; }

int report_error(const Status& status) {
  // Messages name keys and paths, which may hold NUL or terminal control sequences.
  std::fprintf(stderr, "strata: error: %s\n", escape_key(status.to_string(), false).c_str());
  return 1;
}

uint64_t parse_size_or_throw(const std::string& text, const std::string& option) {
  auto r = parse_size(text);
  if (!r.ok()) throw CLI::ValidationError(option, r.status().message());
  return *r;
}

Result<uint64_t> parse_size_arg(const std::string& text, const std::string& option) {
  auto r = parse_size(text);
  if (!r.ok()) return invalid_argument(option + ": " + r.status().message());
  return r;
}

CLI::App& bench_group(Registry& r) {
  return r.group("bench", "Benchmarks (each reports the limit measured in the same run)");
}

CLI::Option* non_negative(CLI::Option* opt) {
  const std::string name = opt->get_name();
  opt->check(CLI::Validator(
      [name](std::string& value) -> std::string {
        const size_t i = value.find_first_not_of(" \t\n\v\f\r");
        if (i != std::string::npos && value[i] == '-') {
          throw OptionStatusError(invalid_argument(name + " must be a non-negative integer, got '" +
                                                   value + "'"));
        }
        return {};
      },
      ""));
  return opt;
}

bool stderr_is_tty() { return isatty(STDERR_FILENO) == 1; }

}  // namespace strata::cli

int main(int argc, char** argv) {
  CLI::App app{"strata: tiered tensor store (GPU HBM / pinned DRAM / NVMe) — tools and benchmarks"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "strata 0.1.0");
  strata::cli::Registry registry(app);
  for (auto r : strata::cli::registrars()) r(registry);
  try {
    app.parse(argc, argv);
  } catch (const strata::cli::OptionStatusError& e) {
    return strata::cli::report_error(e.status());
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return strata::cli::Registry::exit_code();
}
