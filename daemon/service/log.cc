#include "daemon/service/log.h"

#include <atomic>
#include <cstdio>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvarn {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
}  // namespace

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }

bool ParseLogLevel(std::string_view s, LogLevel* out) {
  if (s == "debug") *out = LogLevel::kDebug;
  else if (s == "info") *out = LogLevel::kInfo;
  else if (s == "warning") *out = LogLevel::kWarning;
  else if (s == "error") *out = LogLevel::kError;
  else return false;
  return true;
}

LogValue::LogValue(std::string_view s) {
  bool quote = s.empty();
  for (char c : s) quote |= (c == ' ' || c == '"' || c == '=' || c == '\\' || c < 0x20);
  text.reserve(s.size() + 2);
  if (quote) text.push_back('"');
  for (char c : s) {
    if (quote && (c == '"' || c == '\\')) text.push_back('\\');
    if (quote && c == '\n') {
      text.push_back('\\');
      text.push_back('n');
      continue;
    }
    text.push_back(c);
  }
  if (quote) text.push_back('"');
}

void Log(LogLevel level, std::string_view event,
         std::initializer_list<std::pair<std::string_view, LogValue>> fields) {
  if (static_cast<int>(level) < g_level.load()) return;
  static constexpr const char* kNames[] = {"debug", "info", "warning", "error"};
  std::string line = absl::StrCat("ts=", absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()),
                                  " level=", kNames[static_cast<int>(level)], " event=",
                                  absl::string_view(event.data(), event.size()));
  for (const auto& [k, v] : fields) absl::StrAppend(&line, " ", absl::string_view(k.data(), k.size()), "=", v.text);
  absl::StrAppend(&line, "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace kvarn
