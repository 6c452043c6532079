// EndpointIndex: one kvarnd endpoint's cached blocks as a router learns them from Watch
// events, and the longest-prefix match of a prompt's block hashes against it. No gRPC and no
// threads here (the Router, client/lib/router.h, feeds it and locks it), so the matching
// rule is tested without a daemon (tests/client/lib/endpoint_index_test.cc).
//
// The index maps a block's prefix hash (common/prefix_hash.h) to the set of places the
// endpoint holds it: its pool, its disk tier, a remote tier (memcached). A stored event adds
// the place, a removed event takes it away; a hash in no place is forgotten.
//
// The match mirrors kvarnd's Lookup (KvCore::Lookup): first the run of blocks the pool holds
// from the prompt's start, then the run the tiers continue, each block counted in the first
// tier that holds it, local disk before remote. It stops at the first block held nowhere.
//
// Thread safety: none; the caller serializes access.
//
// Named apart from the daemon's PrefixIndex (daemon/core/prefix_index.h): tests link the
// client and an in-process daemon into one binary, where two classes of one name would be
// merged by the linker (tests/client/lib/odr_test.cc).
#ifndef KVARN_CLIENT_LIB_ENDPOINT_INDEX_H_
#define KVARN_CLIENT_LIB_ENDPOINT_INDEX_H_

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/prefix_hash.h"

namespace kvarn {

// Where a block is held, as bits.
enum TierBit : uint8_t {
  kInPool = 1u << 0,
  kInDisk = 1u << 1,    // tier "disk": this node's own
  kInRemote = 1u << 2,  // tier "memcached", or any other tier name: shared by nodes
};

// The bit of a BlockEvent.tier name: "pool" (or empty, from a daemon that sends no tier),
// "disk", anything else remote.
TierBit TierBitOf(std::string_view tier);

// Prompt tokens a prefix match covers, by where they are held.
struct TierTokens {
  uint64_t pool = 0;
  uint64_t disk = 0;
  uint64_t remote = 0;
  uint64_t total() const { return pool + disk + remote; }
};


// The match of one prompt given, per block in order, where that block is held (TierBit
// masks): the pool's run from the start, then the tiers' continuation.
TierTokens MatchPlaces(std::span<const uint8_t> places, uint32_t tile_tokens);

class EndpointIndex {
 public:
  // Applies one event: stored adds `bit` to the hash's places, removed takes it away.
  void Stored(const BlockHash& hash, TierBit bit);
  void Removed(const BlockHash& hash, TierBit bit);
  void Clear() { places_.clear(); }

  // Where the index holds `hash` (0: nowhere).
  uint8_t PlacesOf(const BlockHash& hash) const;
  // PlacesOf for each hash, in order.
  std::vector<uint8_t> Places(std::span<const BlockHash> hashes) const;
  // MatchPlaces(Places(hashes)).
  TierTokens Match(std::span<const BlockHash> hashes, uint32_t tile_tokens) const;

  size_t size() const { return places_.size(); }

 private:
  struct HashOf {
    size_t operator()(const BlockHash& h) const;
  };
  absl::flat_hash_map<BlockHash, uint8_t, HashOf> places_;
};

}  // namespace kvarn

#endif  // KVARN_CLIENT_LIB_ENDPOINT_INDEX_H_
