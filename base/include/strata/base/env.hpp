// strata::base — STRATA_* environment variables. They only seed defaults of options
// structs; an explicitly set option always wins. A malformed value is an error, not ignored.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "strata/base/status.hpp"

namespace strata {

/// The variable's value, or nullopt when unset.
std::optional<std::string> env_string(const char* name);

/// Unset -> `fallback`. Set -> parsed as a non-negative integer (no suffix).
/// \error InvalidArgument naming the variable when the value is malformed.
Result<uint64_t> env_uint(const char* name, uint64_t fallback);

/// Unset -> `fallback`. Set -> parse_size() (suffixes allowed: "64MiB").
Result<uint64_t> env_size(const char* name, uint64_t fallback);

/// Unset -> `fallback`. Set -> a decimal number of seconds, 0 or 0.001 to 1e9 ("10", "0.5"),
/// rounded to the millisecond. \error InvalidArgument naming the variable when the value is
/// malformed or out of that range (a positive value under 1 ms would round to 0).
Result<std::chrono::milliseconds> env_seconds(const char* name,
                                              std::chrono::milliseconds fallback);

/// Unset -> `fallback`. Accepts 1/0, true/false, yes/no, on/off (case-insensitive).
Result<bool> env_bool(const char* name, bool fallback);

}  // namespace strata
