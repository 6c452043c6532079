// The prefix-cache key of a block: a SHA-256 chain over the token ids of each full tile,
// inside a namespace that covers everything that changes the bytes of a block. The exact
// byte encoding, and test vectors, are in docs/prefix_hash.md; the hash is the same across
// processes, restarts and machines.
#ifndef KVARN_DAEMON_CORE_PREFIX_HASH_H_
#define KVARN_DAEMON_CORE_PREFIX_HASH_H_

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvarn {

using BlockHash = std::array<uint8_t, 32>;

inline constexpr BlockHash kRootHash{};  // parent of a sequence's first block: 32 zero bytes

// What the namespace covers. Two requests share cache entries only if all fields match.
struct HashNamespaceInput {
  std::string model_id;
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t tile_tokens = 0;
  std::string preset;
  uint32_t sink_tokens = 0;
  BlockHash tenant_salt{};
};

// tenant_salt = SHA-256("kvarn-tenant-v1" || u32 len(secret) || secret || u32 len(tenant) || tenant).
// With cross-tenant sharing configured, the daemon passes the same tenant string for all.
BlockHash TenantSalt(std::string_view tenant, std::string_view secret);

// ns = SHA-256("kvarn-ns-v1" || u32 len || model_id || u32 num_layers || u32 num_kv_heads ||
//              u32 head_dim || u32 tile_tokens || u32 len || preset || u32 sink_tokens || salt)
BlockHash NamespaceDigest(const HashNamespaceInput& in);

// hash = SHA-256(parent || ns || u32 token id × tile), integers little-endian.
BlockHash ChainHash(const BlockHash& parent, const BlockHash& ns, std::span<const uint32_t> tokens);

// The hashes of the blocks a prompt may adopt: its full tiles, at most (size - 1) / tile_tokens
// of them (the worker still computes the last prompt token), each chained on the one before.
// The daemon's prefix index and a router's (client/lib/router.h) key blocks by these.
std::vector<BlockHash> PromptBlockHashes(const BlockHash& ns, uint32_t tile_tokens, std::span<const uint32_t> prompt);

std::string HashToHex(const BlockHash& h);

}  // namespace kvarn

#endif  // KVARN_DAEMON_CORE_PREFIX_HASH_H_
