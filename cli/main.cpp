// strata — command-line tool: benchmarks (io, store, adam, step, allgather, ...), topology
// info, store inspection and a local launcher. Subcommands live in cli/*.cpp.
#include <algorithm>
#include <cstdio>
#include <iostream>

#include "command.hpp"
#include "key_text.hpp"
#include "strata/base/text.hpp"
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


Status unknown_arguments_error(CLI::App& root) {
  // The command as given ("strata bench io") and what each level left unparsed.
  // "--" (the end of the options) is kept there too, and is no error.
  std::vector<std::string> unknown;
  auto add_unknown = [&](const CLI::App& app) {
    for (auto& u : app.remaining(false)) {
      if (u != "--") unknown.push_back(u);
    }
  };
  add_unknown(root);
  CLI::App* leaf = &root;
  std::string command = "strata";
  for (auto subs = root.get_subcommands(); !subs.empty(); subs = leaf->get_subcommands()) {
    leaf = subs.front();
    command += " " + leaf->get_name();
    add_unknown(*leaf);
  }
  if (unknown.empty()) return Status::OK();
  std::vector<std::string> options, subcommands;
  for (const CLI::Option* o : leaf->get_options()) {
    for (const auto& n : o->get_lnames()) options.push_back("--" + n);
  }
  for (CLI::App* s : leaf->get_subcommands([](CLI::App*) { return true; })) {
    subcommands.push_back(s->get_name());
  }
  std::string msg = command + ": unknown ";
  for (size_t i = 0; i < unknown.size(); ++i) {
    const std::string& u = unknown[i];
    const bool is_option = u.size() > 1 && u[0] == '-';
    // after the first unknown, a plain word is likely its value ("--pth DIR"): not named
    if (i > 0 && !is_option) continue;
    if (i > 0) msg += ", ";
    msg += (is_option ? "option '" : "argument '") + u + "'";
    const std::string guess =
        closest_name(is_option ? u.substr(0, u.find('=')) : u, is_option ? options : subcommands);
    if (!guess.empty()) msg += " (did you mean '" + guess + "'?)";
  }
  return invalid_argument(msg + "; see '" + command + " --help'");
}

}  // namespace strata::cli

int main(int argc, char** argv) {
  CLI::App app{"strata: tiered tensor store (GPU HBM / pinned DRAM / NVMe) — tools and benchmarks"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "strata 0.1.0");
  strata::cli::Registry registry(app);
  for (auto r : strata::cli::registrars()) r(registry);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // An unknown option or argument is the error to report, not what it caused (a required
    // option that then seems missing: "--pth DIR" for "--path DIR").
    if (e.get_exit_code() != static_cast<int>(CLI::ExitCodes::Success)) {
      strata::Status unknown = strata::cli::unknown_arguments_error(app);
      if (!unknown.ok()) return strata::cli::report_error(unknown);
    }
    if (auto* s = dynamic_cast<const strata::cli::OptionStatusError*>(&e)) {
      return strata::cli::report_error(s->status());
    }
    return app.exit(e);
  }
  return strata::cli::Registry::exit_code();
}
