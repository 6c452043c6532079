// Shared between the codec front (codec.cc) and its implementations. Not a public header.
#ifndef KVARN_KERNELS_CODEC_INTERNAL_H_
#define KVARN_KERNELS_CODEC_INTERNAL_H_

#include <cstdint>

#include "kernels/codec.h"

namespace kvarn {

// Entry points of one implementation. The front has already checked head_dim, record
// sizes, pointers and counts; the kernels check element values (NaN/Inf, fp16 range) and
// must leave the output untouched when they fail.
struct Codec::Kernels {
  const char* (*target)();
  CodecStatus (*encode)(const Preset& preset, int head_dim, const TileIn& in, uint8_t* record,
                        int iterations);
  CodecStatus (*decode)(const Preset& preset, int head_dim, const uint8_t* record,
                        const TileOut& out);
  CodecStatus (*attend)(const Preset& preset, int head_dim, const float* queries, int num_queries,
                        const SequenceView& seq, float* out, float softmax_scale, float* lse);
  // Validates the values (NaN, Inf, fp16 range, overflow once rotated) and writes nothing
  // when they fail; shapes are checked by the front.
  CodecStatus (*store)(const Preset& preset, const BlockLayout& layout, uint8_t* slot, int first,
                       int n, const void* keys, const void* values, DType dtype);
  // AttendPrecision::kFast, where it differs from attend (the exact fold); null: use attend.
  CodecStatus (*attend_fast)(const Preset& preset, int head_dim, const float* queries,
                             int num_queries, const SequenceView& seq, float* out,
                             float softmax_scale, float* lse) = nullptr;
};

const Codec::Kernels& ReferenceKernels();
const Codec::Kernels& SimdKernels();

}  // namespace kvarn

#endif  // KVARN_KERNELS_CODEC_INTERNAL_H_
