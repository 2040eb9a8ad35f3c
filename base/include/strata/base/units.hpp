// strata::base — byte sizes, alignment and bandwidth units.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "strata/base/status.hpp"

namespace strata {

inline constexpr uint64_t kKiB = 1024ull;
inline constexpr uint64_t kMiB = 1024ull * kKiB;
inline constexpr uint64_t kGiB = 1024ull * kMiB;

/// Parses a byte count: a non-negative integer with an optional suffix. Binary suffixes
/// KiB/MiB/GiB/TiB and the short forms K/M/G/T (also k, KB, MB, GB) all mean powers of
/// 1024, as in fio. Whitespace between number and suffix is allowed. Fractions are
/// accepted with a suffix ("1.5GiB") and truncated to whole bytes.
/// \error InvalidArgument naming `text` for an empty, negative, unknown-suffix or
///     overflowing value.
Result<uint64_t> parse_size(std::string_view text);

/// "1.00 GiB", "512 B", "4.00 KiB": binary units, two decimals.
std::string format_bytes(uint64_t nbytes);

/// Rounds `x` up / down to a multiple of `align` (align > 0, any value, not only 2^k).
constexpr uint64_t align_up(uint64_t x, uint64_t align) { return (x + align - 1) / align * align; }
constexpr uint64_t align_down(uint64_t x, uint64_t align) { return x / align * align; }
constexpr bool is_aligned(uint64_t x, uint64_t align) { return x % align == 0; }
inline bool is_aligned_ptr(const void* p, uint64_t align) {
  return reinterpret_cast<uintptr_t>(p) % align == 0;
}

/// Bandwidth in GB/s (1e9 bytes per second), as fio and nccl-tests report it.
inline double gbps(uint64_t nbytes, double seconds) {
  return seconds > 0 ? static_cast<double>(nbytes) / seconds / 1e9 : 0.0;
}

}  // namespace strata
