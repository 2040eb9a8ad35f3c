// strata::base — small text helpers for error messages ("did you mean ...?").
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace strata {

/// Levenshtein distance of `a` and `b` (insertions, deletions, substitutions; bytes).
/// O(|a| x |b|) time: meant for short strings such as option and key names.
/// \threadsafety pure.
size_t edit_distance(std::string_view a, std::string_view b);

/// The name among `names` closest to `word` when it is within 2 edits, or when `word` is a
/// proper prefix of it (then it counts as 2); empty when none is. Ties: the first listed.
/// \threadsafety pure.
std::string closest_name(std::string_view word, const std::vector<std::string>& names);

}  // namespace strata
