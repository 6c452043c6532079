// Synthetic K/V and the prepared inputs the codec benchmarks share: rings of fp16 tiles, the
// records encoded from them, and the 8 kv-head x 32K-token sequences of the attention
// benchmark, each built once on first use.
//
// The data are Gaussian-like with a per-channel spread (a few wide key channels, as real keys
// have). The codec's cost does not depend on the values: balancing runs a fixed number of
// iterations and every other step is data-independent, so any finite fp16 data measure the
// same work.
#ifndef KVARN_TESTS_BENCH_BENCH_DATA_H_
#define KVARN_TESTS_BENCH_BENCH_DATA_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/codec.h"

namespace kvarn::bench {

// Tiles of a ring cycled through by encode and decode, so that consecutive iterations do not
// reuse one L1-resident tile: 64 tiles of D=128 are 4 MiB of fp16 K+V, beyond L2.
inline constexpr int kRingTiles = 64;

// kRingTiles tiles of one head: fp16 K and V, each [G][D], in the original frame and in the
// rotated (storage) frame of rotating presets.
struct TileRing {
  int tile_tokens = 0;
  int head_dim = 0;
  std::vector<uint16_t> keys, values;                  // original frame
  std::vector<uint16_t> keys_rotated, values_rotated;  // x · H, rounded to fp16

  size_t TileElems() const { return static_cast<size_t>(tile_tokens) * head_dim; }
  TileIn Input(int i, Frame frame, bool rotates) const;
};
const TileRing& GetTileRing(int tile_tokens, int head_dim);

// kRingTiles records of `preset`, encoded by Codec::Simd() from GetTileRing.
const std::vector<uint8_t>& GetRecordRing(const Preset& preset, int head_dim);

// The fused-attention workload: kv_heads sequences of sink + tiles + partial tail tokens,
// heads_per_kv query heads each, and the same tokens as dense fp32 for the baseline.
struct AttentionData {
  static constexpr int kKvHeads = 8;
  static constexpr int kHeadsPerKv = 4;
  static constexpr int kHeadDim = 128;
  static constexpr int kSinkTokens = 128;  // one fp16 tile, the default sink
  static constexpr int kTiles = 255;       // quantized tiles per kv-head
  static constexpr int kTailTokens = 64;   // a half-full fp16 tail
  static constexpr int kTokens = kSinkTokens + kTiles * 128 + kTailTokens;  // 32,832

  Preset preset;               // kvarn_k4v2_g128
  std::vector<float> queries;  // [kv_head][kHeadsPerKv][D], original frame
  // Dense baselines: [kv_head][kTokens][D], original frame, as fp32 (the fp16 values widened)
  // and as the fp16 bits an unquantized cache would hold.
  std::vector<float> dense_keys, dense_values;
  std::vector<uint16_t> dense_keys16, dense_values16;

  struct Head {
    std::vector<uint16_t> sink_keys, sink_values, tail_keys, tail_values;  // storage frame
    std::vector<uint8_t> records;                                          // kTiles records
    std::vector<const uint8_t*> tiles;
    SequenceView View() const;
  };
  std::vector<Head> heads;

  const float* Queries(int kv_head) const;
  const float* DenseKeys(int kv_head) const;
  const float* DenseValues(int kv_head) const;
  const uint16_t* DenseKeys16(int kv_head) const;
  const uint16_t* DenseValues16(int kv_head) const;
  size_t QuantizedBytes() const;  // records + fp16 sink and tail, all kv-heads
  size_t DenseBytes() const;      // fp32 K+V, all kv-heads
  size_t DenseF16Bytes() const;   // fp16 K+V, all kv-heads
};
const AttentionData& GetAttentionData();

// Relative L2 distance of a from b.
double RelL2(const float* a, const float* b, size_t n);

}  // namespace kvarn::bench

#endif  // KVARN_TESTS_BENCH_BENCH_DATA_H_
