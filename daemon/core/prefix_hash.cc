#include "daemon/core/prefix_hash.h"

#include <openssl/evp.h>

#include <cstdlib>

namespace kvarn {
namespace {

// One SHA-256 computation through OpenSSL's EVP interface. Allocation failure of the
// context is a broken invariant (out of memory), not an input error.
class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new()) {
    if (ctx_ == nullptr || EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) != 1) std::abort();
  }
  ~Sha256() { EVP_MD_CTX_free(ctx_); }
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  Sha256& Bytes(const void* data, size_t n) {
    EVP_DigestUpdate(ctx_, data, n);
    return *this;
  }
  Sha256& U32(uint32_t v) {
    const uint8_t le[4] = {static_cast<uint8_t>(v), static_cast<uint8_t>(v >> 8),
                           static_cast<uint8_t>(v >> 16), static_cast<uint8_t>(v >> 24)};
    return Bytes(le, 4);
  }
  Sha256& Str(std::string_view s) { return U32(static_cast<uint32_t>(s.size())).Bytes(s.data(), s.size()); }
  Sha256& Tag(std::string_view s) { return Bytes(s.data(), s.size()); }
  BlockHash Finish() {
    BlockHash h;
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx_, h.data(), &len);
    return h;
  }

 private:
  EVP_MD_CTX* ctx_;
};

}  // namespace

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
