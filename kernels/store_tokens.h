// StoreTokens, the worker-side write of new tokens into an fp16 slot: implementations.
// Not a public header (use Codec::StoreTokens).
#ifndef KVARN_KERNELS_STORE_TOKENS_H_
#define KVARN_KERNELS_STORE_TOKENS_H_

#include "kernels/codec.h"

namespace kvarn {

// Shape and value checks shared by both implementations; names the first bad element.
CodecStatus CheckStoreTokens(const Preset& preset, const BlockLayout& layout, int first, int n,
                             const void* keys, const void* values, DType dtype);

// After CheckStoreTokens passed.
void ReferenceStoreTokens(const Preset& preset, const BlockLayout& layout, uint8_t* slot, int first,
                          int n, const void* keys, const void* values, DType dtype);
// Defined by the SIMD library (kvarn_codec). Weak, so the scalar-only build (the GPU
// machine's) links without it: only Codec::Simd(), which lives there too, ever calls it.
void SimdStoreTokens(const Preset& preset, const BlockLayout& layout, uint8_t* slot, int first,
                     int n, const void* keys, const void* values, DType dtype) __attribute__((weak));

}  // namespace kvarn

#endif  // KVARN_KERNELS_STORE_TOKENS_H_
