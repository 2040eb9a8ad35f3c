// `--config FILE`: the configuration file option of every command that opens a store or an
// I/O engine (see store/config.hpp for the file and the precedence of its values).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace strata::cli {

/// Adds `--config FILE` to `sub`, bound to `file` ("" = none given: $STRATA_CONFIG, if set).
/// \returns the option (for chaining).
inline CLI::Option* add_config_option(CLI::App* sub, std::string& file) {
  return sub->add_option("--config", file,
                         "configuration file (JSON, e.g. from `strata tune`; default "
                         "$STRATA_CONFIG); its values are below STRATA_* variables and "
                         "explicit options");
}

/// True when `opt` was given on the command line.
inline bool given(const CLI::Option* opt) { return opt != nullptr && opt->count() > 0; }

}  // namespace strata::cli
