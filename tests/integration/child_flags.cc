#include "tests/integration/child_flags.h"

#include <cstdio>

#include "absl/strings/numbers.h"

namespace kvarn::it {

ChildFlags ParseChildFlags(int argc, char** argv, int first) {
  ChildFlags f;
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) continue;
    a = a.substr(2);
    const size_t eq = a.find('=');
    f[a.substr(0, eq)] = eq == std::string::npos ? "1" : a.substr(eq + 1);
  }
  return f;
}

std::string Flag(const ChildFlags& f, const std::string& key, const std::string& def) {
  auto it = f.find(key);
  return it == f.end() ? def : it->second;
}

uint64_t FlagU64(const ChildFlags& f, const std::string& key, uint64_t def) {
  uint64_t v = def;
  auto it = f.find(key);
  if (it != f.end() && !absl::SimpleAtoi(it->second, &v)) v = def;
  return v;
}

void Say(const std::string& line) {
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

}  // namespace kvarn::it
