// The baselines for fused KVarN decode attention: dense decode attention over fp16 K/V (what a
// real unquantized cache holds) and over fp32 K/V, written
// to be as fast as a CPU allows so that the comparison is fair. Highway vectors, dispatched at
// run time like the codec; the query heads of one kv-head (grouped-query attention) are
// processed together, so every K and V row is read from memory exactly once; online softmax
// over blocks of tokens.
#ifndef KVARN_TESTS_BENCH_DENSE_ATTENTION_H_
#define KVARN_TESTS_BENCH_DENSE_ATTENTION_H_

#include <cstddef>
#include <cstdint>

namespace kvarn::bench {

// out[h] = softmax(scale * q[h] · Kᵀ) · V for h < heads. queries and out are [heads][D];
// keys and values [tokens][D], all fp32 in one frame.
// REQUIRES: 1 <= heads <= 8, head_dim a multiple of 32 (every target's float vector fits),
// tokens >= 1.
void DenseAttention(const float* queries, int heads, const float* keys, const float* values,
                    size_t tokens, int head_dim, float scale, float* out);
// The same over fp16 K/V (binary16 bits), widened to fp32 as they are loaded.
void DenseAttentionF16(const float* queries, int heads, const uint16_t* keys,
                       const uint16_t* values, size_t tokens, int head_dim, float scale,
                       float* out);

}  // namespace kvarn::bench

#endif  // KVARN_TESTS_BENCH_DENSE_ATTENTION_H_
