#include "client/lib/endpoint_index.h"

#include <cstring>

namespace kvarn {

TierBit TierBitOf(std::string_view tier) {
  if (tier.empty() || tier == "pool") return kInPool;
  if (tier == "disk") return kInDisk;
  return kInRemote;
}

TierTokens MatchPlaces(std::span<const uint8_t> places, uint32_t tile_tokens) {
  TierTokens t;
  size_t i = 0;
  for (; i < places.size() && (places[i] & kInPool); ++i) t.pool += tile_tokens;
  for (; i < places.size(); ++i) {
    if (places[i] & kInDisk) {
      t.disk += tile_tokens;
    } else if (places[i] & kInRemote) {
      t.remote += tile_tokens;
    } else {
      // A pool-only block after the pool's run cannot occur in kvarnd (a block's parent is
      // resident before it), and Lookup would not count it either: the match ends.
      break;
    }
  }
  return t;
}

size_t EndpointIndex::HashOf::operator()(const BlockHash& h) const {
  size_t v;  // the hash is SHA-256 output: any 8 of its bytes are uniform
  std::memcpy(&v, h.data(), sizeof v);
  return v;
}

void EndpointIndex::Stored(const BlockHash& hash, TierBit bit) { places_[hash] |= bit; }

void EndpointIndex::Removed(const BlockHash& hash, TierBit bit) {
  auto it = places_.find(hash);
  if (it == places_.end()) return;
  it->second &= static_cast<uint8_t>(~bit);
  if (it->second == 0) places_.erase(it);
}

uint8_t EndpointIndex::PlacesOf(const BlockHash& hash) const {
  auto it = places_.find(hash);
  return it == places_.end() ? 0 : it->second;
}

std::vector<uint8_t> EndpointIndex::Places(std::span<const BlockHash> hashes) const {
  std::vector<uint8_t> out;
  out.reserve(hashes.size());
  for (const BlockHash& h : hashes) out.push_back(PlacesOf(h));
  return out;
}

TierTokens EndpointIndex::Match(std::span<const BlockHash> hashes, uint32_t tile_tokens) const {
  return MatchPlaces(Places(hashes), tile_tokens);
}

}  // namespace kvarn
