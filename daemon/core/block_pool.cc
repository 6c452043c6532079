#include "daemon/core/block_pool.h"

#include "absl/strings/str_cat.h"

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

}  // namespace

BlockPool::BlockPool(BlockClass cls, uint32_t blocks) : cls_(cls), info_(blocks) {
  free_.reserve(blocks);
  // Hand out low ids first.
  for (uint32_t i = blocks; i > 0; --i) free_.push_back(i - 1);
  counts_[static_cast<int>(BlockState::kFree)] = blocks;
}

void BlockPool::SetState(uint32_t id, BlockState s) {
  --counts_[static_cast<int>(info_[id].state)];
  info_[id].state = s;
  ++counts_[static_cast<int>(s)];
}

void BlockPool::UpdateEvictable(uint32_t id, bool was) {
  const bool is = Evictable(info_[id]);
  if (was == is) return;
  if (is) {
    lru_.emplace(info_[id].last_use, id);
  } else {
    lru_.erase({info_[id].last_use, id});
  }
}

std::optional<uint32_t> BlockPool::TakeFree() {
  if (free_.empty()) return std::nullopt;
  const uint32_t id = free_.back();
  free_.pop_back();
  SetState(id, BlockState::kSealing);
  info_[id].refs = 1;
  return id;
}

std::optional<uint32_t> BlockPool::Find(const BlockHash& hash) const {
  auto it = index_.find(hash);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

void BlockPool::Publish(uint32_t id, const BlockHash& hash, std::optional<BlockRef> parent,
                        uint32_t tenant) {
  BlockInfo& b = info_[id];
  b.hash = hash;
  b.has_parent = parent.has_value();
  b.parent = parent.value_or(BlockRef{});
  b.tenant = tenant;
  b.children = 0;
  index_.emplace(hash, id);
  SetState(id, BlockState::kActive);
}

void BlockPool::Abort(uint32_t id) {
  BlockInfo& b = info_[id];
  b = BlockInfo{};
  --counts_[static_cast<int>(BlockState::kSealing)];
  ++counts_[static_cast<int>(BlockState::kFree)];
  free_.push_back(id);
}

void BlockPool::Acquire(uint32_t id, uint64_t tick) {
  const bool was = Evictable(info_[id]);
  BlockInfo& b = info_[id];
  if (was) lru_.erase({b.last_use, id});
  ++b.refs;
  b.last_use = tick;
  if (b.state == BlockState::kCached) SetState(id, BlockState::kActive);
}

void BlockPool::Release(uint32_t id, uint64_t tick) {
  BlockInfo& b = info_[id];
  --b.refs;
  b.last_use = tick;
  if (b.refs == 0) {
    SetState(id, BlockState::kCached);
    UpdateEvictable(id, false);
  }
}

std::optional<uint32_t> BlockPool::EvictionCandidate(std::optional<uint32_t> tenant) const {
  for (const auto& [tick, id] : lru_) {
    if (!tenant.has_value() || info_[id].tenant == *tenant) return id;
  }
  return std::nullopt;
}

std::optional<uint32_t> BlockPool::EvictionCandidateUnder(uint32_t root) const {
  for (const auto& [tick, id] : lru_) {
    if (info_[id].has_root && info_[id].root == root) return id;
  }
  return std::nullopt;
}

std::optional<uint32_t> BlockPool::OldestCached(std::optional<uint32_t> tenant) const {
  std::optional<uint32_t> best;
  for (uint32_t id = 0; id < info_.size(); ++id) {
    const BlockInfo& b = info_[id];
    if (b.state != BlockState::kCached || (tenant.has_value() && b.tenant != *tenant)) continue;
    if (!best || b.last_use < info_[*best].last_use) best = id;
  }
  return best;
}

BlockInfo BlockPool::Evict(uint32_t id) {
  BlockInfo old = info_[id];
  lru_.erase({old.last_use, id});
  index_.erase(old.hash);
  info_[id] = BlockInfo{};
  --counts_[static_cast<int>(BlockState::kCached)];
  ++counts_[static_cast<int>(BlockState::kFree)];
  free_.push_back(id);
  return old;
}

void BlockPool::SetRoot(uint32_t id, bool has_root, uint32_t root) {
  info_[id].has_root = has_root;
  info_[id].root = root;
}

void BlockPool::AddChild(uint32_t id) {
  const bool was = Evictable(info_[id]);
  ++info_[id].children;
  UpdateEvictable(id, was);
}

void BlockPool::RemoveChild(uint32_t id) {
  const bool was = Evictable(info_[id]);
  --info_[id].children;
  UpdateEvictable(id, was);
}

absl::Status BlockPool::CheckInvariants() const {
  const char* name = cls_ == BlockClass::kQuant ? "quant" : "sink";
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
    const bool indexed = b.state == BlockState::kActive || b.state == BlockState::kCached;
    auto it = index_.find(b.hash);
    if (indexed && (it == index_.end() || it->second != id)) return bad("missing from the index");
    if (b.state == BlockState::kActive && b.refs == 0) return bad("active without references");
    if (b.state == BlockState::kCached && b.refs != 0) return bad("cached with references");
    if (b.state == BlockState::kSealing && b.refs != 1) return bad("sealing block must have one owner");
    if (b.state == BlockState::kFree && (b.refs != 0 || b.children != 0)) return bad("free block with refs or children");
    const bool in_lru = lru_.count({b.last_use, id}) != 0;
    if (in_lru != Evictable(b)) return bad(in_lru ? "evictable list holds a non-leaf or held block" : "evictable leaf missing from the list");
    evictable += in_lru;
  }
  for (int s = 0; s < 4; ++s) {
    if (counts[s] != counts_[s]) {
      return absl::InternalError(absl::StrCat(name, ": ", StateName(static_cast<BlockState>(s)), " count ", counts_[s], " but ", counts[s], " blocks"));
    }
  }
  if (evictable != lru_.size()) return absl::InternalError(absl::StrCat(name, ": evictable list has stale entries"));
  if (index_.size() != counts[2] + counts[3]) return absl::InternalError(absl::StrCat(name, ": index has ", index_.size(), " entries for ", counts[2] + counts[3], " indexed blocks"));
  return absl::OkStatus();
}

void PoolSet::Publish(BlockRef b, const BlockHash& hash, std::optional<BlockRef> parent, uint32_t tenant) {
  pool(b.cls).Publish(b.id, hash, parent, tenant);
  if (!parent.has_value()) return;
  pool(parent->cls).AddChild(parent->id);
  if (b.cls == BlockClass::kQuant) {
    const BlockInfo& p = pool(parent->cls).info(parent->id);
    const bool from_sink = parent->cls == BlockClass::kSink;
    quant_.SetRoot(b.id, from_sink || p.has_root, from_sink ? parent->id : p.root);
  }
}

BlockInfo PoolSet::Evict(BlockRef b) {
  BlockInfo old = pool(b.cls).Evict(b.id);
  if (old.has_parent) pool(old.parent.cls).RemoveChild(old.parent.id);
  return old;
}

absl::Status PoolSet::CheckInvariants() const {
  for (BlockClass c : {BlockClass::kQuant, BlockClass::kSink}) {
    if (absl::Status s = pool(c).CheckInvariants(); !s.ok()) return s;
  }
  // Child counts equal the number of indexed blocks naming each block as parent.
  std::vector<uint32_t> expect[2] = {std::vector<uint32_t>(quant_.total(), 0), std::vector<uint32_t>(sink_.total(), 0)};
  for (BlockClass c : {BlockClass::kQuant, BlockClass::kSink}) {
    const BlockPool& p = pool(c);
    for (uint32_t id = 0; id < p.total(); ++id) {
      const BlockInfo& b = p.info(id);
      if ((b.state == BlockState::kActive || b.state == BlockState::kCached) && b.has_parent) {
        const BlockPool& pp = pool(b.parent.cls);
        const BlockState ps = pp.info(b.parent.id).state;
        if (ps != BlockState::kActive && ps != BlockState::kCached) {
          return absl::InternalError(absl::StrCat("block ", id, " names a parent that is not indexed"));
        }
        ++expect[static_cast<int>(b.parent.cls)][b.parent.id];
        if (c == BlockClass::kQuant) {
          const BlockInfo& pi = pp.info(b.parent.id);
          const bool want_root = b.parent.cls == BlockClass::kSink || pi.has_root;
          const uint32_t root = b.parent.cls == BlockClass::kSink ? b.parent.id : pi.root;
          if (b.has_root != want_root || (want_root && b.root != root)) {
            return absl::InternalError(absl::StrCat("quant block ", id, " names the wrong chain root"));
          }
        }
      }
    }
  }
  for (BlockClass c : {BlockClass::kQuant, BlockClass::kSink}) {
    const BlockPool& p = pool(c);
    for (uint32_t id = 0; id < p.total(); ++id) {
      if (p.info(id).children != expect[static_cast<int>(c)][id]) {
        return absl::InternalError(absl::StrCat("block ", id, " child count ", p.info(id).children, " != ", expect[static_cast<int>(c)][id]));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace kvarn
