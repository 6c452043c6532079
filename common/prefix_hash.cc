#include "common/prefix_hash.h"

#include "common/sha256.h"

namespace kvarn {

BlockHash TenantSalt(std::string_view tenant, std::string_view secret) {
  return Sha256().Tag("kvarn-tenant-v1").Str(secret).Str(tenant).Finish();
}

BlockHash NamespaceDigest(const HashNamespaceInput& in) {
  return Sha256()
      .Tag("kvarn-ns-v1")
      .Str(in.model_id)
      .U32(in.num_layers)
      .U32(in.num_kv_heads)
      .U32(in.head_dim)
      .U32(in.tile_tokens)
      .Str(in.preset)
      .U32(in.sink_tokens)
      .Bytes(in.tenant_salt.data(), in.tenant_salt.size())
      .Finish();
}

BlockHash ChainHash(const BlockHash& parent, const BlockHash& ns, std::span<const uint32_t> tokens) {
  Sha256 sha;
  sha.Bytes(parent.data(), parent.size()).Bytes(ns.data(), ns.size());
  for (uint32_t t : tokens) sha.U32(t);
  return sha.Finish();
}

std::vector<BlockHash> PromptBlockHashes(const BlockHash& ns, uint32_t tile_tokens, std::span<const uint32_t> prompt) {
  const size_t g = tile_tokens;
  const size_t blocks = prompt.empty() || g == 0 ? 0 : (prompt.size() - 1) / g;
  std::vector<BlockHash> hashes;
  hashes.reserve(blocks);
  BlockHash parent = kRootHash;
  for (size_t i = 0; i < blocks; ++i) {
    parent = ChainHash(parent, ns, prompt.subspan(i * g, g));
    hashes.push_back(parent);
  }
  return hashes;
}

std::string HashToHex(const BlockHash& h) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s(64, '0');
  for (size_t i = 0; i < h.size(); ++i) {
    s[2 * i] = kHex[h[i] >> 4];
    s[2 * i + 1] = kHex[h[i] & 15];
  }
  return s;
}

}  // namespace kvarn
