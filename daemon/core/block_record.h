// The bytes of one block outside the pool: the record a tier (disk, memcached) stores. A
// fixed 192-byte header, then the block's bytes exactly as the pool holds them (a quantized
// block's records back to back, or an fp16 sink block).
//
//   offset size  field
//        0    8  magic "KVARNBLK"
//        8    4  version (1)
//       12    4  header bytes (192)
//       16   32  pool fingerprint: model, layout, preset and block sizes (PoolFingerprint)
//       48   32  prefix hash of the block (the key it is stored under)
//       80   32  prefix hash of its parent (32 zero bytes for a sequence's first tile)
//      112    4  class: 0 quantized, 1 fp16 sink
//      116    4  tile index: the block's position in its chain (0 = first tile)
//      120    8  payload bytes
//      128   32  namespace digest of the prefix hashes (the tenant's, prefix_hash.h)
//      160   32  HMAC-SHA256 over bytes [0, 160) and the payload, keyed by the tier key
// Integers little-endian. The tier key derives from the daemon's tenant_salt_secret, which
// every node sharing a tier must share anyway (it salts the prefix hashes): a record built by
// anyone without it, or changed after it was built, fails the MAC. A record is served only if
// every field matches what the reader expects (RecordFault says which did not).
#ifndef KVARN_DAEMON_CORE_BLOCK_RECORD_H_
#define KVARN_DAEMON_CORE_BLOCK_RECORD_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "daemon/core/block_ref.h"
#include "daemon/core/core_types.h"
#include "common/prefix_hash.h"

namespace kvarn {

inline constexpr size_t kRecordHeaderBytes = 192;

// Why a record was not served.
enum class RecordFault : uint8_t {
  kTruncated = 0,  // shorter than its header says (or than a header)
  kCorrupt = 1,    // bad magic, version or size fields, or the MAC does not match
  kForeign = 2,    // another pool's fingerprint: another model, layout or preset
  kWrongKey = 3,   // a valid record, but of another block than the one asked for
};
inline constexpr int kRecordFaults = 4;
const char* RecordFaultName(RecordFault f);  // "truncated", "corrupt", "foreign", "wrong_key"

// What a pool's records must carry to be served by it.
struct TierIdentity {
  BlockHash fingerprint{};
  BlockHash mac_key{};
  uint64_t quant_block_bytes = 0;
  uint64_t sink_block_bytes = 0;
  uint64_t payload_bytes(BlockClass c) const { return c == BlockClass::kQuant ? quant_block_bytes : sink_block_bytes; }
};

// fingerprint = SHA-256("kvarn-tier-v2" || model fields as in NamespaceDigest (no salt) ||
// u64 quant_block_bytes || u64 sink_block_bytes); mac_key = SHA-256("kvarn-tier-mac-v1" ||
// u32 len || secret). The tag names the block layouts: v2 since fp16 blocks became
// token-major, so a tier written by an older kvarnd (same sizes, other layout) is foreign.
TierIdentity MakeTierIdentity(const ModelConfig& model, uint32_t tile_tokens, uint64_t quant_block_bytes,
                              uint64_t sink_block_bytes, std::string_view secret);

struct RecordMeta {
  BlockHash hash{};
  BlockHash parent{};
  BlockClass cls = BlockClass::kQuant;
  uint32_t tile_index = 0;
  BlockHash ns{};  // the namespace its hash chain was computed in
};

// A record for `meta` with room for its payload: kRecordHeaderBytes + payload_bytes(cls)
// bytes; the caller writes the payload at kRecordHeaderBytes, then calls SealRecord.
std::string NewRecord(const TierIdentity& id, BlockClass cls);
// Fills the header of `record` (whose payload is written) and its MAC.
void SealRecord(const TierIdentity& id, const RecordMeta& meta, std::string& record);

// Checks every header field and the MAC. `expect` is the key it was fetched under (nullptr
// when scanning a tier whose keys come from the records). On failure, *fault says why and
// the status message names the field.
// `verify_mac` false skips the MAC (one pass over the block, ~2 ms for a 3.4 MB block): only
// for a record this process sealed itself and kept in its memory (a tier's write-behind
// queue), never for bytes read back from a disk or a server.
absl::StatusOr<RecordMeta> CheckRecord(const TierIdentity& id, std::span<const uint8_t> record, const BlockHash* expect,
                                       RecordFault* fault, bool verify_mac = true);
inline absl::StatusOr<RecordMeta> CheckRecord(const TierIdentity& id, std::string_view record, const BlockHash* expect,
                                              RecordFault* fault, bool verify_mac = true) {
  return CheckRecord(id, std::span(reinterpret_cast<const uint8_t*>(record.data()), record.size()), expect, fault,
                     verify_mac);
}

// The header fields of a record CheckRecord accepted (no check of its own: a tier's Get has
// validated what it returns).
RecordMeta PeekRecord(std::string_view record);

inline std::span<const uint8_t> RecordPayload(std::string_view record) {
  return std::span(reinterpret_cast<const uint8_t*>(record.data()) + kRecordHeaderBytes,
                   record.size() - kRecordHeaderBytes);
}

}  // namespace kvarn

#endif  // KVARN_DAEMON_CORE_BLOCK_RECORD_H_
