// Argument checking and launch configuration of the CUDA kernels, in plain C++ (no CUDA
// include): the host API (cuda_codec.cc) launches what these functions build, and the block
// emulator tests (tests/gpu) run the same kernel bodies with the same parameters on the CPU.
// Not part of the public API.
#ifndef KVARN_KERNELS_CUDA_PARAMS_H_
#define KVARN_KERNELS_CUDA_PARAMS_H_

#include <cstddef>
#include <cstdint>

#include "kernels/block_layout.h"
#include "kernels/cuda/attend_body.h"
#include "kernels/cuda/decode_store_body.h"
#include "kernels/cuda/encode_body.h"
#include "kernels/cuda/types.h"
#include "kernels/preset.h"
#include "kernels/status.h"

namespace kvarn::cuda {

// The limits of an H100/H200 (sm_90), for tests that plan launches without a device.
inline constexpr DeviceLimits kHopperLimits{132, 227 * 1024};

// The preset is well formed and the layout matches it (tile tokens, record bytes, head_dim).
CodecStatus CheckLayout(const Preset& preset, const BlockLayout& layout);

struct EncodeLaunch {
  EncodeParams params;
  int grid = 0;              // blocks; each loops over work items 2 * slot + (0 K | 1 V)
  size_t scratch_bytes = 0;  // global memory for tiles that do not fit shared memory, or 0
};
CodecStatus BuildEncode(const Preset& preset, const BlockLayout& layout, const TileSource& in,
                        uint8_t* quant_block, int32_t* status, int iterations,
                        const DeviceLimits& limits, EncodeLaunch* out);

struct DecodeLaunch {
  DecodeParams params;
  int grid = 0;  // work items 2 * slot + (0 K | 1 V)
};
CodecStatus BuildDecode(const Preset& preset, const BlockLayout& layout, const uint8_t* quant_block,
                        const TileSink& out_tiles, int32_t* status, DecodeLaunch* out);

struct StoreLaunch {
  StoreParams params;
  int grid = 0;  // work items token * num_kv_heads + head
  size_t smem_bytes = 0;
};
CodecStatus BuildStore(const Preset& preset, const BlockLayout& layout, const TokenSource& in,
                       int num_tokens, int layer, int token_offset, uint16_t* fp16_block,
                       int32_t* status, StoreLaunch* out);

struct AttendLaunch {
  AttendParams params;
  int head_chunk = 0;  // HC: query heads per block (template argument of the kernel)
  int grid_x = 0, grid_y = 0, grid_z = 0;  // splits, kv-heads * head chunks, sequences
  CombineParams combine;
  int combine_rows = 0;  // num_seqs * num_q_heads, when num_splits > 1
};
CodecStatus BuildAttend(const Preset& preset, const BlockLayout& layout, const AttendArgs& args,
                        const DeviceLimits& limits, AttendLaunch* out);

inline constexpr int kMaxAttendSplits = 256;

}  // namespace kvarn::cuda

#endif  // KVARN_KERNELS_CUDA_PARAMS_H_
