#include "strata/base/env.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include "strata/base/units.hpp"

namespace strata {

std::optional<std::string> env_string(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

Result<uint64_t> env_uint(const char* name, uint64_t fallback) {
  auto v = env_string(name);
  if (!v) return fallback;
  if (v->empty() || !std::all_of(v->begin(), v->end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
    return invalid_argument(std::string("environment variable ") + name + "='" + *v +
                            "' is not a non-negative integer");
  return std::strtoull(v->c_str(), nullptr, 10);
}

Result<uint64_t> env_size(const char* name, uint64_t fallback) {
  auto v = env_string(name);
  if (!v) return fallback;
  auto r = parse_size(*v);
  if (!r.ok()) return r.status().with_context(std::string("environment variable ") + name);
  return r;
}

Result<bool> env_bool(const char* name, bool fallback) {
  auto v = env_string(name);
  if (!v) return fallback;
  std::string s;
  for (char c : *v) s += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return false;
  return invalid_argument(std::string("environment variable ") + name + "='" + *v +
                          "' is not a boolean (1/0, true/false, yes/no, on/off)");
}

Result<std::chrono::milliseconds> env_seconds(const char* name,
                                              std::chrono::milliseconds fallback) {
  auto v = env_string(name);
  if (!v) return fallback;
  char* end = nullptr;
  const double sec = v->empty() ? -1.0 : std::strtod(v->c_str(), &end);
  // A positive value under a millisecond would round to 0 (off): refused, not silently off.
  if (v->empty() || end != v->c_str() + v->size() || !std::isfinite(sec) || sec < 0.0 ||
      sec > 1e9 || (sec > 0.0 && sec < 0.001)) {
    return invalid_argument(std::string("environment variable ") + name + "='" + *v +
                            "' is not a number of seconds: 0, or 0.001 to 1e9 (e.g. 10 or 0.5)");
  }
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(sec * 1000.0)));
}

}  // namespace strata
