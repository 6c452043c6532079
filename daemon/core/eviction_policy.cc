#include "daemon/core/eviction_policy.h"

#include <algorithm>

#include "daemon/core/block_pool.h"
#include "daemon/core/check.h"
#include "daemon/core/tenants.h"

namespace kvarn {

void LeafLru::Add(uint32_t id, uint32_t tenant, uint64_t last_use) {
  all_.emplace(last_use, id);
  by_tenant_[tenant].emplace(last_use, id);
}

void LeafLru::Remove(uint32_t id, uint32_t tenant, uint64_t last_use) {
  KVARN_CHECK(all_.erase({last_use, id}) == 1, "removing a leaf that is not listed");
  auto it = by_tenant_.find(tenant);
  KVARN_CHECK(it != by_tenant_.end() && it->second.erase({last_use, id}) == 1, "leaf listed under another tenant");
  if (it->second.empty()) by_tenant_.erase(it);
}

std::optional<uint32_t> LeafLru::Oldest() const {
  if (all_.empty()) return std::nullopt;
  return all_.begin()->second;
}

std::optional<uint32_t> LeafLru::OldestOf(uint32_t tenant) const {
  auto it = by_tenant_.find(tenant);
  if (it == by_tenant_.end()) return std::nullopt;
  return it->second.begin()->second;
}

std::optional<std::pair<uint64_t, uint32_t>> LeafLru::OldestAmong(std::span<const uint32_t> tenants) const {
  std::optional<std::pair<uint64_t, uint32_t>> best;
  for (uint32_t t : tenants) {
    auto it = by_tenant_.find(t);
    if (it == by_tenant_.end()) continue;
    if (!best || *it->second.begin() < *best) best = *it->second.begin();
  }
  return best;
}

std::vector<uint32_t> TenantsOverShare(const UsageLedger& usage, const TenantRegistry& tenants, uint64_t cache_capacity) {
  std::vector<uint32_t> over;
  const std::vector<TenantUsage>& all = usage.all();
  if (tenants.configured()) {
    uint64_t quotas = 0;
    for (uint32_t t = 0; t < tenants.size(); ++t) {
      if (tenants.get(t).configured) quotas += tenants.get(t).quota.max_cache_bytes;
    }
    for (uint32_t t = 0; t < all.size() && t < tenants.size(); ++t) {
      const Tenant& ten = tenants.get(t);
      // A removed tenant's leftovers have no share at all.
      const double share = !ten.configured || quotas == 0 ? 0.0
                                                          : static_cast<double>(cache_capacity) * static_cast<double>(ten.quota.max_cache_bytes) /
                                                                static_cast<double>(quotas);
      if (static_cast<double>(all[t].cache_bytes) > share) over.push_back(t);
    }
    return over;
  }
  size_t holders = 0;
  for (const TenantUsage& u : all) holders += u.cache_bytes > 0;
  if (holders < 2) return over;  // one tenant is never above its own whole pool
  const uint64_t share = cache_capacity / holders;
  for (uint32_t t = 0; t < all.size(); ++t) {
    if (all[t].cache_bytes > share) over.push_back(t);
  }
  return over;
}

namespace {

// Rules 2-3 within one class: the preferred tenants' oldest leaf, else the oldest of all.
std::optional<uint32_t> PickLeaf(const LeafLru& leaves, std::span<const uint32_t> prefer) {
  if (auto p = leaves.OldestAmong(prefer)) return p->second;
  return leaves.Oldest();
}

// The least recently used cached sink, of the preferred tenants first.
std::optional<uint32_t> OldestCachedSink(const BlockPool& sinks, std::span<const uint32_t> prefer) {
  std::optional<uint32_t> best, best_preferred;
  for (uint32_t id = 0; id < sinks.total(); ++id) {
    const BlockInfo& b = sinks.info(id);
    if (b.state != BlockState::kCached) continue;
    if (!best || b.last_use < sinks.info(*best).last_use) best = id;
    if (std::find(prefer.begin(), prefer.end(), b.tenant) != prefer.end() &&
        (!best_preferred || b.last_use < sinks.info(*best_preferred).last_use)) {
      best_preferred = id;
    }
  }
  return best_preferred ? best_preferred : best;
}

}  // namespace

std::vector<BlockRef> PlanPressureEviction(const PoolSet& pools, BlockClass cls, std::span<const uint32_t> prefer) {
  if (std::optional<uint32_t> leaf = PickLeaf(pools.pool(cls).leaves(), prefer)) return {BlockRef{cls, *leaf}};
  if (cls != BlockClass::kSink) return {};
  // Rule 4: a cached sink with its cached chain, leaves first. Every block of the chain is
  // cached (a holder of any of them would hold the sink), so the chain empties completely.
  const std::optional<uint32_t> sink = OldestCachedSink(pools.pool(BlockClass::kSink), prefer);
  if (!sink.has_value()) return {};
  const BlockPool& quant = pools.pool(BlockClass::kQuant);
  std::vector<uint32_t> chain;
  for (uint32_t id = 0; id < quant.total(); ++id) {
    const BlockInfo& b = quant.info(id);
    if ((b.state == BlockState::kActive || b.state == BlockState::kCached) && b.has_root && b.root == *sink) {
      KVARN_CHECK(b.state == BlockState::kCached, "a cached sink heads only cached blocks");
      chain.push_back(id);
    }
  }
  // Deeper blocks are children of shallower ones; leaves first means deepest first. A block's
  // depth is its parent chain length.
  auto depth = [&](uint32_t id) {
    int d = 0;
    for (BlockRef at{BlockClass::kQuant, id}; at.cls == BlockClass::kQuant && pools.info(at).has_parent; at = pools.info(at).parent) ++d;
    return d;
  };
  std::vector<std::pair<int, uint32_t>> by_depth;
  for (uint32_t id : chain) by_depth.emplace_back(depth(id), id);
  std::sort(by_depth.begin(), by_depth.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<BlockRef> plan;
  for (const auto& [d, id] : by_depth) plan.push_back(BlockRef{BlockClass::kQuant, id});
  plan.push_back(BlockRef{BlockClass::kSink, *sink});
  return plan;
}

std::optional<BlockRef> NextRequestedEviction(const PoolSet& pools, std::optional<uint32_t> tenant) {
  std::optional<std::pair<uint64_t, BlockRef>> best;
  for (BlockClass c : {BlockClass::kQuant, BlockClass::kSink}) {
    const LeafLru& leaves = pools.pool(c).leaves();
    const std::optional<uint32_t> id = tenant.has_value() ? leaves.OldestOf(*tenant) : leaves.Oldest();
    if (!id.has_value()) continue;
    const uint64_t last_use = pools.pool(c).info(*id).last_use;
    if (!best || last_use < best->first) best = std::make_pair(last_use, BlockRef{c, *id});
  }
  if (!best) return std::nullopt;
  return best->second;
}

}  // namespace kvarn
