// What-if prefix cache: the hit tokens the pool would have had at other capacities.
//
// For each capacity scale s in kWhatIfScales, a ghost of the pool holds only block hashes,
// s times as many per block class (quant, sink) as the pool has blocks, in least-recently-
// used order. The ghosts see the same references the pool does: a prompt's chain looked up
// when a sequence is created (each hit is touched; the walk stops at the first miss, as the
// pool's does), and every tile sealed (inserted, or touched when it is already there). A
// hit counts the tile's tokens toward that scale's hit tokens.
//
// The ghosts are an estimate: they evict in plain LRU order, while the pool never evicts a
// block a sequence holds, and an Evict request or a tenant's cache quota does not reach
// them. Scale 1 is the ghost of the pool itself; comparing its hit ratio with the pool's
// measures how far the model is off on this traffic.
//
// A ghost entry costs about 40 bytes (a 64-bit digest of the hash, list links and the map
// slot): 7.5 entries per pool block over the four scales. Not thread-safe: KvCore
// serializes access under its lock.
#ifndef KVARN_DAEMON_CORE_WHATIF_H_
#define KVARN_DAEMON_CORE_WHATIF_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "daemon/core/block_ref.h"
#include "common/prefix_hash.h"

namespace kvarn {

inline constexpr std::array<double, 4> kWhatIfScales = {0.5, 1.0, 2.0, 4.0};

// A set of at most `capacity` keys in least-recently-used order.
class GhostLru {
 public:
  explicit GhostLru(size_t capacity);

  // Whether the key is present; a present key becomes the most recently used.
  bool Touch(uint64_t key);
  // Touches the key, or adds it as the most recently used and drops the least recently used
  // key beyond capacity.
  void Insert(uint64_t key);
  size_t size() const { return map_.size(); }
  size_t capacity() const { return capacity_; }

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  struct Node {
    uint64_t key;
    uint32_t prev, next;  // towards the most / least recently used end
  };
  void Unlink(uint32_t i);
  void PushFront(uint32_t i);

  size_t capacity_;
  std::vector<Node> nodes_;
  absl::flat_hash_map<uint64_t, uint32_t> map_;
  uint32_t head_ = kNone, tail_ = kNone;  // most and least recently used
};

class WhatIfCache {
 public:
  WhatIfCache(uint32_t quant_blocks, uint32_t sink_blocks);

  // A prompt's chain was looked up; class_of(i) is the block class of tile i.
  template <typename ClassOf>
  void Query(std::span<const BlockHash> chain, ClassOf class_of, uint64_t tile_tokens) {
    for (size_t s = 0; s < kWhatIfScales.size(); ++s) {
      for (size_t i = 0; i < chain.size(); ++i) {
        if (!ghost(s, class_of(i)).Touch(Key(chain[i]))) break;
        hit_tokens_[s] += tile_tokens;
      }
    }
  }
  // A tile of class c was sealed (or found sealed by another sequence).
  void Sealed(const BlockHash& hash, BlockClass c);

  // Cumulative hit tokens per scale, in kWhatIfScales order.
  const std::array<uint64_t, kWhatIfScales.size()>& hit_tokens() const { return hit_tokens_; }

 private:
  static uint64_t Key(const BlockHash& h);
  GhostLru& ghost(size_t scale, BlockClass c) { return c == BlockClass::kSink ? sink_[scale] : quant_[scale]; }

  std::vector<GhostLru> quant_, sink_;  // one per scale
  std::array<uint64_t, kWhatIfScales.size()> hit_tokens_{};
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_CORE_WHATIF_H_
