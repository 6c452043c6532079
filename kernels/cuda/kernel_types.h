// Plain data shared by the host API of the CUDA codec and its kernels: the attention block
// table entry and the error bits the kernels report (no CUDA include, usable anywhere).
#ifndef KVARN_KERNELS_CUDA_KERNEL_TYPES_H_
#define KVARN_KERNELS_CUDA_KERNEL_TYPES_H_

#include <cstdint>

namespace kvarn::cuda {

// One sequence's block table as fused decode attention reads it: the fp16 sink block (the
// first tokens, never quantized), the quantized blocks tile_ids[first_tile ..
// first_tile + num_tiles) in order, and the fp16 tail block. Block ids index the pool's
// quantized and fp16 block arrays; a part with 0 tokens is skipped and its id ignored.
// Lives in device memory, one per sequence of a batch.
struct AttendSequence {
  int32_t sink_block = -1;
  int32_t sink_tokens = 0;  // 0..G
  int32_t tail_block = -1;
  int32_t tail_tokens = 0;  // 0..G
  int32_t first_tile = 0;
  int32_t num_tiles = 0;
};

// Error bits of one slot of EncodeBlock (OR-ed into its status word).
inline constexpr int32_t kStatusBadKeys = 1;          // NaN, Inf or |x| > 65504 in the keys
inline constexpr int32_t kStatusBadValues = 2;        // same in the values
inline constexpr int32_t kStatusKeyScaleRange = 4;    // a key scale does not fit in fp16
inline constexpr int32_t kStatusValueScaleRange = 8;  // a value scale does not fit in fp16

// Error bits of one sequence of an attention batch (OR-ed into its status word).
inline constexpr int32_t kAttendBadSequence = 1;  // token counts out of range, or no tokens at all
inline constexpr int32_t kAttendBadBlockId = 2;   // a block id outside the pool; that part skipped

// Error bits of one token of StoreTokens (OR-ed over kv-heads).
inline constexpr int32_t kStoreBadInput =
    1;  // NaN, Inf or |x| > 65504: nothing written for that head
inline constexpr int32_t kStoreOverflow = 2;  // a rotated element overflows fp16: nothing written

// Error bit of DecodeBlock: a record scale is not finite (not written by the encoder).
inline constexpr int32_t kDecodeCorruptRecord = 16;

}  // namespace kvarn::cuda

#endif  // KVARN_KERNELS_CUDA_KERNEL_TYPES_H_
