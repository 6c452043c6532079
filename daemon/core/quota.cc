#include "daemon/core/quota.h"

#include "absl/strings/str_cat.h"

namespace kvarn {
namespace {

absl::Status Refuse(const std::string& tenant, QuotaLimit limit, TenantUsage& usage, uint64_t held, uint64_t wanted,
                    uint64_t max) {
  ++usage.rejected[static_cast<int>(limit)];
  return absl::ResourceExhaustedError(absl::StrCat("tenant '", tenant, "' is at its ", QuotaLimitName(limit),
                                                   " quota: holds ", held, ", asks for ", wanted, " more, limit ", max));
}

}  // namespace

const char* QuotaLimitName(QuotaLimit limit) {
  switch (limit) {
    case QuotaLimit::kSessions: return "sessions";
    case QuotaLimit::kTailSlots: return "tail_slots";
    case QuotaLimit::kCache: return "cache";
    case QuotaLimit::kWatchers: return "watchers";
  }
  return "?";
}

absl::Status CheckSessionQuota(const std::string& tenant, const TenantQuota& q, TenantUsage& u, uint32_t slots) {
  if (u.sessions + 1 > q.max_sessions) return Refuse(tenant, QuotaLimit::kSessions, u, u.sessions, 1, q.max_sessions);
  if (uint64_t{u.tail_slots} + slots > q.max_tail_slots) {
    return Refuse(tenant, QuotaLimit::kTailSlots, u, u.tail_slots, slots, q.max_tail_slots);
  }
  return absl::OkStatus();
}

absl::Status CheckCacheQuota(const std::string& tenant, const TenantQuota& q, TenantUsage& u, uint64_t bytes) {
  if (u.cache_bytes + bytes > q.max_cache_bytes) {
    return Refuse(tenant, QuotaLimit::kCache, u, u.cache_bytes, bytes, q.max_cache_bytes);
  }
  return absl::OkStatus();
}

absl::Status CheckWatchQuota(const std::string& tenant, const TenantQuota& q, TenantUsage& u) {
  if (u.watchers + 1 > q.max_watchers) return Refuse(tenant, QuotaLimit::kWatchers, u, u.watchers, 1, q.max_watchers);
  return absl::OkStatus();
}

}  // namespace kvarn
