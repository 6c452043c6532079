// The encoder's peer: a q4_0 KV-cache quantizer as llama.cpp stores its cache with
// `--cache-type-k q4_0 --cache-type-v q4_0`. Written here from the format's description, not
// copied: blocks of 32 values; one fp16 scale d = m / -8, where m is the block's value of
// largest magnitude (with its sign); codes min(15, trunc(x / d + 8.5)), two per byte (value j
// of the block in the low nibble of byte j, value j + 16 in the high nibble).
//
// Plain scalar C++ that the compiler may vectorize, as llama.cpp's reference quantizer is;
// fp16 inputs are widened through a 64K-entry table, as ggml does without F16C.
#ifndef KVARN_TESTS_BENCH_Q4_0_PEER_H_
#define KVARN_TESTS_BENCH_Q4_0_PEER_H_

#include <cstddef>
#include <cstdint>

namespace kvarn::bench {

inline constexpr int kQ4_0BlockValues = 32;

struct BlockQ4_0 {
  uint16_t d;      // fp16 scale
  uint8_t qs[16];  // 32 codes, 4 bits each
};
static_assert(sizeof(BlockQ4_0) == 18);

// Quantizes n fp16 values (bit patterns) into n / 32 blocks. REQUIRES: n % 32 == 0.
void QuantizeQ4_0(const uint16_t* x, size_t n, BlockQ4_0* out);

// Value i of the quantized row, for checking the peer.
float DequantizeQ4_0(const BlockQ4_0* blocks, size_t i);

}  // namespace kvarn::bench

#endif  // KVARN_TESTS_BENCH_Q4_0_PEER_H_
