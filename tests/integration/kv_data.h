// Deterministic K/V for the integration tests, shared by the test binary and the
// kvarn_test_client helper process: the K/V of a token are a function of its token id, so
// two processes appending the same prompt write identical data, and a test can recompute
// what any client appended.
#ifndef KVARN_TESTS_INTEGRATION_KV_DATA_H_
#define KVARN_TESTS_INTEGRATION_KV_DATA_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/lib/client.h"

namespace kvarn::it {

// The small model every integration test and the chaos run use: L=2 layers, 2 kv-heads,
// D=64, 64-token tiles, KVarN 4-bit keys / 2-bit values, first tile kept fp16 (sink).
Layout SmallLayout();

// Token ids first, first + 1, ..., first + n - 1.
std::vector<uint32_t> Tokens(uint32_t first, size_t n);

// Original-frame K/V of the tokens, laid out [n][layers][kv_heads][head_dim] (what
// Session::Append takes), standard normal, rounded to fp16 so that what a client appends
// with DType::kF16 is exactly these values. `salt` varies the data for the same ids.
struct KvData {
  std::vector<uint16_t> keys, values;  // fp16 bits
  std::vector<float> KeysF32() const;
  std::vector<float> ValuesF32() const;
};
KvData MakeKv(std::span<const uint32_t> tokens, const Layout& layout, uint64_t salt = 0);

// Appends tokens[from, to) to `seq` in tail-sized pieces (never past the tail), alternating
// between in-place Stage+Commit (shared memory) and AppendInline (K/V in the request) when
// `mixed`, else in place only. Returns the last table.
absl::StatusOr<SequenceTable> AppendTokens(Session& session, uint64_t seq,
                                           std::span<const uint32_t> tokens, size_t from,
                                           size_t to, bool mixed = true, uint64_t salt = 0);

// FNV-1a 64 of bytes, as 16 hex digits.
uint64_t Fnv64(const void* data, size_t bytes);
std::string Hex64(uint64_t x);

// Digest of a quantized block read in place: the raw record bytes, and the dequantized
// keys and values of every (layer, head) tile.
struct BlockDigest {
  uint64_t raw = 0;
  uint64_t dequantized = 0;
};
absl::StatusOr<BlockDigest> DigestQuantBlock(const Session& session, uint32_t block);
uint64_t DigestSinkBlock(const Session& session, uint32_t block);

}  // namespace kvarn::it

#endif  // KVARN_TESTS_INTEGRATION_KV_DATA_H_
