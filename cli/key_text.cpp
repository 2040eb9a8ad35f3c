// Terminal-safe text for keys and messages (`strata store ...`, error reports): see
// escape_key() in key_text.hpp.
#include "key_text.hpp"

#include <cstdint>
#include <cstdio>

namespace strata::cli {
namespace {

/// The characters escape_key() writes as a backslash and a letter: each entry is the
/// character, then the letter.
constexpr const char* kNamedEscapes[] = {"\\\\", "\tt", "\nn", "\rr"};

/// The entry of kNamedEscapes for character `c`, nullptr when it has none.
const char* named_escape(char c) {
  for (const char* n : kNamedEscapes) {
    if (n[0] == c) return n;
  }
  return nullptr;
}

/// The entry of kNamedEscapes whose letter is `e` (the character after a backslash).
const char* named_escape_of(char e) {
  for (const char* n : kNamedEscapes) {
    if (n[1] == e) return n;
  }
  return nullptr;
}

}  // namespace

// escape_key(), unescape_key(): see key_text.hpp.
std::string escape_key(std::string_view k, bool escape_backslash) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(k.size());
  auto byte_escape = [&](unsigned char c) {
    out += "\\x";
    out += hex[c >> 4];
    out += hex[c & 15];
  };
  const auto* p = reinterpret_cast<const unsigned char*>(k.data());
  const size_t n = k.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      const char* named = named_escape(static_cast<char>(c));
      if (named != nullptr && (c != '\\' || escape_backslash)) {
        out += '\\';
        out += named[1];
      } else if (c < 0x20 || c == 0x7f) {
        byte_escape(c);
      } else {
        out += static_cast<char>(c);
      }
      ++i;
      continue;
    }
    // A UTF-8 sequence (RFC 3629): lead byte, continuation bytes, no overlongs, no
    // surrogates, at most U+10FFFF.
    size_t len = 0;
    uint32_t cp = 0, min = 0;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2, cp = c & 0x1F, min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3, cp = c & 0x0F, min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4, cp = c & 0x07, min = 0x10000;
    }
    bool ok = len > 0 && i + len <= n;
    for (size_t j = 1; ok && j < len; ++j) {
      if ((p[i + j] & 0xC0) != 0x80) ok = false;
      cp = (cp << 6) | (p[i + j] & 0x3F);
    }
    ok = ok && cp >= min && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    if (!ok) {
      byte_escape(c);
      ++i;
      continue;
    }
    if (cp <= 0x9F) {  // C1 control
      out += "\\u00";
      out += hex[cp >> 4];
      out += hex[cp & 15];
    } else {
      out.append(k.substr(i, len));
    }
    i += len;
  }
  return out;
}

std::optional<std::string> unescape_key(std::string_view t) {
  auto hexval = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] != '\\') {
      out += t[i];
      continue;
    }
    if (++i >= t.size()) return std::nullopt;
    const char e = t[i];
    if (const char* named = named_escape_of(e); named != nullptr) {
      out += named[0];
    } else if (e == 'x' && i + 2 < t.size() && hexval(t[i + 1]) >= 0 &&
               hexval(t[i + 2]) >= 0) {
      out += static_cast<char>(hexval(t[i + 1]) * 16 + hexval(t[i + 2]));
      i += 2;
    } else if (e == 'u' && i + 4 < t.size() && t[i + 1] == '0' && t[i + 2] == '0' &&
               hexval(t[i + 3]) >= 8 && hexval(t[i + 4]) >= 0) {  // U+0080-U+00FF
      const unsigned cp = hexval(t[i + 3]) * 16 + hexval(t[i + 4]);
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
      i += 4;
    } else {
      return std::nullopt;
    }
  }
  return out;
}

}  // namespace strata::cli
