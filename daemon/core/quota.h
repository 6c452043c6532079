// Per-tenant quotas: what each tenant holds, and the rule that decides whether it may hold
// more. Every quota decision of the daemon is made by one of the Check functions below.
//
// Limits (hard; a request that would pass one fails with RESOURCE_EXHAUSTED naming it, and
// changes nothing):
//   sessions    sessions open at once, observer sessions included;
//   tail_slots  tail slots reserved by all the tenant's sessions (the fp16 tail budget);
//   cache       bytes of sealed blocks charged to the tenant: every quantized or sink block it
//               sealed (a block is charged to the tenant whose append sealed it) while the
//               block is sealing, referenced or cached. Adopting a cached block charges
//               nothing; a block leaves the charge when it is evicted;
//   watchers    Watch streams open at once.
// A tenant at its cache limit first loses its own least recently used cached blocks (the
// append then proceeds); only when it has none left does the append fail.
#ifndef KVARN_DAEMON_CORE_QUOTA_H_
#define KVARN_DAEMON_CORE_QUOTA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace kvarn {

struct TenantQuota {
  uint32_t max_sessions = 0;
  uint32_t max_tail_slots = 0;
  uint64_t max_cache_bytes = 0;
  uint32_t max_watchers = 0;
};

// Quotas of tenants that do not set their own.
struct QuotaDefaults {
  uint32_t max_sessions = 256;
  uint32_t max_watchers = 16;
  uint32_t tail_slots_total = 0;   // the pool's tail budget: an unconfigured label may use all
  uint64_t cache_bytes_total = 0;  // the pool's sealed-block bytes: likewise
};

enum class QuotaLimit { kSessions = 0, kTailSlots = 1, kCache = 2, kWatchers = 3 };
inline constexpr int kQuotaLimits = 4;
const char* QuotaLimitName(QuotaLimit limit);  // "sessions", "tail_slots", "cache", "watchers"

struct TenantUsage {
  uint32_t sessions = 0;
  uint32_t tail_slots = 0;
  uint64_t cache_bytes = 0;
  uint32_t watchers = 0;
  uint64_t rejected[kQuotaLimits] = {0, 0, 0, 0};  // requests refused, by limit
};

// Usage of every tenant id, grown on demand.
class UsageLedger {
 public:
  TenantUsage& of(uint32_t tenant) {
    if (tenant >= usage_.size()) usage_.resize(tenant + 1);
    return usage_[tenant];
  }
  const std::vector<TenantUsage>& all() const { return usage_; }

 private:
  std::vector<TenantUsage> usage_;
};

// OK if `tenant` may open one more session with `slots` tail slots; else RESOURCE_EXHAUSTED
// naming the limit, and the rejection is counted in `usage`.
absl::Status CheckSessionQuota(const std::string& tenant, const TenantQuota& q, TenantUsage& usage, uint32_t slots);
// OK if `tenant` may be charged `bytes` more of sealed blocks.
absl::Status CheckCacheQuota(const std::string& tenant, const TenantQuota& q, TenantUsage& usage, uint64_t bytes);
// OK if `tenant` may open one more Watch stream.
absl::Status CheckWatchQuota(const std::string& tenant, const TenantQuota& q, TenantUsage& usage);

}  // namespace kvarn

#endif  // KVARN_DAEMON_CORE_QUOTA_H_
