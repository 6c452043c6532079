#include "common/units.h"

#include <cstdio>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvarn {

absl::StatusOr<uint64_t> ParseBytes(absl::string_view text) {
  static constexpr std::pair<absl::string_view, uint64_t> kUnits[] = {
      {"KiB", 1ull << 10}, {"MiB", 1ull << 20}, {"GiB", 1ull << 30}, {"TiB", 1ull << 40},
      {"KB", 1000ull},     {"MB", 1000000ull},  {"GB", 1000000000ull}, {"TB", 1000000000000ull},
      {"B", 1}};
  absl::string_view number = text;
  uint64_t scale = 1;
  for (const auto& [unit, m] : kUnits) {
    if (absl::EndsWith(text, unit)) {
      number = text.substr(0, text.size() - unit.size());
      scale = m;
      break;
    }
  }
  const auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a size such as 512MiB or 4096"));
  };
  uint64_t whole = 0;
  if (absl::SimpleAtoi(number, &whole)) {
    if (whole == 0 || whole > UINT64_MAX / scale) return bad();
    return whole * scale;
  }
  double x = 0;
  if (!absl::SimpleAtod(number, &x) || !(x > 0) || x * static_cast<double>(scale) >= 1.8e19) return bad();
  const uint64_t bytes = static_cast<uint64_t>(x * static_cast<double>(scale));
  if (bytes == 0) return bad();
  return bytes;
}

std::string FormatBytes(double bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", bytes, kUnits[u]);
  return buf;
}

}  // namespace kvarn
