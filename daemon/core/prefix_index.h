// The prefix index: block hash -> the indexed (active or cached) block holding that tile.
// One index for both block classes; a hash names one position of one prompt chain, so a
// sink and a quantized block never share one. Not thread-safe: KvCore serializes access.
#ifndef KVARN_DAEMON_CORE_PREFIX_INDEX_H_
#define KVARN_DAEMON_CORE_PREFIX_INDEX_H_

#include <cstddef>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "daemon/core/block_ref.h"
#include "common/prefix_hash.h"

namespace kvarn {

class PrefixIndex {
 public:
  std::optional<BlockRef> Find(const BlockHash& hash) const {
    auto it = map_.find(hash);
    if (it == map_.end()) return std::nullopt;
    return it->second;
  }
  // REQUIRES: no block has `hash` yet.
  bool Insert(const BlockHash& hash, BlockRef block) { return map_.emplace(hash, block).second; }
  void Erase(const BlockHash& hash) { map_.erase(hash); }
  size_t size() const { return map_.size(); }

 private:
  absl::flat_hash_map<BlockHash, BlockRef> map_;
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_CORE_PREFIX_INDEX_H_
