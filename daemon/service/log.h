// Structured logs: one line per event on stderr, logfmt style
//   ts=2026-11-29T13:55:01.123Z level=info event=session_open session=3 tenant="alice"
// so they are greppable by people and parseable by log shippers.
#ifndef KVARN_DAEMON_SERVICE_LOG_H_
#define KVARN_DAEMON_SERVICE_LOG_H_

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvarn {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void SetLogLevel(LogLevel level);
bool ParseLogLevel(std::string_view s, LogLevel* out);

// A field value already rendered; strings are quoted when they need it.
struct LogValue {
  LogValue(std::string_view s);  // NOLINT: implicit by design
  LogValue(const std::string& s) : LogValue(std::string_view(s)) {}  // NOLINT
  LogValue(const char* s) : LogValue(std::string_view(s)) {}          // NOLINT
  template <typename T, typename = std::enable_if_t<std::is_arithmetic_v<T>>>
  LogValue(T v) : text(absl::StrCat(v)) {}  // NOLINT
  std::string text;
};

void Log(LogLevel level, std::string_view event,
         std::initializer_list<std::pair<std::string_view, LogValue>> fields = {});

}  // namespace kvarn

#endif  // KVARN_DAEMON_SERVICE_LOG_H_
