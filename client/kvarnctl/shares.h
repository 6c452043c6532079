// Percent shares that add up: the parts of a whole as percentages rounded to a fixed number
// of decimals such that, when the parts sum to the whole, the rounded shares sum to exactly
// 100 (largest-remainder rounding). `kvarnctl status` prints the pool's partition with it.
#ifndef KVARN_CLIENT_KVARNCTL_SHARES_H_
#define KVARN_CLIENT_KVARNCTL_SHARES_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace kvarn::ctl {

// Each part's share of `total` in units of 10^-decimals percent (decimals 0..6): with
// decimals = 2, 1234 means 12.34%. When the parts sum to `total`, each share is its exact
// value rounded down or up and the shares sum to exactly 100 * 10^decimals; the parts with
// the largest remainders are the ones rounded up (earlier parts first among equals).
// Otherwise each share is rounded to nearest on its own. REQUIRES: total > 0.
std::vector<int64_t> PercentShares(std::span<const uint64_t> parts, uint64_t total, int decimals);

// A share from PercentShares as text: FormatShare(1234, 2) == "12.34%".
std::string FormatShare(int64_t units, int decimals);

}  // namespace kvarn::ctl

#endif  // KVARN_CLIENT_KVARNCTL_SHARES_H_
