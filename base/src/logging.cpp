#include "strata/base/logging.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>

#include "strata/base/env.hpp"

namespace strata {
namespace {
std::atomic<int> g_level{-1};
std::mutex g_mu;
}  // namespace

LogLevel log_level() noexcept {
  int l = g_level.load(std::memory_order_relaxed);
  if (l < 0) {
    std::string v = env_string("STRATA_LOG_LEVEL").value_or("warn");
    l = v == "error" ? 0 : v == "info" ? 2 : v == "debug" ? 3 : 1;
    g_level.store(l, std::memory_order_relaxed);
  }
  return static_cast<LogLevel>(l);
}

void set_log_level(LogLevel level) noexcept { g_level.store(static_cast<int>(level)); }

std::string log_text(std::string_view msg) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(msg.size());
  for (char ch : msg) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += ch;
    }
  }
  return out;
}

void log(LogLevel level, std::string_view msg) {
  if (static_cast<int>(level) > static_cast<int>(log_level())) return;
  static const char* names[] = {"error", "warn", "info", "debug"};
  // One line per message, whatever keys or paths it quotes: NUL would cut it short, and an
  // escape sequence in a key could move the cursor or recolor the terminal.
  const std::string text = log_text(msg);
  std::lock_guard<std::mutex> lk(g_mu);
  std::fprintf(stderr, "strata [%s] %s\n", names[static_cast<int>(level)], text.c_str());
}

void warn_once(std::string_view key, std::string_view msg) {
  static std::set<std::string, std::less<>> seen;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    if (!seen.emplace(key).second) return;
  }
  log_warn(msg);
}

}  // namespace strata
