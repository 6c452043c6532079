// SHA-256 through OpenSSL's EVP interface, with the little-endian framing the prefix hash
// (docs/prefix_hash.md) and the tier records (daemon/core/block_record.h) use.
#ifndef KVARN_COMMON_SHA256_H_
#define KVARN_COMMON_SHA256_H_

#include <openssl/evp.h>

#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "common/prefix_hash.h"

namespace kvarn {

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
  Sha256& U64(uint64_t v) { return U32(static_cast<uint32_t>(v)).U32(static_cast<uint32_t>(v >> 32)); }
  BlockHash Finish() {
    BlockHash h;
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx_, h.data(), &len);
    return h;
  }

 private:
  EVP_MD_CTX* ctx_;
};


}  // namespace kvarn

#endif  // KVARN_COMMON_SHA256_H_
