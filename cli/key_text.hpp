// strata CLI: terminal-safe text for keys and for messages that hold keys.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace strata::cli {

/// Text form of a key (or of a message holding keys) for a terminal: the bytes of valid,
/// printable UTF-8 as they are; `\` as `\\`; tab, newline, carriage return as `\t`, `\n`,
/// `\r`; other C0 controls (NUL included) and DEL as `\xNN`; C1 controls (U+0080-U+009F)
/// as `\u00NN`; bytes that are not valid UTF-8 as `\xNN`. So a key holding NUL prints whole
/// ("a\x00b", where printf("%s") would stop at the NUL) and no key can move the cursor or
/// recolor the terminal. unescape_key() inverts it.
/// With escape_backslash=false (error messages): `\` stays as it is, the rest as above
/// (the result then no longer reads back with unescape_key()).
std::string escape_key(std::string_view k, bool escape_backslash = true);

/// Inverse of escape_key(): `\\`, `\t`, `\n`, `\r`, `\xNN`, `\u00NN`; nullopt when `t`
/// holds another backslash sequence (so it is not an escaped key).
std::optional<std::string> unescape_key(std::string_view t);

}  // namespace strata::cli
