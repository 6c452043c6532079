// The blocks of one class (quantized tiles, or fp16 sink tiles) with their reference counts,
// prefix-index entries and eviction order.
//
// Every block is in exactly one state:
//   kFree     on the free list, no hash;
//   kSealing  handed to a sealer, invisible to everyone else (not in the index);
//   kActive   referenced by at least one sequence; in the index;
//   kCached   unreferenced but kept in the index for prefix hits.
// Like LevelDB's cache, blocks someone holds are not on the eviction structure at all: only
// cached *leaves* (cached blocks no other indexed block names as its parent) are candidates,
// ordered by last use, so eviction removes the least recently used leaf first and can never
// touch a referenced block. A parent becomes a leaf when its last indexed child goes.
//
// Parents may live in another pool (a quantized block's parent is often the sink block), so
// parent links are (pool, id) pairs and child counts are adjusted through PoolSet.
//
// Not thread-safe: the owner (KvCore) serializes access.
#ifndef KVARN_DAEMON_CORE_BLOCK_POOL_H_
#define KVARN_DAEMON_CORE_BLOCK_POOL_H_

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "daemon/core/prefix_hash.h"

namespace kvarn {

enum class BlockClass : uint8_t { kQuant = 0, kSink = 1 };

struct BlockRef {
  BlockClass cls = BlockClass::kQuant;
  uint32_t id = 0;
  friend bool operator==(const BlockRef&, const BlockRef&) = default;
};

enum class BlockState : uint8_t { kFree, kSealing, kActive, kCached };

struct BlockInfo {
  BlockState state = BlockState::kFree;
  uint32_t refs = 0;
  uint32_t children = 0;  // indexed blocks whose parent is this one
  uint64_t last_use = 0;  // logical tick of the last release or adoption
  bool has_parent = false;
  BlockRef parent;
  bool has_root = false;  // a quantized block whose chain starts with a sink block
  uint32_t root = 0;      // that sink block
  BlockHash hash{};
  uint32_t tenant = 0;  // interned tenant id, for eviction by tenant and isolation
};

class BlockPool {
 public:
  BlockPool(BlockClass cls, uint32_t blocks);

  BlockClass cls() const { return cls_; }
  uint32_t total() const { return static_cast<uint32_t>(info_.size()); }
  uint32_t free_count() const { return static_cast<uint32_t>(free_.size()); }
  uint32_t count(BlockState s) const { return counts_[static_cast<int>(s)]; }
  const BlockInfo& info(uint32_t id) const { return info_[id]; }

  // Takes a free block into kSealing (refs = 1, owned by the caller). nullopt when none is free.
  std::optional<uint32_t> TakeFree();
  // The indexed block with this hash, if any.
  std::optional<uint32_t> Find(const BlockHash& hash) const;
  // kSealing -> kActive, entered in the index. REQUIRES: no indexed block has `hash`.
  void Publish(uint32_t id, const BlockHash& hash, std::optional<BlockRef> parent, uint32_t tenant);
  // kSealing -> kFree (the seal failed).
  void Abort(uint32_t id);
  // One more reference to an indexed block (kCached -> kActive).
  void Acquire(uint32_t id, uint64_t tick);
  // One reference fewer; at zero the block becomes kCached.
  void Release(uint32_t id, uint64_t tick);
  // The least recently used evictable leaf, optionally of one tenant only.
  std::optional<uint32_t> EvictionCandidate(std::optional<uint32_t> tenant) const;
  // The least recently used evictable leaf whose chain starts at sink block `root`.
  std::optional<uint32_t> EvictionCandidateUnder(uint32_t root) const;
  // The least recently used cached block, leaf or not (nullopt if none), optionally of one tenant.
  std::optional<uint32_t> OldestCached(std::optional<uint32_t> tenant) const;
  // kCached leaf -> kFree, out of the index. Returns its info as it was (hash, parent).
  BlockInfo Evict(uint32_t id);

  // Child bookkeeping, called by PoolSet when an indexed child appears or goes.
  void AddChild(uint32_t id);
  void SetRoot(uint32_t id, bool has_root, uint32_t root);
  void RemoveChild(uint32_t id);

  // Every block in exactly one state, counts and lists consistent. Returns the first problem.
  absl::Status CheckInvariants() const;

 private:
  bool Evictable(const BlockInfo& b) const {
    return b.state == BlockState::kCached && b.children == 0;
  }
  void SetState(uint32_t id, BlockState s);
  void UpdateEvictable(uint32_t id, bool was);

  BlockClass cls_;
  std::vector<BlockInfo> info_;
  std::vector<uint32_t> free_;                      // stack of free ids
  uint32_t counts_[4] = {0, 0, 0, 0};
  absl::flat_hash_map<BlockHash, uint32_t> index_;  // hash -> block id, for kActive/kCached
  std::set<std::pair<uint64_t, uint32_t>> lru_;     // (last_use, id) of evictable leaves
};

// The two pools, with cross-pool parent links.
class PoolSet {
 public:
  PoolSet(uint32_t quant_blocks, uint32_t sink_blocks)
      : quant_(BlockClass::kQuant, quant_blocks), sink_(BlockClass::kSink, sink_blocks) {}

  BlockPool& pool(BlockClass c) { return c == BlockClass::kQuant ? quant_ : sink_; }
  const BlockPool& pool(BlockClass c) const { return c == BlockClass::kQuant ? quant_ : sink_; }

  void Publish(BlockRef b, const BlockHash& hash, std::optional<BlockRef> parent, uint32_t tenant);
  // Evicts one cached leaf and fixes its parent's child count.
  BlockInfo Evict(BlockRef b);

  absl::Status CheckInvariants() const;

 private:
  BlockPool quant_;
  BlockPool sink_;
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_CORE_BLOCK_POOL_H_
