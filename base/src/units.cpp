#include "strata/base/units.hpp"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <string>

namespace strata {

Result<uint64_t> parse_size(std::string_view text) {
  std::string t(text);
  auto bad = [&](const char* why) {
    return invalid_argument("invalid byte size '" + std::string(text) + "': " + why);
  };
  size_t i = 0;
  while (i < t.size() && std::isspace(static_cast<unsigned char>(t[i]))) ++i;
  size_t start = i;
  bool dot = false;
  while (i < t.size() && (std::isdigit(static_cast<unsigned char>(t[i])) || (t[i] == '.' && !dot))) {
    if (t[i] == '.') dot = true;
    ++i;
  }
  if (i == start) return bad("expected a non-negative number");
  std::string num = t.substr(start, i - start);
  while (i < t.size() && std::isspace(static_cast<unsigned char>(t[i]))) ++i;
  std::string suffix = t.substr(i);
  while (!suffix.empty() && std::isspace(static_cast<unsigned char>(suffix.back()))) suffix.pop_back();
  uint64_t mult = 1;
  std::string s;
  for (char c : suffix) s += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s.empty() || s == "b") mult = 1;
  else if (s == "k" || s == "kb" || s == "kib") mult = kKiB;
  else if (s == "m" || s == "mb" || s == "mib") mult = kMiB;
  else if (s == "g" || s == "gb" || s == "gib") mult = kGiB;
  else if (s == "t" || s == "tb" || s == "tib") mult = kGiB * 1024;
  else return bad("unknown suffix (use B, KiB, MiB, GiB, TiB or K, M, G, T)");
  if (dot) {
    if (mult == 1) return bad("fractional byte count needs a unit suffix");
    long double v = std::strtold(num.c_str(), nullptr) * static_cast<long double>(mult);
    if (!(v >= 0) || v > 1.8e19L) return bad("value out of range");
    return static_cast<uint64_t>(v);
  }
  uint64_t v = 0;
  for (char c : num) {
    uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return bad("value out of range");
    v = v * 10 + d;
  }
  if (v != 0 && mult > UINT64_MAX / v) return bad("value out of range");
  return v * mult;
}

std::string format_bytes(uint64_t n) {
  char buf[64];
  if (n < kKiB) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(n));
  else if (n < kMiB) std::snprintf(buf, sizeof buf, "%.2f KiB", n / double(kKiB));
  else if (n < kGiB) std::snprintf(buf, sizeof buf, "%.2f MiB", n / double(kMiB));
  else std::snprintf(buf, sizeof buf, "%.2f GiB", n / double(kGiB));
  return buf;
}

}  // namespace strata
