#include "tests/chaos/protocol.h"

#include <chrono>
#include <cstdio>
#include <sstream>

#include "absl/strings/numbers.h"

namespace kvarn::chaos {

int64_t Line::Int(const std::string& key, int64_t def) const {
  auto it = fields.find(key);
  int64_t v = 0;
  if (it == fields.end() || !absl::SimpleAtoi(it->second, &v)) return def;
  return v;
}

uint64_t Line::U64(const std::string& key, uint64_t def) const {
  auto it = fields.find(key);
  uint64_t v = 0;
  if (it == fields.end() || !absl::SimpleAtoi(it->second, &v)) return def;
  return v;
}

std::string Line::Str(const std::string& key, const std::string& def) const {
  auto it = fields.find(key);
  return it == fields.end() ? def : it->second;
}

Line ParseLine(const std::string& text) {
  Line l;
  std::istringstream in(text);
  std::string word;
  bool first = true;
  while (in >> word) {
    const size_t eq = word.find('=');
    if (eq == std::string::npos) {
      if (first) l.word = word;
      first = false;
      continue;
    }
    first = false;
    std::string v = word.substr(eq + 1);
    if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
    l.fields[word.substr(0, eq)] = v;
  }
  return l;
}

void Say(const std::string& line) {
  const std::string s = line + "\n";
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

double NowMs() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

const char* CodeName(int code) {
  static constexpr const char* kNames[] = {"OK",
                                           "CANCELLED",
                                           "UNKNOWN",
                                           "INVALID_ARGUMENT",
                                           "DEADLINE_EXCEEDED",
                                           "NOT_FOUND",
                                           "ALREADY_EXISTS",
                                           "PERMISSION_DENIED",
                                           "RESOURCE_EXHAUSTED",
                                           "FAILED_PRECONDITION",
                                           "ABORTED",
                                           "OUT_OF_RANGE",
                                           "UNIMPLEMENTED",
                                           "INTERNAL",
                                           "UNAVAILABLE",
                                           "DATA_LOSS",
                                           "UNAUTHENTICATED"};
  return code >= 0 && code <= 16 ? kNames[code] : "?";
}

}  // namespace kvarn::chaos
