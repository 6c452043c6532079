// StoreTokens, the worker-side write of new tokens into an fp16 slot: implementations (use
// Codec::StoreTokens), and a fast scan of fp16 data for NaN/Inf.
#ifndef KVARN_KERNELS_STORE_TOKENS_H_
#define KVARN_KERNELS_STORE_TOKENS_H_

#include "kernels/codec.h"

namespace kvarn {

// Shape checks (the front's) and value checks; names the first bad element.
CodecStatus CheckStoreShape(const Preset& preset, const BlockLayout& layout, int first, int n,
                            const void* keys, const void* values);
CodecStatus CheckStoreTokens(const Preset& preset, const BlockLayout& layout, int first, int n,
                             const void* keys, const void* values, DType dtype);

// The implementations (Codec::Kernels::store): validate the values, then write.
CodecStatus ReferenceStoreTokens(const Preset& preset, const BlockLayout& layout, uint8_t* slot,
                                 int first, int n, const void* keys, const void* values, DType dtype);
CodecStatus SimdStoreTokens(const Preset& preset, const BlockLayout& layout, uint8_t* slot, int first,
                            int n, const void* keys, const void* values, DType dtype);

// Index of the first NaN or Inf among n binary16 values, or n if all are finite (SIMD,
// dispatched at run time). What the daemon checks committed tail tokens with.
size_t FindNonFiniteHalf(const uint16_t* x, size_t n);

}  // namespace kvarn

#endif  // KVARN_KERNELS_STORE_TOKENS_H_
