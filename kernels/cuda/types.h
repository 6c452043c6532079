// Plain argument types and sizing helpers of the CUDA codec's host API
// (kernels/cuda/cuda_codec.h). No CUDA include: the pointers are device pointers, but the
// types are usable anywhere.
#ifndef KVARN_KERNELS_CUDA_TYPES_H_
#define KVARN_KERNELS_CUDA_TYPES_H_

#include <cstddef>
#include <cstdint>

#include "kernels/block_layout.h"
#include "kernels/codec.h"
#include "kernels/cuda/kernel_types.h"

namespace kvarn::cuda {

// What the launchers need to know about the device (QueryDevice fills it).
struct DeviceLimits {
  int num_sms = 0;
  size_t max_smem_per_block = 0;  // opt-in maximum of dynamic shared memory per block
};

// K/V tiles to encode, one per slot (layer-major (layer, kv-head) pair) of a block: the tile
// of slot s starts at keys/values + s * slot_stride elements, G rows of D, row t at
// t * row_stride (0: D, [G][D] contiguous). Fp16BlockSource() describes an fp16 pool block
// (storage frame, binary16, token-major: slot_stride 2D, row_stride fp16_token_elems()).
struct TileSource {
  const void* keys = nullptr;
  const void* values = nullptr;
  size_t slot_stride = 0;  // elements
  DType dtype = DType::kF16;
  Frame frame = Frame::kStorage;
  size_t row_stride = 0;  // elements; 0: D

  // Elements from keys (or values) to the end of the last slot's last row.
  size_t Extent(const BlockLayout& layout) const {
    const size_t d = static_cast<size_t>(layout.head_dim);
    return (layout.slots() - 1) * slot_stride +
           static_cast<size_t>(layout.tile_tokens - 1) * (row_stride != 0 ? row_stride : d) + d;
  }
};

// Where decoded tiles go: same shape conventions as TileSource.
struct TileSink {
  void* keys = nullptr;
  void* values = nullptr;
  size_t slot_stride = 0;  // elements
  DType dtype = DType::kF32;
  Frame frame = Frame::kOriginal;
};

// StoreTokens' `layer` for a source holding every layer.
inline constexpr int kAllLayers = -1;

// New tokens in the model's (original) frame: keys and values [num_tokens][num_kv_heads][D]
// for one layer, or [num_tokens][num_layers][num_kv_heads][D] for all (kAllLayers; the
// layout of Codec::StoreTokens).
struct TokenSource {
  const void* keys = nullptr;
  const void* values = nullptr;
  DType dtype = DType::kF16;
};

// Decode attention over a batch of sequences' block tables, for one layer.
struct AttendArgs {
  const uint8_t* quant_pool = nullptr;  // quantized block b at quant_pool + b * quant_block_bytes()
  int64_t num_quant_blocks = 0;         // ids outside [0, n) are rejected (kAttendBadBlockId)
  const uint16_t* fp16_pool = nullptr;  // fp16 block b at fp16_pool + b * fp16_block_bytes() bytes
  int64_t num_fp16_blocks = 0;
  const AttendSequence* seqs = nullptr;  // [num_seqs]
  int num_seqs = 0;
  const int32_t* tile_ids = nullptr;  // quantized block ids, indexed by AttendSequence::first_tile
  int layer = 0;
  int num_q_heads = 0;  // a multiple of num_kv_heads; query head h reads kv-head h / (Hq / Hkv)
  const float* queries = nullptr;  // [num_seqs][num_q_heads][D], original frame
  float* out = nullptr;            // [num_seqs][num_q_heads][D], original frame
  // Optional, [num_seqs][num_q_heads]: natural-log sum of exp(scaled scores) per query head,
  // as Codec::AttendDecode's lse; -inf for a rejected sequence (no token attended).
  float* lse = nullptr;
  float softmax_scale = 0.0f;      // 0: 1/sqrt(D)
  int num_splits = 1;              // > 1: split-K over the sequence's units, then combine
  void* workspace = nullptr;       // AttendWorkspaceBytes() bytes when num_splits > 1
  size_t workspace_bytes = 0;
  int32_t* status = nullptr;  // [num_seqs] error bits, or null
};

// The fp16 pool block `block` as an encode source.
inline TileSource Fp16BlockSource(const BlockLayout& layout, const uint16_t* block) {
  TileSource s;
  s.keys = block;
  s.values = block + layout.head_dim;
  s.slot_stride = layout.fp16_pair_elems();
  s.row_stride = layout.fp16_token_elems();
  s.dtype = DType::kF16;
  s.frame = Frame::kStorage;
  return s;
}

// Bytes of AttendArgs::workspace for a split-K launch (0 when num_splits <= 1).
size_t AttendWorkspaceBytes(const BlockLayout& layout, int num_seqs, int num_q_heads,
                            int num_splits);

// A split count that gives the device about two blocks per SM, with at least two units
// (tiles) per split; 1 when the batch alone fills the device.
int SuggestAttendSplits(const DeviceLimits& limits, const BlockLayout& layout, int num_seqs,
                        int num_q_heads, int max_tiles_per_seq);

}  // namespace kvarn::cuda

#endif  // KVARN_KERNELS_CUDA_TYPES_H_
