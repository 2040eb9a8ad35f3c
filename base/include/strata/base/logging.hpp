// strata::base — minimal leveled logging to stderr.
// Level from STRATA_LOG_LEVEL (error|warn|info|debug; default warn), read once.
#pragma once

#include <string>
#include <string_view>

namespace strata {

enum class LogLevel : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

/// Current threshold (STRATA_LOG_LEVEL, cached at first use; set_log_level overrides).
LogLevel log_level() noexcept;
void set_log_level(LogLevel level) noexcept;

/// Writes "strata [warn] msg\n" to stderr when `level` <= log_level(), `msg` on one line
/// with control characters escaped (log_text()). Thread-safe.
void log(LogLevel level, std::string_view msg);
/// `msg` with newline and tab as `\n`, `\t` and other C0 controls (NUL included) and DEL as
/// `\xNN`; every other byte as it is.
std::string log_text(std::string_view msg);
inline void log_warn(std::string_view m) { log(LogLevel::kWarn, m); }
inline void log_info(std::string_view m) { log(LogLevel::kInfo, m); }
inline void log_debug(std::string_view m) { log(LogLevel::kDebug, m); }
inline void log_error(std::string_view m) { log(LogLevel::kError, m); }

/// Logs a warning only the first time `key` is seen in this process. Thread-safe.
void warn_once(std::string_view key, std::string_view msg);

}  // namespace strata
