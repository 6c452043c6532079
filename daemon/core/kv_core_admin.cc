// Allocation under pressure, eviction, watchers, statistics and the invariant checker.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "daemon/core/check.h"
#include "daemon/core/kv_core.h"

namespace kvarn {

absl::StatusOr<uint32_t> KvCore::AllocateBlock(BlockClass c, uint32_t tenant) {
  const BlockPool& pool = pools_.pool(c);
  const uint64_t bytes = pools_.block_bytes(c);
  const Tenant& t = tenants_.get(tenant);
  // Within its cache quota, a tenant gives up its own least recently used cached blocks first.
  while (usage_.of(tenant).cache_bytes + bytes > t.quota.max_cache_bytes) {
    const std::optional<BlockRef> own = NextRequestedEviction(pools_, tenant);
    if (!own.has_value()) break;
    EvictBlock(*own, EvictReason::kQuota);
  }
  if (absl::Status q = CheckCacheQuota(t.name, t.quota, usage_.of(tenant), bytes); !q.ok()) return q;
  while (pool.free_count() == 0) {
    if (!EvictForPressure(c, EvictReason::kAllocation)) {
      if (c == BlockClass::kQuant) {
        return absl::ResourceExhaustedError(absl::StrCat("no free quantized block: all ", pool.total(),
                                                         " are referenced; release or preempt a sequence"));
      }
      return absl::ResourceExhaustedError(absl::StrCat("no free sink block: all ", pool.total(),
                                                       " are referenced; release or preempt a sequence"));
    }
  }
  const std::optional<uint32_t> id = pools_.TakeFree(c, tenant);
  KVARN_CHECK(id.has_value(), "a free block is there after eviction");
  return *id;
}

bool KvCore::EvictForPressure(BlockClass c, EvictReason reason) {
  const uint64_t cache_capacity = uint64_t{pools_.pool(BlockClass::kQuant).total()} * pools_.block_bytes(BlockClass::kQuant) +
                                  uint64_t{pools_.pool(BlockClass::kSink).total()} * pools_.block_bytes(BlockClass::kSink);
  const std::vector<uint32_t> prefer = TenantsOverShare(usage_, tenants_, cache_capacity);
  const std::vector<BlockRef> plan = PlanPressureEviction(pools_, c, prefer);
  for (const BlockRef& b : plan) EvictBlock(b, reason);
  return !plan.empty();
}

void KvCore::EvictBlock(BlockRef b, EvictReason reason) {
  SpillBeforeEvict(b);
  const BlockInfo old = pools_.Evict(b);
  ++counters_.evictions[static_cast<int>(reason)];
  BlockEvent e;
  e.kind = BlockEvent::Kind::kRemoved;
  e.hash = old.hash;
  e.block = b.id;
  e.fp16 = b.cls == BlockClass::kSink;
  e.tenant = old.tenant;
  events_.Append(e);
  if (observer_ != nullptr) observer_->OnEvict(reason, 1);
}

void KvCore::ApplyWatermark(BlockClass c) {
  const BlockPool& pool = pools_.pool(c);
  const auto used = [&] { return static_cast<double>(pool.total() - pool.free_count()); };
  if (used() <= config_.high_watermark * pool.total()) return;
  while (used() > config_.low_watermark * pool.total()) {
    if (!EvictForPressure(c, EvictReason::kWatermark)) break;
  }
}

absl::StatusOr<EvictResult> KvCore::Evict(const SessionRef& ref, EvictScope scope, uint64_t bytes, const std::string& tenant) {
  Locked lock(this);
  auto s = sessions_.Find(ref);
  if (!s.ok()) return s.status();
  const SessionState& session = **s;
  std::optional<uint32_t> only;
  if (scope == EvictScope::kTenant) {
    if (tenant.empty() || tenant == tenants_.get(session.tenant).name) {
      only = session.tenant;
    } else if (!session.admin) {
      return absl::PermissionDeniedError("evicting another tenant's blocks needs the admin token");
    } else {
      const std::optional<uint32_t> id = tenants_.Find(tenant);
      if (!id.has_value()) return EvictResult{};
      only = *id;
    }
  } else if (!session.admin) {
    return absl::PermissionDeniedError("evicting by bytes or all blocks needs the admin token");
  }
  EvictResult r;
  while (scope != EvictScope::kBytes || r.bytes < bytes) {
    const std::optional<BlockRef> victim = NextRequestedEviction(pools_, only);
    if (!victim.has_value()) break;
    EvictBlock(*victim, EvictReason::kRequest);
    ++r.blocks;
    r.bytes += pools_.block_bytes(victim->cls);
  }
  return r;
}

absl::StatusOr<WatchGrant> KvCore::AcquireWatcher(const SessionRef& ref) {
  Locked lock(this);
  auto s = sessions_.Find(ref);
  if (!s.ok()) return s.status();
  SessionState& session = **s;
  if (watchers_ >= config_.max_watchers) {
    return absl::ResourceExhaustedError(absl::StrCat("all ", config_.max_watchers, " Watch streams of this daemon are in use (max_watchers)"));
  }
  const Tenant& t = tenants_.get(session.tenant);
  if (absl::Status q = CheckWatchQuota(t.name, t.quota, usage_.of(session.tenant)); !q.ok()) return q;
  ++usage_.of(session.tenant).watchers;
  ++session.watchers;
  ++watchers_;
  return WatchGrant{session.admin, session.tenant};
}

void KvCore::ReleaseWatcher(SessionId id) {
  Locked lock(this);
  SessionState* s = sessions_.Get(id);
  // A session that ended took its watchers' grants with it (EndSession).
  if (s == nullptr || s->watchers == 0) return;
  --s->watchers;
  --usage_.of(s->tenant).watchers;
  --watchers_;
}

absl::StatusOr<CoreStats> KvCore::Stats(std::optional<SessionRef> ref) const {
  MutexLock lock(&mu_);
  bool admin = true;
  uint32_t tenant = 0;
  if (ref.has_value()) {
    auto s = sessions_.Find(*ref);
    if (!s.ok()) return s.status();
    admin = (*s)->admin;
    tenant = (*s)->tenant;
  }
  CoreStats st = counters_;
  st.quant_block_bytes = layout_.quant_block_bytes();
  st.fp16_block_bytes = layout_.fp16_block_bytes();
  st.tile_tokens = static_cast<uint32_t>(preset_.tile_tokens);
  st.whatif_hit_tokens = whatif_.hit_tokens();
  const BlockPool& qp = pools_.pool(BlockClass::kQuant);
  const BlockPool& sp = pools_.pool(BlockClass::kSink);
  st.quant_total = qp.total();
  st.quant_free = qp.free_count();
  st.quant_active = qp.count(BlockState::kActive);
  st.quant_cached = qp.count(BlockState::kCached);
  st.quant_sealing = qp.count(BlockState::kSealing);
  st.sink_total = sp.total();
  st.sink_free = sp.free_count();
  st.sink_active = sp.count(BlockState::kActive);
  st.sink_cached = sp.count(BlockState::kCached);
  st.sink_sealing = sp.count(BlockState::kSealing);
  st.tail_slots_budget = tail_budget_;
  st.tail_slots_reserved = sessions_.tail_slots_reserved();
  st.retained_bytes = backend_->RetainedBytes();
  st.huge_page_bytes = {backend_->HugePageBytes(RegionKind::kQuant), backend_->HugePageBytes(RegionKind::kSink),
                        backend_->HugePageBytes(RegionKind::kTail)};
  st.huge_page_fallbacks = backend_->HugePageFallbacks();
  st.quant_capacity_bytes = uint64_t{qp.total()} * layout_.quant_block_bytes();
  st.fp16_capacity_bytes = (uint64_t{sp.total()} + tail_budget_) * layout_.fp16_block_bytes();
  st.capacity_bytes = config_.capacity_bytes;
  st.sessions = sessions_.live_count();
  st.client_sessions = sessions_.live_count() - sessions_.observer_count();
  st.draining = draining_;
  st.sequences = static_cast<uint32_t>(sequences_.size());
  st.epoch = epoch_;
  st.tiers = TierReports();
  for (const SessionState* s : sessions_.Live()) {
    if (!admin && s->tenant != tenant) continue;
    SessionStats info;
    info.id = s->id;
    info.tenant = tenants_.get(s->tenant).name;
    info.client_name = s->client_name;
    info.sequences = static_cast<uint32_t>(s->sequences.size());
    info.tail_slots = s->slots;
    info.connected = s->streams > 0;
    st.session_info.push_back(std::move(info));
  }
  std::sort(st.session_info.begin(), st.session_info.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  if (tenants_.configured()) {
    for (uint32_t t = 0; t < tenants_.size(); ++t) {
      const Tenant& ten = tenants_.get(t);
      if (!ten.configured || (!admin && t != tenant)) continue;
      TenantReport r;
      r.name = ten.name;
      r.configured = true;
      r.quota = ten.quota;
      if (t < usage_.all().size()) r.usage = usage_.all()[t];
      st.tenants.push_back(std::move(r));
    }
  }
  return st;
}

absl::StatusOr<std::vector<SequenceStats>> KvCore::ListSequences(const SessionRef& ref) const {
  MutexLock lock(&mu_);
  auto s = sessions_.Find(ref);
  if (!s.ok()) return s.status();
  std::vector<SequenceStats> out;
  for (const auto& [id, q] : sequences_) {
    const SessionState* owner = sessions_.Get(q.session);
    if (!(*s)->admin && owner->tenant != (*s)->tenant) continue;
    SequenceStats st;
    st.id = id;
    st.session = q.session;
    st.tenant = tenants_.get(owner->tenant).name;
    st.tokens = q.tokens;
    st.quant_blocks = static_cast<uint32_t>(q.quant.size());
    st.has_sink = q.has_sink;
    st.tail_tokens = q.tail_tokens;
    out.push_back(std::move(st));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  return out;
}

absl::Status KvCore::CheckInvariants() const {
  MutexLock lock(&mu_);
  if (absl::Status s = pools_.CheckInvariants(); !s.ok()) return s;
  // Every reference belongs to a sequence (or an in-flight append of one).
  std::vector<uint32_t> refs[2] = {std::vector<uint32_t>(pools_.pool(BlockClass::kQuant).total(), 0),
                                   std::vector<uint32_t>(pools_.pool(BlockClass::kSink).total(), 0)};
  uint32_t reserved = 0, live = 0, watchers = 0;
  std::vector<TenantUsage> expect(usage_.all().size());
  for (const auto& [id, s] : sessions_.all()) {
    reserved += s.slots;
    if (s.tenant >= expect.size()) expect.resize(s.tenant + 1);
    expect[s.tenant].tail_slots += s.slots;
    if (!s.closing) {
      ++live;
      ++expect[s.tenant].sessions;
    }
    expect[s.tenant].watchers += s.watchers;
    watchers += s.watchers;
    if (s.closing && s.watchers != 0) return absl::InternalError(absl::StrCat("closing session ", id, " holds watchers"));
    std::vector<bool> used(s.slots, false);
    for (uint32_t slot : s.free_slots) {
      if (slot >= s.slots || used[slot]) return absl::InternalError(absl::StrCat("session ", id, ": free slot list corrupt"));
      used[slot] = true;
    }
    size_t in_use = 0;
    bool any_busy = false;
    for (SequenceId q : s.sequences) {
      auto it = sequences_.find(q);
      if (it == sequences_.end() || it->second.session != id) {
        return absl::InternalError(absl::StrCat("session ", id, " lists missing sequence ", q));
      }
      if (used[it->second.tail_slot]) return absl::InternalError(absl::StrCat("sequence ", q, " shares tail slot ", it->second.tail_slot));
      used[it->second.tail_slot] = true;
      ++in_use;
      any_busy |= it->second.busy;
    }
    if (in_use + s.free_slots.size() != s.slots) return absl::InternalError(absl::StrCat("session ", id, ": tail slots leak"));
    if (s.closing && !s.sequences.empty() && !any_busy) {
      return absl::InternalError(absl::StrCat("closing session ", id, " keeps idle sequences"));
    }
  }
  // Sessions between reservation and creation hold reserved slots and a session count.
  for (const auto& [id, o] : opening_) {
    reserved += o.slots;
    if (o.tenant >= expect.size()) expect.resize(o.tenant + 1);
    expect[o.tenant].tail_slots += o.slots;
    ++expect[o.tenant].sessions;
  }
  if (reserved != sessions_.tail_slots_reserved()) return absl::InternalError("reserved tail slot count drifted");
  if (reserved > tail_budget_) return absl::InternalError("tail slots reserved exceed the tail budget");
  if (live != sessions_.live_count()) return absl::InternalError("live session count drifted");
  if (watchers != watchers_) return absl::InternalError("watcher count drifted");
  for (size_t t = 0; t < expect.size(); ++t) {
    const TenantUsage have = t < usage_.all().size() ? usage_.all()[t] : TenantUsage{};
    if (have.sessions != expect[t].sessions || have.tail_slots != expect[t].tail_slots || have.watchers != expect[t].watchers) {
      return absl::InternalError(absl::StrCat("tenant ", t, " usage drifted: sessions ", have.sessions, "/", expect[t].sessions,
                                              " tail slots ", have.tail_slots, "/", expect[t].tail_slots, " watchers ",
                                              have.watchers, "/", expect[t].watchers));
    }
  }
  const uint64_t g = static_cast<uint64_t>(preset_.tile_tokens);
  for (const auto& [id, q] : sequences_) {
    const SessionState* owner = sessions_.Get(q.session);
    if (owner == nullptr || !owner->sequences.contains(id)) {
      return absl::InternalError(absl::StrCat("sequence ", id, " has no owning session"));
    }
    if (q.tokens != q.sealed_tiles() * g + q.tail_tokens || q.tail_tokens >= g || q.tail_ids.size() != q.tail_tokens) {
      return absl::InternalError(absl::StrCat("sequence ", id, ": token counts disagree"));
    }
    if (q.has_sink) ++refs[1][q.sink];
    for (uint32_t b : q.quant) ++refs[0][b];
    if (q.pending) ++refs[static_cast<int>(q.pending->cls)][q.pending->id];
    if (q.pending && !q.busy) return absl::InternalError(absl::StrCat("sequence ", id, " holds a pending block while idle"));
  }
  for (BlockClass c : {BlockClass::kQuant, BlockClass::kSink}) {
    const BlockPool& p = pools_.pool(c);
    for (uint32_t b = 0; b < p.total(); ++b) {
      if (p.info(b).refs != refs[static_cast<int>(c)][b]) {
        return absl::InternalError(absl::StrCat(c == BlockClass::kQuant ? "quant" : "sink", " block ", b, " has ", p.info(b).refs,
                                                " references but sequences hold ", refs[static_cast<int>(c)][b]));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace kvarn
