// Fuzz target: the CLI's terminal-safe key text (cli/key_text.hpp).
// Properties: escape_key() of any bytes is valid UTF-8 without C0/C1 controls or DEL (no
// key can move the cursor or recolor a terminal) and unescape_key() inverts it; with
// escape_backslash=false the output is as safe; unescape_key() of any text that it accepts
// escapes and unescapes back to the same bytes.
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_check.hpp"
#include "key_text.hpp"

namespace {

/// True when `s` is valid UTF-8 (RFC 3629) holding no C0/C1 control and no DEL.
bool terminal_safe(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned c = p[i];
    if (c < 0x80) {
      if (c < 0x20 || c == 0x7f) return false;
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp, min;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2, cp = c & 0x1F, min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3, cp = c & 0x0F, min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4, cp = c & 0x07, min = 0x10000;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (size_t j = 1; j < len; ++j) {
      if ((p[i + j] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + j] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF) || cp <= 0x9F) return false;
    i += len;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata::cli;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const std::string e = escape_key(in);
  FUZZ_CHECK(terminal_safe(e), "escape_key gives unsafe text");
  auto back = unescape_key(e);
  FUZZ_CHECK(back && *back == in, "unescape_key(escape_key(k)) != k");
  FUZZ_CHECK(terminal_safe(escape_key(in, false)), "escape_key(k, false) gives unsafe text");
  if (auto u = unescape_key(in)) {
    auto u2 = unescape_key(escape_key(*u));
    FUZZ_CHECK(u2 && *u2 == *u, "an accepted escaped text does not round-trip");
  }
  return 0;
}
