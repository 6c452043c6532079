// The blocks of the pool: per class (quantized tiles, fp16 sink tiles) their states and
// reference counts, and across classes the prefix index, parent links and eviction lists.
//
// Every block is in exactly one state:
//   kFree     on the free list, no hash;
//   kSealing  handed to a sealer, invisible to everyone else (not in the index);
//   kActive   referenced by at least one sequence; in the index;
//   kCached   unreferenced but kept in the index for prefix hits.
// Like LevelDB's cache, blocks someone holds are not on the eviction lists at all: only
// cached leaves (cached blocks no other indexed block names as its parent) are candidates
// (LeafLru, eviction_policy.h), so eviction can never touch a referenced block. A parent
// becomes a leaf when its last indexed child goes. Parents may live in the other class (a
// quantized block's parent is often a sink block), so links are BlockRefs.
//
// Each sealing or indexed block is charged to the tenant whose append sealed it (quota.h):
// TakeFree charges, Abort and Evict uncharge.
//
// Not thread-safe: the owner (KvCore) serializes access. Transitions check their
// preconditions (KVARN_CHECK): a violation is a bug in the caller, never bad input.
#ifndef KVARN_DAEMON_CORE_BLOCK_POOL_H_
#define KVARN_DAEMON_CORE_BLOCK_POOL_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "daemon/core/block_ref.h"
#include "daemon/core/eviction_policy.h"
#include "common/prefix_hash.h"
#include "daemon/core/prefix_index.h"
#include "daemon/core/quota.h"

namespace kvarn {

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
  uint32_t tenant = 0;      // charged tenant
  uint32_t tile_index = 0;  // position in its chain: 0 for a sequence's first tile
  uint8_t in_tiers = 0;     // bit t: tier t below the pool holds it (as far as the core knows)
};

// One class of blocks.
class BlockPool {
 public:
  BlockPool(BlockClass cls, uint32_t blocks);

  BlockClass cls() const { return cls_; }
  uint32_t total() const { return static_cast<uint32_t>(info_.size()); }
  uint32_t free_count() const { return static_cast<uint32_t>(free_.size()); }
  uint32_t count(BlockState s) const { return counts_[static_cast<int>(s)]; }
  const BlockInfo& info(uint32_t id) const { return info_[id]; }
  const LeafLru& leaves() const { return leaves_; }
  bool Evictable(uint32_t id) const { return Evictable(info_[id]); }

 private:
  friend class PoolSet;
  bool Evictable(const BlockInfo& b) const { return b.state == BlockState::kCached && b.children == 0; }
  void SetState(uint32_t id, BlockState s);
  // Keeps the leaf list in step after a change to block `id` that may alter Evictable.
  void Relist(uint32_t id, bool was_evictable, uint64_t old_last_use);
  absl::Status CheckInvariants() const;

  BlockClass cls_;
  std::vector<BlockInfo> info_;
  std::vector<uint32_t> free_;  // stack of free ids
  uint32_t counts_[4] = {0, 0, 0, 0};
  LeafLru leaves_;
};

// Both classes, the prefix index and the cross-class links.
class PoolSet {
 public:
  // block_bytes: bytes of one block of each class, for the tenant charge.
  PoolSet(uint32_t quant_blocks, uint32_t sink_blocks, uint64_t quant_block_bytes, uint64_t sink_block_bytes,
          UsageLedger* usage);

  const BlockPool& pool(BlockClass c) const { return c == BlockClass::kQuant ? quant_ : sink_; }
  const BlockInfo& info(BlockRef b) const { return pool(b.cls).info(b.id); }
  uint64_t block_bytes(BlockClass c) const { return c == BlockClass::kQuant ? quant_bytes_ : sink_bytes_; }
  std::optional<BlockRef> Find(const BlockHash& hash) const { return index_.Find(hash); }
  size_t indexed() const { return index_.size(); }

  // A free block into kSealing (refs = 1, held by the caller), charged to `tenant`.
  std::optional<uint32_t> TakeFree(BlockClass c, uint32_t tenant);
  // kSealing -> kActive, entered in the index under `hash` (its tile index one past its
  // parent's). REQUIRES: no block has `hash`; `parent`, if any, is indexed.
  void Publish(BlockRef b, const BlockHash& hash, std::optional<BlockRef> parent);
  // Records that tiers (bits) hold the indexed block b.
  void MarkInTiers(BlockRef b, uint8_t tiers);
  // Records that tiers (bits) no longer hold the indexed block b (a tier dropped its record).
  void ClearInTiers(BlockRef b, uint8_t tiers);
  // kSealing -> kFree (the seal failed or was a duplicate); uncharged.
  void Abort(BlockRef b);
  // One more reference to an indexed block (kCached -> kActive).
  void Acquire(BlockRef b, uint64_t tick);
  // One reference fewer; at zero the block becomes kCached. REQUIRES: refs > 0.
  void Release(BlockRef b, uint64_t tick);
  // kCached leaf -> kFree, out of the index, uncharged; its parent's child count drops.
  // Returns its info as it was. REQUIRES: Evictable.
  BlockInfo Evict(BlockRef b);

  // Every block in exactly one state; counts, lists, index, links and charges consistent.
  absl::Status CheckInvariants() const;

 private:
  BlockPool& mut(BlockClass c) { return c == BlockClass::kQuant ? quant_ : sink_; }
  void AddChild(BlockRef parent);
  void RemoveChild(BlockRef parent);

  BlockPool quant_;
  BlockPool sink_;
  const uint64_t quant_bytes_, sink_bytes_;
  PrefixIndex index_;
  UsageLedger* const usage_;
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_CORE_BLOCK_POOL_H_
