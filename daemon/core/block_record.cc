#include "daemon/core/block_record.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/core/check.h"
#include "common/sha256.h"

namespace kvarn {
namespace {

constexpr char kMagic[8] = {'K', 'V', 'A', 'R', 'N', 'B', 'L', 'K'};
constexpr uint32_t kVersion = 1;
constexpr size_t kMacOffset = 160;

void PutU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void PutU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t GetU32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t GetU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// HMAC-SHA256 over the header before the MAC field, then the payload.
BlockHash Mac(const BlockHash& key, const uint8_t* header, std::span<const uint8_t> payload) {
  EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  EVP_MAC_CTX* ctx = mac == nullptr ? nullptr : EVP_MAC_CTX_new(mac);
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                               OSSL_PARAM_construct_end()};
  BlockHash out{};
  size_t len = 0;
  // Allocation failure is out of memory, not an input error.
  if (ctx == nullptr || EVP_MAC_init(ctx, key.data(), key.size(), params) != 1 ||
      EVP_MAC_update(ctx, header, kMacOffset) != 1 || EVP_MAC_update(ctx, payload.data(), payload.size()) != 1 ||
      EVP_MAC_final(ctx, out.data(), &len, out.size()) != 1 || len != out.size()) {
    std::abort();
  }
  EVP_MAC_CTX_free(ctx);
  EVP_MAC_free(mac);
  return out;
}

absl::Status Fault(RecordFault* out, RecordFault f, std::string why) {
  if (out != nullptr) *out = f;
  return absl::DataLossError(absl::StrCat(RecordFaultName(f), " block record: ", why));
}

}  // namespace

const char* RecordFaultName(RecordFault f) {
  switch (f) {
    case RecordFault::kTruncated: return "truncated";
    case RecordFault::kCorrupt: return "corrupt";
    case RecordFault::kForeign: return "foreign";
    case RecordFault::kWrongKey: return "wrong_key";
  }
  return "unknown";
}

TierIdentity MakeTierIdentity(const ModelConfig& model, uint32_t tile_tokens, uint64_t quant_block_bytes,
                              uint64_t sink_block_bytes, std::string_view secret) {
  TierIdentity id;
  id.fingerprint = Sha256()
                       .Tag("kvarn-tier-v2")  // v2: token-major fp16 blocks (2026-12-04)
                       .Str(model.model_id)
                       .U32(model.num_layers)
                       .U32(model.num_kv_heads)
                       .U32(model.head_dim)
                       .U32(tile_tokens)
                       .Str(model.preset)
                       .U32(model.sink_tokens)
                       .U64(quant_block_bytes)
                       .U64(sink_block_bytes)
                       .Finish();
  id.mac_key = Sha256().Tag("kvarn-tier-mac-v1").Str(secret).Finish();
  id.quant_block_bytes = quant_block_bytes;
  id.sink_block_bytes = sink_block_bytes;
  return id;
}

std::string NewRecord(const TierIdentity& id, BlockClass cls) {
  return std::string(kRecordHeaderBytes + id.payload_bytes(cls), '\0');
}

void SealRecord(const TierIdentity& id, const RecordMeta& meta, std::string& record) {
  uint8_t* h = reinterpret_cast<uint8_t*>(record.data());
  std::memset(h, 0, kRecordHeaderBytes);
  std::memcpy(h, kMagic, sizeof(kMagic));
  PutU32(h + 8, kVersion);
  PutU32(h + 12, kRecordHeaderBytes);
  std::memcpy(h + 16, id.fingerprint.data(), 32);
  std::memcpy(h + 48, meta.hash.data(), 32);
  std::memcpy(h + 80, meta.parent.data(), 32);
  PutU32(h + 112, static_cast<uint32_t>(meta.cls));
  PutU32(h + 116, meta.tile_index);
  PutU64(h + 120, record.size() - kRecordHeaderBytes);
  std::memcpy(h + 128, meta.ns.data(), 32);
  const BlockHash mac = Mac(id.mac_key, h, RecordPayload(record));
  std::memcpy(h + kMacOffset, mac.data(), 32);
}

absl::StatusOr<RecordMeta> CheckRecord(const TierIdentity& id, std::span<const uint8_t> record, const BlockHash* expect,
                                       RecordFault* fault, bool verify_mac) {
  if (record.size() < kRecordHeaderBytes) {
    return Fault(fault, RecordFault::kTruncated, absl::StrCat(record.size(), " bytes, shorter than the header"));
  }
  const uint8_t* h = record.data();
  if (std::memcmp(h, kMagic, sizeof(kMagic)) != 0) return Fault(fault, RecordFault::kCorrupt, "bad magic");
  if (GetU32(h + 8) != kVersion) return Fault(fault, RecordFault::kCorrupt, absl::StrCat("version ", GetU32(h + 8)));
  if (GetU32(h + 12) != kRecordHeaderBytes) return Fault(fault, RecordFault::kCorrupt, "bad header size");
  const uint32_t cls = GetU32(h + 112);
  if (cls > 1) return Fault(fault, RecordFault::kCorrupt, absl::StrCat("class ", cls));
  RecordMeta meta;
  meta.cls = static_cast<BlockClass>(cls);
  const uint64_t payload = GetU64(h + 120);
  if (payload > record.size() - kRecordHeaderBytes) {
    return Fault(fault, RecordFault::kTruncated,
                 absl::StrCat(record.size() - kRecordHeaderBytes, " payload bytes of ", payload));
  }
  if (payload != record.size() - kRecordHeaderBytes) {
    return Fault(fault, RecordFault::kCorrupt, absl::StrCat("trailing bytes after a ", payload, "-byte payload"));
  }
  // The MAC before the fields it covers are believed.
  if (verify_mac && CRYPTO_memcmp(Mac(id.mac_key, h, record.subspan(kRecordHeaderBytes)).data(), h + kMacOffset, 32) != 0) {
    return Fault(fault, RecordFault::kCorrupt, "MAC mismatch (changed bytes, or another tier key)");
  }
  if (std::memcmp(h + 16, id.fingerprint.data(), 32) != 0) {
    return Fault(fault, RecordFault::kForeign, "another pool's fingerprint (model, layout or preset)");
  }
  if (payload != id.payload_bytes(meta.cls)) {
    return Fault(fault, RecordFault::kForeign, absl::StrCat(payload, " payload bytes, the pool's blocks have ",
                                                            id.payload_bytes(meta.cls)));
  }
  std::memcpy(meta.hash.data(), h + 48, 32);
  std::memcpy(meta.parent.data(), h + 80, 32);
  std::memcpy(meta.ns.data(), h + 128, 32);
  meta.tile_index = GetU32(h + 116);
  if (expect != nullptr && meta.hash != *expect) {
    return Fault(fault, RecordFault::kWrongKey, absl::StrCat("holds block ", HashToHex(meta.hash).substr(0, 16),
                                                             " under key ", HashToHex(*expect).substr(0, 16)));
  }
  return meta;
}

RecordMeta PeekRecord(std::string_view record) {
  KVARN_CHECK(record.size() >= kRecordHeaderBytes, "a checked record has a header");
  const uint8_t* h = reinterpret_cast<const uint8_t*>(record.data());
  RecordMeta meta;
  std::memcpy(meta.hash.data(), h + 48, 32);
  std::memcpy(meta.parent.data(), h + 80, 32);
  meta.cls = GetU32(h + 112) == 1 ? BlockClass::kSink : BlockClass::kQuant;
  meta.tile_index = GetU32(h + 116);
  std::memcpy(meta.ns.data(), h + 128, 32);
  return meta;
}

}  // namespace kvarn
