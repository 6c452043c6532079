#include "daemon/backends/slab_retention.h"

#include <signal.h>

#include <cerrno>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvarn {
namespace {

class SystemProbe final : public ProcessProbe {
 public:
  std::optional<uint64_t> Identity(int pid) const override {
    if (pid <= 0) return std::nullopt;
    std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
    std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (stat.empty()) {
      // No such process, or no /proc: fall back to a signal probe (start time unknown).
      if (kill(pid, 0) == 0 || errno == EPERM) return uint64_t{0};
      return std::nullopt;
    }
    // "pid (comm) state ppid ... starttime(22) ...": comm may hold spaces and parentheses.
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) return std::nullopt;
    std::istringstream rest(stat.substr(close + 1));
    std::string field;
    rest >> field;  // field 3: state
    if (field == "Z" || field == "X" || field == "x") return std::nullopt;  // exited, not reaped
    int index = 3;
    while (index < 22 && (rest >> field)) ++index;
    if (index != 22) return std::nullopt;
    uint64_t start = 0;
    if (!absl::SimpleAtoi(field, &start)) return std::nullopt;
    return start;
  }
};

}  // namespace

const ProcessProbe* ProcessProbe::System() {
  static const SystemProbe* probe = new SystemProbe();
  return probe;
}

}  // namespace kvarn
