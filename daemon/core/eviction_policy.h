// Which cached blocks leave, and in which order. The whole eviction rule lives here:
//
//  1. Only cached leaves are candidates: an unreferenced block that no other indexed block
//     names as its parent (a radix tree's LRU: children go before their parents). Blocks a
//     sequence holds are never on the candidate lists at all (LeafLru), so nothing here can
//     reach them.
//  2. Among candidates, the least recently used (last release or adoption) goes first.
//  3. Under memory pressure (an allocation or the watermark), candidates of tenants holding
//     more than their cache share go before everyone else's; the share of a configured
//     tenant is its cache quota's fraction of all configured quotas times the pool, of an
//     unconfigured label the pool divided by the tenants holding blocks.
//  4. A sink block is needed and no sink is a leaf: every cached sink heads a chain of cached
//     quantized blocks (a sequence holding any block of a chain holds the whole chain up to
//     it, sink included). The least recently used cached sink (of the preferred tenants
//     first) is freed together with its chain, the chain's leaves first.
// An Evict request by tenant or bytes follows 1 and 2 only, across both classes.
#ifndef KVARN_DAEMON_CORE_EVICTION_POLICY_H_
#define KVARN_DAEMON_CORE_EVICTION_POLICY_H_

#include <cstdint>
#include <optional>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "daemon/core/block_ref.h"
#include "daemon/core/quota.h"

namespace kvarn {

class PoolSet;
class TenantRegistry;

// The evictable leaves of one block class, ordered by last use, overall and per tenant.
class LeafLru {
 public:
  void Add(uint32_t id, uint32_t tenant, uint64_t last_use);
  void Remove(uint32_t id, uint32_t tenant, uint64_t last_use);
  bool Contains(uint32_t id, uint64_t last_use) const { return all_.contains({last_use, id}); }
  size_t size() const { return all_.size(); }

  std::optional<uint32_t> Oldest() const;
  std::optional<uint32_t> OldestOf(uint32_t tenant) const;
  // The oldest leaf of any of `tenants`, with its last use.
  std::optional<std::pair<uint64_t, uint32_t>> OldestAmong(std::span<const uint32_t> tenants) const;
  // Leaves oldest first, for scans with a condition of their own.
  const std::set<std::pair<uint64_t, uint32_t>>& ordered() const { return all_; }

 private:
  std::set<std::pair<uint64_t, uint32_t>> all_;  // (last_use, id)
  absl::flat_hash_map<uint32_t, std::set<std::pair<uint64_t, uint32_t>>> by_tenant_;
};

// Rule 3: tenants above their cache share of `cache_capacity` bytes.
std::vector<uint32_t> TenantsOverShare(const UsageLedger& usage, const TenantRegistry& tenants, uint64_t cache_capacity);

// Rules 1-4 for freeing one block of class `cls` under pressure: the blocks to evict, in
// order (empty when nothing is evictable). `prefer` comes from TenantsOverShare.
std::vector<BlockRef> PlanPressureEviction(const PoolSet& pools, BlockClass cls, std::span<const uint32_t> prefer);

// Rules 1-2 for an Evict request: the next block to evict of either class, optionally of one
// tenant only; nullopt when none is left.
std::optional<BlockRef> NextRequestedEviction(const PoolSet& pools, std::optional<uint32_t> tenant);

}  // namespace kvarn

#endif  // KVARN_DAEMON_CORE_EVICTION_POLICY_H_
