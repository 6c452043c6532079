// The tiers below the pool: spilling evicted and sealed blocks, onboarding a prompt's prefix,
// and what Lookup and Stats say about them. docs/tiers.md has the whole picture.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "daemon/core/check.h"
#include "daemon/core/kv_core.h"

namespace kvarn {
namespace {

// Evicted blocks exported in one locked call at most; beyond it an evicted block is dropped
// (counted), so an eviction storm cannot copy the pool into the heap.
constexpr uint64_t kSpillBudgetBytes = 256ull << 20;
// Records fetched before they are imported: bounds the heap a long prompt's onboarding takes.
constexpr uint64_t kOnboardBatchBytes = 64ull << 20;

}  // namespace

void KvCore::SetTiers(std::vector<BlockTier*> tiers) {
  KVARN_CHECK(tiers.size() <= 8, "at most 8 tiers (BlockInfo::in_tiers is a byte)");
  {
    MutexLock lock(&mu_);
    KVARN_CHECK(sessions_.all().empty() && tiers_.empty(), "tiers are set once, before the first session");
  }
  tiers_ = std::move(tiers);
  tier_counters_ = std::make_unique<TierCounters[]>(tiers_.size());
  for (size_t t = 0; t < tiers_.size(); ++t) {
    tiers_[t]->SetListener([this, t](const BlockHash& hash, bool stored, uint32_t tenant) {
      OnTierEvent(t, hash, stored, tenant);
    });
  }
}

void KvCore::OnTierEvent(size_t tier, const BlockHash& hash, bool stored, uint32_t tenant) {
  if (!stored) {
    // The tier dropped the record (its LRU, or a read found it bad): a pool block under that
    // hash goes to it again when evicted or spilled on stop. Safe from the tier's thread: the
    // core never waits for a tier while it holds the lock (Flush is called without it).
    MutexLock lock(&mu_);
    if (const std::optional<BlockRef> b = pools_.Find(hash); b.has_value()) {
      pools_.ClearInTiers(*b, static_cast<uint8_t>(1u << tier));
    }
  }
  BlockEvent e;
  e.kind = stored ? BlockEvent::Kind::kStored : BlockEvent::Kind::kRemoved;
  e.hash = hash;
  e.tenant = tenant;
  e.tier = static_cast<uint8_t>(tier + 1);
  events_.Append(e);
}

void KvCore::SpillBeforeEvict(BlockRef b) {
  if (tiers_.empty()) return;
  const BlockInfo& info = pools_.info(b);
  uint8_t missing = 0;
  for (size_t t = 0; t < tiers_.size(); ++t) {
    if (!(info.in_tiers & (1u << t))) missing |= static_cast<uint8_t>(1u << t);
  }
  if (missing == 0) return;
  const uint64_t bytes = pools_.block_bytes(b.cls);
  if (spill_bytes_ + bytes > kSpillBudgetBytes) {
    for (size_t t = 0; t < tiers_.size(); ++t) {
      if (missing & (1u << t)) tier_counters_[t].spill_dropped.fetch_add(1, std::memory_order_relaxed);
    }
    return;
  }
  Spill s;
  s.meta.hash = info.hash;
  s.meta.parent = info.has_parent ? pools_.info(info.parent).hash : kRootHash;
  s.meta.cls = b.cls;
  s.meta.tile_index = info.tile_index;
  s.meta.ns = tenants_.get(info.tenant).ns;
  s.tiers = missing;
  s.tenant = info.tenant;
  s.block = b;
  s.record = std::make_shared<std::string>(NewRecord(tier_identity_, b.cls));
  // The bytes are copied now: once the lock is released the block may be sealed over.
  if (!sealer_->ExportBlock(BlockPtr(b), b.cls == BlockClass::kSink,
                            reinterpret_cast<uint8_t*>(s.record->data()) + kRecordHeaderBytes)
           .ok()) {
    for (size_t t = 0; t < tiers_.size(); ++t) {
      if (missing & (1u << t)) tier_counters_[t].spill_dropped.fetch_add(1, std::memory_order_relaxed);
    }
    return;
  }
  spill_bytes_ += bytes;
  spills_.push_back(std::move(s));
}

void KvCore::HandOver(std::vector<Spill>& spills) {
  for (Spill& s : spills) {
    SealRecord(tier_identity_, s.meta, *s.record);
    std::shared_ptr<const std::string> record = std::move(s.record);
    uint8_t took = 0;
    for (size_t t = 0; t < tiers_.size(); ++t) {
      if (!(s.tiers & (1u << t))) continue;
      TierCounters& c = tier_counters_[t];
      const bool put = tiers_[t]->Put(s.meta.hash, record, s.tenant);
      (put ? c.spilled : c.spill_dropped).fetch_add(1, std::memory_order_relaxed);
      if (put) took |= static_cast<uint8_t>(1u << t);
    }
    s.tiers = took;
  }
}

uint8_t KvCore::PutOnSeal(BlockRef block, const RecordMeta& meta, uint32_t tenant) {
  uint8_t mask = 0;
  for (size_t t = 0; t < tiers_.size(); ++t) {
    if (tiers_[t]->write_policy() == TierWrite::kOnSeal) mask |= static_cast<uint8_t>(1u << t);
  }
  if (mask == 0) return 0;
  auto record = std::make_shared<std::string>(NewRecord(tier_identity_, block.cls));
  if (!sealer_->ExportBlock(BlockPtr(block), block.cls == BlockClass::kSink,
                            reinterpret_cast<uint8_t*>(record->data()) + kRecordHeaderBytes)
           .ok()) {
    return 0;
  }
  SealRecord(tier_identity_, meta, *record);
  std::shared_ptr<const std::string> sealed = std::move(record);
  uint8_t took = 0;
  for (size_t t = 0; t < tiers_.size(); ++t) {
    if (!(mask & (1u << t))) continue;
    TierCounters& c = tier_counters_[t];
    if (tiers_[t]->Put(meta.hash, sealed, tenant)) {
      took |= static_cast<uint8_t>(1u << t);
      c.spilled.fetch_add(1, std::memory_order_relaxed);
    } else {
      c.spill_dropped.fetch_add(1, std::memory_order_relaxed);
    }
  }
  return took;
}

std::vector<BlockRef> KvCore::OnboardPrefix(const SessionRef& ref, const BlockHash& ns,
                                            const std::vector<BlockHash>& hashes) {
  if (tiers_.empty()) return {};
  uint32_t tenant = 0;
  size_t start = 0;
  {
    MutexLock lock(&mu_);
    auto s = sessions_.Find(ref);
    if (!s.ok()) return {};
    tenant = (*s)->tenant;
    while (start < hashes.size()) {
      const std::optional<BlockRef> hit = pools_.Find(hashes[start]);
      if (!hit.has_value() || hit->cls != ClassAt(start)) break;
      ++start;
    }
  }
  // One fetched record: where it continues the prefix, which tier had it, and the block it
  // goes into (own: allocated for it; else an indexed block someone else brought meanwhile).
  struct Fetched {
    size_t index = 0;
    size_t tier = 0;
    std::string record;
    BlockRef block;
    bool own = false;
    bool imported = false;
  };
  std::vector<BlockRef> pins;
  bool pinned = false;
  size_t next = start;
  bool done = false;
  while (!done && next < hashes.size()) {
    // Fetch a batch (no lock: disk reads and network round trips).
    const absl::Time fetch_start = clock_->Now();
    std::vector<Fetched> batch;
    uint64_t batch_bytes = 0;
    while (next < hashes.size() && batch_bytes < kOnboardBatchBytes) {
      const BlockClass cls = ClassAt(next);
      bool found = false;
      for (size_t t = 0; t < tiers_.size() && !found; ++t) {
        absl::StatusOr<std::string> rec = tiers_[t]->Get(hashes[next]);
        if (!rec.ok()) continue;
        // The tier checked the record (CheckRecord); its place in this chain is the core's
        // to check.
        if (rec->size() != kRecordHeaderBytes + tier_identity_.payload_bytes(cls)) {
          tier_counters_[t].onboard_failures.fetch_add(1, std::memory_order_relaxed);
          continue;
        }
        const RecordMeta meta = PeekRecord(*rec);
        if (meta.hash != hashes[next] || meta.ns != ns || meta.cls != cls || meta.tile_index != next ||
            meta.parent != (next == 0 ? kRootHash : hashes[next - 1])) {
          tier_counters_[t].onboard_failures.fetch_add(1, std::memory_order_relaxed);
          continue;
        }
        batch_bytes += rec->size();
        Fetched f;
        f.index = next;
        f.tier = t;
        f.record = std::move(*rec);
        batch.push_back(std::move(f));
        found = true;
      }
      if (!found) {
        done = true;
        break;
      }
      ++next;
    }
    if (batch.empty()) break;
    // Hold the prefix so far, then allocate blocks for the batch.
    {
      Locked lock(this);
      if (!pinned) {
        for (size_t i = 0; i < start; ++i) {
          const std::optional<BlockRef> hit = pools_.Find(hashes[i]);
          if (!hit.has_value() || hit->cls != ClassAt(i)) {
            // The pool's prefix shrank meanwhile: give up onboarding rather than chase it.
            Unpin(pins);
            return {};
          }
          pools_.Acquire(*hit, ++tick_);
          pins.push_back(*hit);
        }
        pinned = true;
      }
      for (size_t i = 0; i < batch.size(); ++i) {
        Fetched& f = batch[i];
        const BlockClass cls = ClassAt(f.index);
        if (const std::optional<BlockRef> hit = pools_.Find(hashes[f.index]); hit.has_value() && hit->cls == cls) {
          pools_.Acquire(*hit, ++tick_);
          f.block = *hit;
          continue;
        }
        absl::StatusOr<uint32_t> id = AllocateBlock(cls, tenant);
        if (!id.ok()) {
          tier_counters_[f.tier].onboard_failures.fetch_add(1, std::memory_order_relaxed);
          batch.resize(i);
          done = true;
          break;
        }
        f.block = BlockRef{cls, *id};
        f.own = true;
      }
    }
    // Import outside the lock: the allocated blocks are kSealing, nobody else's.
    for (Fetched& f : batch) {
      if (!f.own) continue;
      f.imported = sealer_->ImportBlock(RecordPayload(f.record).data(), f.block.cls == BlockClass::kSink,
                                        BlockPtr(f.block))
                       .ok();
      if (!f.imported) {
        tier_counters_[f.tier].onboard_failures.fetch_add(1, std::memory_order_relaxed);
        break;  // the rest stay unimported: the prefix ends here
      }
    }
    const absl::Duration took = clock_->Now() - fetch_start;
    // Publish in chain order, each block's parent the one before it.
    std::vector<uint32_t> onboarded(tiers_.size(), 0);
    {
      Locked lock(this);
      bool broken = false;
      for (Fetched& f : batch) {
        if (broken || (f.own && !f.imported)) {
          broken = true;
          if (f.own) {
            pools_.Abort(f.block);
          } else {
            pools_.Release(f.block, ++tick_);
          }
          continue;
        }
        if (!f.own) {
          pins.push_back(f.block);
          continue;
        }
        const BlockHash& hash = hashes[f.index];
        if (const std::optional<BlockRef> dup = pools_.Find(hash); dup.has_value()) {
          // Sealed or onboarded by another call meanwhile: share that one.
          pools_.Abort(f.block);
          pools_.Acquire(*dup, ++tick_);
          pins.push_back(*dup);
          continue;
        }
        std::optional<BlockRef> parent;
        if (!pins.empty()) parent = pins.back();
        pools_.Publish(f.block, hash, parent);
        pools_.MarkInTiers(f.block, static_cast<uint8_t>(1u << f.tier));
        BlockEvent e;
        e.kind = BlockEvent::Kind::kStored;
        e.hash = hash;
        e.parent_hash = f.index == 0 ? kRootHash : hashes[f.index - 1];
        e.block = f.block.id;
        e.fp16 = f.block.cls == BlockClass::kSink;
        e.tenant = tenant;
        events_.Append(e);
        pins.push_back(f.block);
        ++onboarded[f.tier];
      }
      if (broken) done = true;
    }
    uint32_t total = 0;
    for (uint32_t n : onboarded) total += n;
    for (size_t t = 0; t < tiers_.size(); ++t) {
      if (onboarded[t] == 0) continue;
      TierCounters& c = tier_counters_[t];
      c.onboarded.fetch_add(onboarded[t], std::memory_order_relaxed);
      c.hit_tokens.fetch_add(uint64_t{onboarded[t]} * static_cast<uint64_t>(preset_.tile_tokens), std::memory_order_relaxed);
      if (observer_ != nullptr) observer_->OnOnboard(tiers_[t]->name(), onboarded[t], took / total);
    }
  }
  if (pins.size() <= start) {
    // The tiers added nothing: the caller adopts the pool's prefix itself.
    if (!pins.empty()) {
      Locked lock(this);
      Unpin(pins);
    }
    return {};
  }
  return pins;
}

void KvCore::Unpin(std::vector<BlockRef>& pins) {
  for (const BlockRef& b : pins) pools_.Release(b, ++tick_);
  pins.clear();
}

uint64_t KvCore::SpillAll(absl::Time deadline) {
  if (tiers_.empty()) return 0;
  struct Candidate {
    BlockRef block;
    BlockHash hash;
  };
  std::vector<Candidate> todo;
  {
    MutexLock lock(&mu_);
    for (BlockClass c : {BlockClass::kSink, BlockClass::kQuant}) {
      const BlockPool& pool = pools_.pool(c);
      for (uint32_t id = 0; id < pool.total(); ++id) {
        const BlockInfo& b = pool.info(id);
        if (b.state == BlockState::kActive || b.state == BlockState::kCached) todo.push_back({BlockRef{c, id}, b.hash});
      }
    }
  }
  uint64_t handed = 0;
  for (size_t i = 0; i < todo.size();) {
    std::vector<Spill> spills;
    {
      MutexLock lock(&mu_);
      // Export a budget's worth; a block evicted or replaced meanwhile is skipped.
      for (; i < todo.size() && spill_bytes_ < kSpillBudgetBytes; ++i) {
        const BlockInfo& b = pools_.info(todo[i].block);
        if ((b.state != BlockState::kActive && b.state != BlockState::kCached) || b.hash != todo[i].hash) continue;
        SpillBeforeEvict(todo[i].block);
      }
      spills = std::move(spills_);
      spills_.clear();
      spill_bytes_ = 0;
    }
    HandOver(spills);
    {
      // Noted, so neither a later eviction nor another SpillAll writes them again.
      MutexLock lock(&mu_);
      for (const Spill& s : spills) {
        if (s.tiers == 0) continue;
        ++handed;
        const BlockInfo& b = pools_.info(s.block);
        if ((b.state == BlockState::kActive || b.state == BlockState::kCached) && b.hash == s.meta.hash) {
          pools_.MarkInTiers(s.block, s.tiers);
        }
      }
    }
    // Let the queues drain before the next budget's worth, so nothing is dropped for room.
    for (BlockTier* t : tiers_) t->Flush(deadline);
    if (clock_->Now() > deadline) break;
  }
  for (BlockTier* t : tiers_) t->Flush(deadline);
  return handed;
}

std::vector<TierReport> KvCore::TierReports() const {
  std::vector<TierReport> out;
  for (size_t t = 0; t < tiers_.size(); ++t) {
    const TierStats st = tiers_[t]->Stats();
    TierReport r;
    r.name = std::string(tiers_[t]->name());
    r.write = tiers_[t]->write_policy() == TierWrite::kOnSeal ? "seal" : "evict";
    r.blocks = st.blocks;
    r.bytes = st.bytes;
    r.capacity_bytes = st.capacity_bytes;
    r.hits = st.hits;
    r.misses = st.misses;
    r.read_bytes = st.read_bytes;
    r.queued_blocks = st.queued_blocks;
    r.queued_bytes = st.queued_bytes;
    r.written_blocks = st.written_blocks;
    r.written_bytes = st.written_bytes;
    r.dropped_writes = st.dropped_writes;
    r.evicted_blocks = st.evicted_blocks;
    r.errors = st.errors;
    for (int f = 0; f < kRecordFaults; ++f) r.rejected[f] = st.rejected[f];
    const TierCounters& c = tier_counters_[t];
    r.onboarded_blocks = c.onboarded.load(std::memory_order_relaxed);
    r.hit_tokens = c.hit_tokens.load(std::memory_order_relaxed);
    r.onboard_failures = c.onboard_failures.load(std::memory_order_relaxed);
    r.spilled_blocks = c.spilled.load(std::memory_order_relaxed);
    r.spill_dropped = c.spill_dropped.load(std::memory_order_relaxed);
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace kvarn
