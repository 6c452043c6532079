#include "daemon/core/block_pool.h"

#include "absl/strings/str_cat.h"
#include "daemon/core/check.h"

namespace kvarn {
namespace {

const char* StateName(BlockState s) {
  switch (s) {
    case BlockState::kFree: return "free";
    case BlockState::kSealing: return "sealing";
    case BlockState::kActive: return "active";
    case BlockState::kCached: return "cached";
  }
  return "?";
}

const char* ClassName(BlockClass c) { return c == BlockClass::kQuant ? "quant" : "sink"; }

}  // namespace

BlockPool::BlockPool(BlockClass cls, uint32_t blocks) : cls_(cls), info_(blocks) {
  free_.reserve(blocks);
  for (uint32_t i = blocks; i > 0; --i) free_.push_back(i - 1);  // low ids first
  counts_[static_cast<int>(BlockState::kFree)] = blocks;
}

void BlockPool::SetState(uint32_t id, BlockState s) {
  --counts_[static_cast<int>(info_[id].state)];
  info_[id].state = s;
  ++counts_[static_cast<int>(s)];
}

void BlockPool::Relist(uint32_t id, bool was, uint64_t old_last_use) {
  const BlockInfo& b = info_[id];
  const bool is = Evictable(b);
  if (was) leaves_.Remove(id, b.tenant, old_last_use);
  if (is) leaves_.Add(id, b.tenant, b.last_use);
}

absl::Status BlockPool::CheckInvariants() const {
  const char* name = ClassName(cls_);
  uint32_t counts[4] = {0, 0, 0, 0};
  size_t evictable = 0;
  std::vector<bool> on_free(info_.size(), false);
  for (uint32_t id : free_) {
    if (id >= info_.size() || on_free[id]) return absl::InternalError(absl::StrCat(name, ": free list corrupt at ", id));
    on_free[id] = true;
  }
  for (uint32_t id = 0; id < info_.size(); ++id) {
    const BlockInfo& b = info_[id];
    ++counts[static_cast<int>(b.state)];
    const auto bad = [&](const std::string& what) {
      return absl::InternalError(absl::StrCat(name, " block ", id, " (", StateName(b.state), "): ", what));
    };
    if ((b.state == BlockState::kFree) != on_free[id]) return bad("free list disagrees with state");
    if (b.state == BlockState::kActive && b.refs == 0) return bad("active without references");
    if (b.state == BlockState::kCached && b.refs != 0) return bad("cached with references");
    if (b.state == BlockState::kSealing && b.refs != 1) return bad("sealing block must have one owner");
    if (b.state == BlockState::kFree && (b.refs != 0 || b.children != 0)) return bad("free block with refs or children");
    const bool listed = leaves_.Contains(id, b.last_use);
    if (listed != Evictable(b)) return bad(listed ? "leaf list holds a non-leaf or held block" : "evictable leaf missing from the list");
    evictable += listed;
  }
  for (int s = 0; s < 4; ++s) {
    if (counts[s] != counts_[s]) {
      return absl::InternalError(absl::StrCat(name, ": ", StateName(static_cast<BlockState>(s)), " count ", counts_[s], " but ",
                                              counts[s], " blocks"));
    }
  }
  if (evictable != leaves_.size()) return absl::InternalError(absl::StrCat(name, ": leaf list has stale entries"));
  return absl::OkStatus();
}

PoolSet::PoolSet(uint32_t quant_blocks, uint32_t sink_blocks, uint64_t quant_block_bytes, uint64_t sink_block_bytes,
                 UsageLedger* usage)
    : quant_(BlockClass::kQuant, quant_blocks), sink_(BlockClass::kSink, sink_blocks),
      quant_bytes_(quant_block_bytes), sink_bytes_(sink_block_bytes), usage_(usage) {}

std::optional<uint32_t> PoolSet::TakeFree(BlockClass c, uint32_t tenant) {
  BlockPool& p = mut(c);
  if (p.free_.empty()) return std::nullopt;
  const uint32_t id = p.free_.back();
  p.free_.pop_back();
  p.SetState(id, BlockState::kSealing);
  p.info_[id].refs = 1;
  p.info_[id].tenant = tenant;
  usage_->of(tenant).cache_bytes += block_bytes(c);
  return id;
}

void PoolSet::Publish(BlockRef ref, const BlockHash& hash, std::optional<BlockRef> parent) {
  BlockPool& p = mut(ref.cls);
  BlockInfo& b = p.info_[ref.id];
  KVARN_CHECK(b.state == BlockState::kSealing, "only a sealing block is published");
  KVARN_CHECK(index_.Insert(hash, ref), "a published hash is new");
  b.hash = hash;
  b.has_parent = parent.has_value();
  b.parent = parent.value_or(BlockRef{});
  b.children = 0;
  b.tile_index = 0;
  b.in_tiers = 0;
  p.SetState(ref.id, BlockState::kActive);
  if (!parent.has_value()) return;
  const BlockInfo& pi = info(*parent);
  b.tile_index = pi.tile_index + 1;
  KVARN_CHECK(pi.state == BlockState::kActive || pi.state == BlockState::kCached, "a parent is indexed");
  AddChild(*parent);
  if (ref.cls == BlockClass::kQuant) {
    const bool from_sink = parent->cls == BlockClass::kSink;
    b.has_root = from_sink || pi.has_root;
    b.root = from_sink ? parent->id : pi.root;
  }
}

void PoolSet::MarkInTiers(BlockRef ref, uint8_t tiers) {
  BlockInfo& b = mut(ref.cls).info_[ref.id];
  KVARN_CHECK(b.state == BlockState::kActive || b.state == BlockState::kCached, "only an indexed block is in a tier");
  b.in_tiers |= tiers;
}

void PoolSet::ClearInTiers(BlockRef ref, uint8_t tiers) {
  BlockInfo& b = mut(ref.cls).info_[ref.id];
  KVARN_CHECK(b.state == BlockState::kActive || b.state == BlockState::kCached, "only an indexed block is in a tier");
  b.in_tiers &= static_cast<uint8_t>(~tiers);
}

void PoolSet::Abort(BlockRef ref) {
  BlockPool& p = mut(ref.cls);
  BlockInfo& b = p.info_[ref.id];
  KVARN_CHECK(b.state == BlockState::kSealing, "only a sealing block is aborted");
  TenantUsage& u = usage_->of(b.tenant);
  KVARN_CHECK(u.cache_bytes >= block_bytes(ref.cls), "cache charge underflow");
  u.cache_bytes -= block_bytes(ref.cls);
  b = BlockInfo{};
  --p.counts_[static_cast<int>(BlockState::kSealing)];
  ++p.counts_[static_cast<int>(BlockState::kFree)];
  p.free_.push_back(ref.id);
}

void PoolSet::Acquire(BlockRef ref, uint64_t tick) {
  BlockPool& p = mut(ref.cls);
  BlockInfo& b = p.info_[ref.id];
  KVARN_CHECK(b.state == BlockState::kActive || b.state == BlockState::kCached, "only an indexed block is acquired");
  const bool was = p.Evictable(b);
  const uint64_t old = b.last_use;
  ++b.refs;
  b.last_use = tick;
  if (b.state == BlockState::kCached) p.SetState(ref.id, BlockState::kActive);
  p.Relist(ref.id, was, old);
}

void PoolSet::Release(BlockRef ref, uint64_t tick) {
  BlockPool& p = mut(ref.cls);
  BlockInfo& b = p.info_[ref.id];
  KVARN_CHECK(b.state == BlockState::kActive && b.refs > 0, "reference count underflow");
  const uint64_t old = b.last_use;
  --b.refs;
  b.last_use = tick;
  if (b.refs == 0) p.SetState(ref.id, BlockState::kCached);
  p.Relist(ref.id, false, old);
}

BlockInfo PoolSet::Evict(BlockRef ref) {
  BlockPool& p = mut(ref.cls);
  KVARN_CHECK(p.Evictable(ref.id), "only a cached leaf is evicted");
  BlockInfo old = p.info_[ref.id];
  p.leaves_.Remove(ref.id, old.tenant, old.last_use);
  index_.Erase(old.hash);
  TenantUsage& u = usage_->of(old.tenant);
  KVARN_CHECK(u.cache_bytes >= block_bytes(ref.cls), "cache charge underflow");
  u.cache_bytes -= block_bytes(ref.cls);
  p.info_[ref.id] = BlockInfo{};
  --p.counts_[static_cast<int>(BlockState::kCached)];
  ++p.counts_[static_cast<int>(BlockState::kFree)];
  p.free_.push_back(ref.id);
  if (old.has_parent) RemoveChild(old.parent);
  return old;
}

void PoolSet::AddChild(BlockRef parent) {
  BlockPool& p = mut(parent.cls);
  const bool was = p.Evictable(parent.id);
  ++p.info_[parent.id].children;
  p.Relist(parent.id, was, p.info_[parent.id].last_use);
}

void PoolSet::RemoveChild(BlockRef parent) {
  BlockPool& p = mut(parent.cls);
  KVARN_CHECK(p.info_[parent.id].children > 0, "child count underflow");
  const bool was = p.Evictable(parent.id);
  --p.info_[parent.id].children;
  p.Relist(parent.id, was, p.info_[parent.id].last_use);
}

absl::Status PoolSet::CheckInvariants() const {
  for (BlockClass c : {BlockClass::kQuant, BlockClass::kSink}) {
    if (absl::Status s = pool(c).CheckInvariants(); !s.ok()) return s;
  }
  // Index, child counts, chain roots and tenant charges, recomputed from the blocks.
  std::vector<uint32_t> expect[2] = {std::vector<uint32_t>(quant_.total(), 0), std::vector<uint32_t>(sink_.total(), 0)};
  std::vector<uint64_t> charged;
  size_t indexed = 0;
  for (BlockClass c : {BlockClass::kQuant, BlockClass::kSink}) {
    const BlockPool& p = pool(c);
    for (uint32_t id = 0; id < p.total(); ++id) {
      const BlockInfo& b = p.info(id);
      if (b.state == BlockState::kFree) continue;
      if (b.tenant >= charged.size()) charged.resize(b.tenant + 1, 0);
      charged[b.tenant] += block_bytes(c);
      if (b.state == BlockState::kSealing) continue;
      ++indexed;
      const std::optional<BlockRef> found = index_.Find(b.hash);
      if (!found.has_value() || !(*found == BlockRef{c, id})) {
        return absl::InternalError(absl::StrCat(ClassName(c), " block ", id, " is missing from the index"));
      }
      if (!b.has_parent) continue;
      const BlockInfo& pi = info(b.parent);
      if (pi.state != BlockState::kActive && pi.state != BlockState::kCached) {
        return absl::InternalError(absl::StrCat(ClassName(c), " block ", id, " names a parent that is not indexed"));
      }
      ++expect[static_cast<int>(b.parent.cls)][b.parent.id];
      if (c == BlockClass::kQuant) {
        const bool want_root = b.parent.cls == BlockClass::kSink || pi.has_root;
        const uint32_t root = b.parent.cls == BlockClass::kSink ? b.parent.id : pi.root;
        if (b.has_root != want_root || (want_root && b.root != root)) {
          return absl::InternalError(absl::StrCat("quant block ", id, " names the wrong chain root"));
        }
      }
    }
  }
  if (indexed != index_.size()) {
    return absl::InternalError(absl::StrCat("index has ", index_.size(), " entries for ", indexed, " indexed blocks"));
  }
  for (BlockClass c : {BlockClass::kQuant, BlockClass::kSink}) {
    const BlockPool& p = pool(c);
    for (uint32_t id = 0; id < p.total(); ++id) {
      if (p.info(id).children != expect[static_cast<int>(c)][id]) {
        return absl::InternalError(absl::StrCat(ClassName(c), " block ", id, " child count ", p.info(id).children, " != ",
                                                expect[static_cast<int>(c)][id]));
      }
    }
  }
  for (uint32_t t = 0; t < usage_->all().size(); ++t) {
    const uint64_t want = t < charged.size() ? charged[t] : 0;
    if (usage_->all()[t].cache_bytes != want) {
      return absl::InternalError(absl::StrCat("tenant ", t, " is charged ", usage_->all()[t].cache_bytes, " cache bytes but holds ", want));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvarn
