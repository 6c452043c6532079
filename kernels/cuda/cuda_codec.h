// The KVarN codec on NVIDIA GPUs: encode the tiles of a pool block into records, decode
// records, rotate new tokens into an fp16 tail block, and fused decode attention over block
// tables (KVARN_SPEC.md). Numerics are the CPU codec's (kernels/codec.h): records are the
// same bits as Codec::Reference() produces (up to the rare argument where libm's expf/logf
// is not correctly rounded), decoded tiles and stored tokens are bit-identical, attention
// agrees within fp32 rounding.
//
// Conventions for every function:
//  - All data pointers are device pointers. Block layout and preset must match
//    (CheckLayout); a block's slots are its (layer, kv-head) pairs, layer-major.
//  - Arguments are checked on the host; a bad argument returns INVALID_ARGUMENT and enqueues
//    nothing. Without a usable device the result is FAILED_PRECONDITION; a CUDA runtime error
//    is INTERNAL.
//  - Work is enqueued on `stream` and the function returns without waiting. Errors found on
//    the device (NaN/Inf input, scales beyond fp16, corrupt records, bad block ids) are
//    OR-ed into `status` (device memory; the function zeroes it first on the same stream;
//    may be null). Read it once the stream has synchronized; the bits are in
//    kernels/cuda/kernel_types.h.
//  - Unlike the CPU codec, a failed slot or token may leave its output partly written; a
//    caller must not publish output whose status is non-zero.
// Thread safety: every function may be called from any number of threads at once.
#ifndef KVARN_KERNELS_CUDA_CUDA_CODEC_H_
#define KVARN_KERNELS_CUDA_CUDA_CODEC_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "kernels/block_layout.h"
#include "kernels/codec.h"
#include "kernels/cuda/types.h"
#include "kernels/preset.h"
#include "kernels/status.h"

namespace kvarn::cuda {

// True when a CUDA device is usable; `why` (optional) explains when not.
bool DeviceAvailable(std::string* why = nullptr);

// Limits of the current device.
CodecStatus QueryDevice(DeviceLimits* out);

// The preset is well formed and the layout matches it.
CodecStatus CheckLayout(const Preset& preset, const BlockLayout& layout);

// Encodes the layout.slots() tiles of `in` into the quantized block `quant_block`
// (quant_block_bytes() bytes): rotation (for original-frame input of rotating presets),
// balancing, RTN and packing, one tile per thread block. status: [slots] error bits
// (kStatusBadKeys ... kStatusValueScaleRange). head_dim 512 with 128-token tiles keeps
// its tiles in global scratch memory, allocated and freed on `stream`.
CodecStatus EncodeBlock(const Preset& preset, const BlockLayout& layout, const TileSource& in,
                        uint8_t* quant_block, int32_t* status, cudaStream_t stream,
                        const EncodeOptions& options = {});

// Decodes every record of `quant_block` into `out` (frame and dtype as requested).
// status: [slots], kDecodeCorruptRecord for a record with non-finite scales.
CodecStatus DecodeBlock(const Preset& preset, const BlockLayout& layout, const uint8_t* quant_block,
                        const TileSink& out, int32_t* status, cudaStream_t stream);

// What a worker does before committing an append: rotates num_tokens new tokens of `layer`
// (original frame, [num_tokens][num_kv_heads][D]; or of every layer with kAllLayers,
// [num_tokens][num_layers][num_kv_heads][D]) into the storage frame and writes them as
// binary16 into the fp16 block at token positions [token_offset, token_offset + num_tokens),
// the same bits as Codec::StoreTokens. status: [num_tokens], kStoreBadInput / kStoreOverflow;
// a (token, layer, head) with bad input or an element that overflows fp16 after rotation is
// not written (the CPU rejects the whole call for bad input and writes Inf on overflow).
CodecStatus StoreTokens(const Preset& preset, const BlockLayout& layout, const TokenSource& in,
                        int num_tokens, int layer, int token_offset, uint16_t* fp16_block,
                        int32_t* status, cudaStream_t stream);

// Fused decode attention of every query head of every sequence in `args` over its sink,
// quantized tiles and tail (online softmax, fp32 accumulators). With grouped-query
// attention each thread block serves all query heads of a kv-head (up to 16; larger groups
// are split into chunks), so each tile is read once per kv-head. num_splits > 1 partitions
// each sequence's tiles over that many blocks and merges them with a log-sum-exp combine
// (needs args.workspace of AttendWorkspaceBytes()).
CodecStatus AttendDecode(const Preset& preset, const BlockLayout& layout, const AttendArgs& args,
                         cudaStream_t stream);

}  // namespace kvarn::cuda

#endif  // KVARN_KERNELS_CUDA_CUDA_CODEC_H_
