#include "client/kvarnctl/shares.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

namespace kvarn::ctl {
namespace {

int64_t Pow10(int n) {
  int64_t p = 1;
  while (n-- > 0) p *= 10;
  return p;
}

}  // namespace

std::vector<int64_t> PercentShares(std::span<const uint64_t> parts, uint64_t total, int decimals) {
  decimals = std::clamp(decimals, 0, 6);
  const unsigned __int128 scale = static_cast<unsigned __int128>(100 * Pow10(decimals));
  std::vector<int64_t> shares(parts.size());
  std::vector<unsigned __int128> remainders(parts.size());
  unsigned __int128 sum = 0;
  for (uint64_t p : parts) sum += p;
  const bool whole = sum == total;
  int64_t assigned = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const unsigned __int128 x = static_cast<unsigned __int128>(parts[i]) * scale;
    shares[i] = static_cast<int64_t>(x / total);
    remainders[i] = x % total;
    if (!whole && 2 * remainders[i] >= total) ++shares[i];
    assigned += shares[i];
  }
  if (!whole) return shares;
  // The floors fall short of the scale by less than one unit per part.
  int64_t missing = static_cast<int64_t>(scale) - assigned;
  std::vector<size_t> order(parts.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return remainders[a] > remainders[b]; });
  for (size_t k = 0; k < order.size() && missing > 0; ++k) {
    if (remainders[order[k]] == 0) break;
    ++shares[order[k]];
    --missing;
  }
  return shares;
}

std::string FormatShare(int64_t units, int decimals) {
  decimals = std::clamp(decimals, 0, 6);
  const int64_t p = Pow10(decimals);
  const uint64_t u = units < 0 ? 0 - static_cast<uint64_t>(units) : static_cast<uint64_t>(units);
  char buf[48];
  if (decimals == 0) {
    std::snprintf(buf, sizeof buf, "%s%llu%%", units < 0 ? "-" : "", static_cast<unsigned long long>(u));
  } else {
    std::snprintf(buf, sizeof buf, "%s%llu.%0*llu%%", units < 0 ? "-" : "",
                  static_cast<unsigned long long>(u / static_cast<uint64_t>(p)), decimals,
                  static_cast<unsigned long long>(u % static_cast<uint64_t>(p)));
  }
  return buf;
}

}  // namespace kvarn::ctl
