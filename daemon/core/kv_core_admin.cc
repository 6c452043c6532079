// Allocation and eviction, statistics and the invariant checker.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "daemon/core/kv_core.h"

namespace kvarn {

std::optional<uint32_t> KvCore::AllocateBlock(BlockClass c) {
  BlockPool& pool = pools_.pool(c);
  if (pool.total() == 0) return std::nullopt;
  // Sink blocks share the fp16 budget with the sessions' reserved tail slots.
  while (pool.free_count() == 0 || (c == BlockClass::kSink && Fp16SlotsInUse() >= fp16_budget_)) {
    if (!EvictOne(c, EvictReason::kAllocation, std::nullopt)) return std::nullopt;
  }
  return pool.TakeFree();
}

bool KvCore::EvictOne(BlockClass c, EvictReason reason, std::optional<uint32_t> tenant) {
  const std::optional<uint32_t> victim = pools_.pool(c).EvictionCandidate(tenant);
  if (victim.has_value()) {
    EvictBlock({c, *victim}, reason);
    return true;
  }
  if (c != BlockClass::kSink) return false;
  // Every cached sink heads a chain of cached quantized blocks (a sequence holding any block
  // of a chain holds all of it, sink included). Free the least recently used one: its chain
  // goes first, leaves first, then the sink itself.
  const std::optional<uint32_t> sink = pools_.pool(BlockClass::kSink).OldestCached(tenant);
  if (!sink.has_value()) return false;
  while (pools_.pool(BlockClass::kSink).info(*sink).children > 0) {
    const std::optional<uint32_t> leaf = pools_.pool(BlockClass::kQuant).EvictionCandidateUnder(*sink);
    if (!leaf.has_value()) return false;  // unreachable while the invariants hold
    EvictBlock({BlockClass::kQuant, *leaf}, reason);
  }
  EvictBlock({BlockClass::kSink, *sink}, reason);
  return true;
}

void KvCore::EvictBlock(BlockRef b, EvictReason reason) {
  const BlockInfo old = pools_.Evict(b);
  if (b.cls == BlockClass::kSink) {
    // The sink region is sized for the whole fp16 share; give freed pages back so resident
    // memory stays within the capacity while tail slots use that share.
    sink_region_->Discard(static_cast<size_t>(b.id) * layout_.fp16_block_bytes(), layout_.fp16_block_bytes());
  }
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
  BlockPool& pool = pools_.pool(c);
  const auto used = [&] { return static_cast<double>(pool.total() - pool.free_count()); };
  if (used() <= config_.high_watermark * pool.total()) return;
  while (used() > config_.low_watermark * pool.total()) {
    if (!EvictOne(c, EvictReason::kWatermark, std::nullopt)) break;
  }
}

absl::StatusOr<EvictResult> KvCore::Evict(SessionRef ref, EvictScope scope, uint64_t bytes,
                                          const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  auto s = FindSession(ref);
  if (!s.ok()) return s.status();
  const Session& session = **s;
  std::optional<uint32_t> only;
  if (scope == EvictScope::kTenant) {
    if (tenant.empty() || tenant == tenants_[session.tenant].name) {
      only = session.tenant;
    } else if (!session.admin) {
      return absl::PermissionDeniedError("evicting another tenant's blocks needs the admin token");
    } else {
      auto it = tenant_ids_.find(tenant);
      if (it == tenant_ids_.end()) return EvictResult{};
      only = it->second;
    }
  } else if (!session.admin) {
    return absl::PermissionDeniedError("evicting by bytes or all blocks needs the admin token");
  }
  EvictResult r;
  for (;;) {
    if (scope == EvictScope::kBytes && r.bytes >= bytes) break;
    // The older of the two pools' least recently used leaves goes first.
    const std::optional<uint32_t> q = pools_.pool(BlockClass::kQuant).EvictionCandidate(only);
    const std::optional<uint32_t> k = pools_.pool(BlockClass::kSink).EvictionCandidate(only);
    if (!q && !k) break;
    BlockRef victim{BlockClass::kQuant, q.value_or(0)};
    if (!q || (k && pools_.pool(BlockClass::kSink).info(*k).last_use < pools_.pool(BlockClass::kQuant).info(*q).last_use)) {
      victim = BlockRef{BlockClass::kSink, *k};
    }
    EvictBlock(victim, EvictReason::kRequest);
    ++r.blocks;
    r.bytes += BlockBytes(victim.cls);
  }
  return r;
}

absl::StatusOr<CoreStats> KvCore::Stats(std::optional<SessionRef> ref) const {
  absl::MutexLock lock(&mu_);
  bool admin = true;
  uint32_t tenant = 0;
  if (ref.has_value()) {
    auto s = const_cast<KvCore*>(this)->FindSession(*ref);
    if (!s.ok()) return s.status();
    admin = (*s)->admin;
    tenant = (*s)->tenant;
  }
  CoreStats st = counters_;
  st.quant_block_bytes = layout_.quant_block_bytes();
  st.fp16_block_bytes = layout_.fp16_block_bytes();
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
  st.fp16_slots_budget = fp16_budget_;
  st.tail_slots_reserved = tail_slots_reserved_;
  st.quant_capacity_bytes = uint64_t{qp.total()} * layout_.quant_block_bytes();
  st.fp16_capacity_bytes = uint64_t{fp16_budget_} * layout_.fp16_block_bytes();
  st.capacity_bytes = config_.capacity_bytes;
  st.sequences = static_cast<uint32_t>(sequences_.size());
  st.epoch = epoch_;
  for (const auto& [id, s] : sessions_) {
    if (s.closing) continue;
    ++st.sessions;
    if (!admin && s.tenant != tenant) continue;
    SessionStats info;
    info.id = id;
    info.tenant = tenants_[s.tenant].name;
    info.client_name = s.client_name;
    info.sequences = static_cast<uint32_t>(s.sequences.size());
    info.tail_slots = s.slots;
    info.connected = s.streams > 0;
    st.session_info.push_back(std::move(info));
  }
  std::sort(st.session_info.begin(), st.session_info.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  return st;
}

absl::StatusOr<std::vector<SequenceStats>> KvCore::ListSequences(SessionRef ref) const {
  absl::MutexLock lock(&mu_);
  auto s = const_cast<KvCore*>(this)->FindSession(ref);
  if (!s.ok()) return s.status();
  std::vector<SequenceStats> out;
  for (const auto& [id, q] : sequences_) {
    const Session& owner = sessions_.at(q.session);
    if (!(*s)->admin && owner.tenant != (*s)->tenant) continue;
    SequenceStats st;
    st.id = id;
    st.session = q.session;
    st.tenant = tenants_[owner.tenant].name;
    st.tokens = q.tokens;
    st.quant_blocks = static_cast<uint32_t>(q.quant.size());
    st.has_sink = q.has_sink;
    st.tail_tokens = q.tail_tokens;
    out.push_back(std::move(st));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  return out;
}

absl::StatusOr<std::pair<bool, uint32_t>> KvCore::WatchScope(SessionRef ref) const {
  absl::MutexLock lock(&mu_);
  auto s = const_cast<KvCore*>(this)->FindSession(ref);
  if (!s.ok()) return s.status();
  return std::make_pair((*s)->admin, (*s)->tenant);
}

absl::Status KvCore::CheckInvariants() const {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = pools_.CheckInvariants(); !s.ok()) return s;
  // Every reference belongs to a sequence (or an in-flight append of one).
  std::vector<uint32_t> refs[2] = {std::vector<uint32_t>(pools_.pool(BlockClass::kQuant).total(), 0),
                                   std::vector<uint32_t>(pools_.pool(BlockClass::kSink).total(), 0)};
  uint32_t reserved = 0;
  for (const auto& [id, s] : sessions_) {
    reserved += s.slots;
    std::vector<bool> used(s.slots, false);
    for (uint32_t slot : s.free_slots) {
      if (slot >= s.slots || used[slot]) return absl::InternalError(absl::StrCat("session ", id, ": free slot list corrupt"));
      used[slot] = true;
    }
    size_t live = 0;
    for (SequenceId q : s.sequences) {
      auto it = sequences_.find(q);
      if (it == sequences_.end() || it->second.session != id) return absl::InternalError(absl::StrCat("session ", id, " lists missing sequence ", q));
      if (used[it->second.tail_slot]) return absl::InternalError(absl::StrCat("sequence ", q, " shares tail slot ", it->second.tail_slot));
      used[it->second.tail_slot] = true;
      ++live;
    }
    if (live + s.free_slots.size() != s.slots) return absl::InternalError(absl::StrCat("session ", id, ": tail slots leak"));
    bool any_busy = false;
    for (SequenceId q : s.sequences) any_busy |= sequences_.at(q).busy;
    if (s.closing && !s.sequences.empty() && !any_busy) {
      return absl::InternalError(absl::StrCat("closing session ", id, " keeps idle sequences"));
    }
  }
  if (reserved != tail_slots_reserved_) return absl::InternalError("reserved tail slot count drifted");
  if (Fp16SlotsInUse() > fp16_budget_) return absl::InternalError("fp16 blocks in use exceed the fp16 share");
  const uint64_t g = static_cast<uint64_t>(preset_.tile_tokens);
  for (const auto& [id, q] : sequences_) {
    if (!sessions_.contains(q.session) || !sessions_.at(q.session).sequences.contains(id)) {
      return absl::InternalError(absl::StrCat("sequence ", id, " has no owning session"));
    }
    const uint64_t sealed = (q.has_sink ? 1 : 0) + q.quant.size();
    if (q.tokens != sealed * g + q.tail_tokens || q.tail_tokens >= g || q.tail_ids.size() != q.tail_tokens) {
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
        return absl::InternalError(absl::StrCat(c == BlockClass::kQuant ? "quant" : "sink", " block ", b, " has ",
                                                p.info(b).refs, " references but sequences hold ", refs[static_cast<int>(c)][b]));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace kvarn
