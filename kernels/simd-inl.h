// Per-target SIMD building blocks of the codec, written once with Highway and compiled for
// every target that foreach_target.h selects: fp16 and code conversions, the in-register
// Walsh-Hadamard transform, byte transposes, and code packing of KVARN_SPEC.md §5.
//
// Include guard in Highway's per-target form: this header is re-included once per target.
#if defined(KVARN_KERNELS_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVARN_KERNELS_SIMD_INL_H_
#undef KVARN_KERNELS_SIMD_INL_H_
#else
#define KVARN_KERNELS_SIMD_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "hwy/highway.h"
#include "kernels/fp16.h"

HWY_BEFORE_NAMESPACE();
namespace kvarn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using DU = hn::RebindToUnsigned<DF>;
using DU8F = hn::Rebind<uint8_t, DF>;        // one byte per float lane
using DHF = hn::Rebind<hwy::float16_t, DF>;  // one half per float lane
using VF = hn::Vec<DF>;

HWY_INLINE VF LoadHalf(const uint16_t* p) {
  return hn::PromoteTo(DF(), hn::LoadU(DHF(), reinterpret_cast<const hwy::float16_t*>(p)));
}
// float -> binary16, rounding to nearest even like FloatToHalf. F16C does exactly that; where
// Highway emulates the conversion (targets below AVX2) it truncates, so those targets
// convert lane by lane with FloatToHalf instead.
#undef KVARN_SIMD_EXACT_F16_DEMOTE
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
#define KVARN_SIMD_EXACT_F16_DEMOTE 1
#else
#define KVARN_SIMD_EXACT_F16_DEMOTE 0
#endif
HWY_INLINE void StoreHalf(VF v, uint16_t* p) {
#if KVARN_SIMD_EXACT_F16_DEMOTE
  hn::StoreU(hn::DemoteTo(DHF(), v), DHF(), reinterpret_cast<hwy::float16_t*>(p));
#else
  HWY_ALIGN float lanes[HWY_MAX_BYTES / sizeof(float)];
  hn::Store(v, DF(), lanes);
  for (size_t i = 0; i < hn::Lanes(DF()); ++i) p[i] = FloatToHalf(lanes[i]);
#endif
}
// One code per byte, widened to float.
HWY_INLINE VF LoadCodes(const uint8_t* p) {
  return hn::ConvertTo(DF(), hn::PromoteTo(DI(), hn::LoadU(DU8F(), p)));
}
HWY_INLINE float ReduceSum(VF v) { return hn::GetLane(hn::SumOfLanes(DF(), v)); }
HWY_INLINE float ReduceMax(VF v) { return hn::GetLane(hn::MaxOfLanes(DF(), v)); }
HWY_INLINE float ReduceMin(VF v) { return hn::GetLane(hn::MinOfLanes(DF(), v)); }

// Lane permutations of the in-register transform stages: stage s pairs lane i with lane
// i ^ 2^s; the upper lane of each pair takes the difference.
alignas(64) inline constexpr int32_t kSwapIndex[4][16] = {
    {1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14},
    {2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13},
    {4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11},
    {8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7}};
alignas(64) inline constexpr float kUpperSign[4][16] = {
    {1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1},
    {1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1},
    {1, 1, 1, 1, -1, -1, -1, -1, 1, 1, 1, 1, -1, -1, -1, -1},
    {1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1, -1}};

// Lane i ^ 2^kStage of v in lane i: fixed shuffles where the width is known (cheaper than a
// general permutation), a table lookup otherwise.
template <size_t kStage>
HWY_INLINE VF SwapLanes(VF v) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  const DF df;
  if constexpr (kStage == 0) return hn::Shuffle2301(v);
  if constexpr (kStage == 1) return hn::Shuffle1032(v);
  if constexpr (kStage == 2 && hn::MaxLanes(df) == 8) return hn::ConcatLowerUpper(df, v, v);
  if constexpr (kStage == 2 && hn::MaxLanes(df) == 16) return hn::SwapAdjacentBlocks(v);
  if constexpr (kStage == 3) return hn::ConcatLowerUpper(df, v, v);  // 16 lanes: swap halves
#endif
  return hn::TableLookupLanes(v, hn::SetTableIndices(DF(), kSwapIndex[kStage]));
}

// The transform stages within vectors: stage s pairs lane i with lane i ^ 2^s, s < log2(N).
// v * sign + partner is a + b in the lower lane and a - b in the upper, each rounded once like
// the scalar butterfly.
template <size_t kVecs, size_t kStage = 0>
HWY_INLINE void InLaneStages(VF* v) {
  const DF df;
  if constexpr ((size_t{2} << kStage) <= hn::MaxLanes(df)) {
    if ((size_t{1} << kStage) < hn::Lanes(df)) {
      const VF sign = hn::LoadU(df, kUpperSign[kStage]);
      for (size_t i = 0; i < kVecs; ++i) v[i] = hn::MulAdd(v[i], sign, SwapLanes<kStage>(v[i]));
      InLaneStages<kVecs, kStage + 1>(v);
    }
  }
}

// The butterfly stages between whole vectors v[i] and v[i + kHalf], kHalf = 1, 2, .., fully
// unrolled so that the chunk never leaves registers.
template <size_t kVecs, size_t kHalf>
HWY_INLINE void CrossStages(VF* v) {
  if constexpr (kHalf < kVecs) {
    HWY_UNROLL(8)
    for (size_t i = 0; i < kVecs; ++i) {
      if (i & kHalf) continue;
      const VF a = v[i], b = v[i + kHalf];
      v[i] = hn::Add(a, b);
      v[i + kHalf] = hn::Sub(a, b);
    }
    CrossStages<kVecs, 2 * kHalf>(v);
  }
}

// The transform stages that pair elements of one chunk of kVecs vectors, in registers: the
// stages within vectors, then those across the chunk's vectors. `norm`, when given, is applied
// at the end (the chunk is the whole row).
template <size_t kVecs>
HWY_INLINE void FwhtVecs(VF* v, const float* norm) {
  InLaneStages<kVecs>(v);
  CrossStages<kVecs, 1>(v);
  if (norm != nullptr) {
    const VF nv = hn::Set(DF(), *norm);
    for (size_t i = 0; i < kVecs; ++i) v[i] = hn::Mul(v[i], nv);
  }
}

// FwhtVecs of the kVecs vectors at p, in place.
template <size_t kVecs>
HWY_INLINE void FwhtChunk(float* HWY_RESTRICT p, const float* norm) {
  const DF df;
  const size_t N = hn::Lanes(df);
  VF v[kVecs];
  for (size_t i = 0; i < kVecs; ++i) v[i] = hn::LoadU(df, p + i * N);
  FwhtVecs<kVecs>(v, norm);
  for (size_t i = 0; i < kVecs; ++i) hn::StoreU(v[i], df, p + i * N);
}

// Normalized fast Walsh-Hadamard transform of `rows` contiguous rows of n floats, in place.
// The butterflies are the scalar reference's, stage by stage, so results are bit-identical.
// Rows of up to 8 vectors (128 floats with AVX-512) stay in registers for every stage; longer
// rows do their remaining stages in passes over memory, the last one normalizing.
HWY_INLINE void FwhtRows(float* HWY_RESTRICT x, size_t rows, size_t n) {
  const DF df;
  const size_t N = hn::Lanes(df);
  constexpr size_t kMaxVecs = 8;
  const size_t vecs = std::min(n / N, kMaxVecs), chunk = vecs * N;
  HWY_DASSERT(N <= 16 && n % chunk == 0);
  const float norm = 1.0f / std::sqrt(static_cast<float>(n));
  const float* chunk_norm = chunk == n ? &norm : nullptr;
  const VF normv = hn::Set(df, norm);
  for (size_t r = 0; r < rows; ++r) {
    float* HWY_RESTRICT row = x + r * n;
    for (size_t c = 0; c < n; c += chunk) {
      switch (vecs) {
        case 8:
          FwhtChunk<8>(row + c, chunk_norm);
          break;
        case 4:
          FwhtChunk<4>(row + c, chunk_norm);
          break;
        case 2:
          FwhtChunk<2>(row + c, chunk_norm);
          break;
        default:
          FwhtChunk<1>(row + c, chunk_norm);
          break;
      }
    }
    for (size_t h = chunk; h < n; h *= 2) {
      const bool last = 2 * h == n;
      for (size_t i = 0; i < n; i += 2 * h) {
        for (size_t j = i; j < i + h; j += N) {
          const VF a = hn::LoadU(df, row + j);
          const VF b = hn::LoadU(df, row + j + h);
          const VF sum = hn::Add(a, b), diff = hn::Sub(a, b);
          hn::StoreU(last ? hn::Mul(sum, normv) : sum, df, row + j);
          hn::StoreU(last ? hn::Mul(diff, normv) : diff, df, row + j + h);
        }
      }
    }
  }
}

// dst[c][r] = src[r][c] for a rows x cols byte matrix; both multiples of 16. Four rounds of
// byte interleaves of rows i and i+8 rotate the 8-bit (row, column) index of every element by
// one bit each: after four, row and column have swapped.
HWY_INLINE void TransposeBytes(const uint8_t* HWY_RESTRICT src, size_t rows, size_t cols,
                               uint8_t* HWY_RESTRICT dst) {
#if HWY_TARGET == HWY_SCALAR
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
  }
#else
  const hn::Full128<uint8_t> d8;
  using V8 = hn::Vec<decltype(d8)>;
  for (size_t r0 = 0; r0 < rows; r0 += 16) {
    for (size_t c0 = 0; c0 < cols; c0 += 16) {
      V8 a[16], b[16];
      for (size_t i = 0; i < 16; ++i) a[i] = hn::LoadU(d8, src + (r0 + i) * cols + c0);
      for (int round = 0; round < 2; ++round) {
        for (size_t i = 0; i < 8; ++i) {
          b[2 * i] = hn::InterleaveLower(d8, a[i], a[i + 8]);
          b[2 * i + 1] = hn::InterleaveUpper(d8, a[i], a[i + 8]);
        }
        for (size_t i = 0; i < 8; ++i) {
          a[2 * i] = hn::InterleaveLower(d8, b[i], b[i + 8]);
          a[2 * i + 1] = hn::InterleaveUpper(d8, b[i], b[i + 8]);
        }
      }
      for (size_t i = 0; i < 16; ++i) hn::StoreU(a[i], d8, dst + (c0 + i) * rows + r0);
    }
  }
#endif
}

// Packs n codes (one per byte, each < 2^bits) into n*bits/8 bytes: code i in byte i/p at
// bit (i%p)*bits, p = 8/bits. A wide lane gathers the p codes of one output byte.
HWY_INLINE void PackCodes(const uint8_t* HWY_RESTRICT codes, size_t n, int bits,
                          uint8_t* HWY_RESTRICT out) {
  size_t i = 0;
#if HWY_TARGET != HWY_SCALAR
  if (bits == 4) {
    const hn::ScalableTag<uint16_t> d16;
    const hn::Repartition<uint8_t, decltype(d16)> d8;
    const hn::Rebind<uint8_t, decltype(d16)> d8h;
    const size_t step = 2 * hn::Lanes(d16);
    for (; i + step <= n; i += step) {
      const auto x = hn::BitCast(d16, hn::LoadU(d8, codes + i));
      hn::StoreU(hn::TruncateTo(d8h, hn::Or(x, hn::ShiftRight<4>(x))), d8h, out + i / 2);
    }
  } else {
    const hn::ScalableTag<uint32_t> d32;
    const hn::Repartition<uint8_t, decltype(d32)> d8;
    const hn::Rebind<uint8_t, decltype(d32)> d8q;
    const size_t step = 4 * hn::Lanes(d32);
    for (; i + step <= n; i += step) {
      const auto x = hn::BitCast(d32, hn::LoadU(d8, codes + i));
      const auto y = hn::Or(hn::Or(x, hn::ShiftRight<6>(x)),
                            hn::Or(hn::ShiftRight<12>(x), hn::ShiftRight<18>(x)));
      hn::StoreU(hn::TruncateTo(d8q, y), d8q, out + i / 4);
    }
  }
#endif
  const int per_byte = 8 / bits;
  for (; i < n; i += per_byte) {
    uint8_t byte = 0;
    for (int k = 0; k < per_byte; ++k) byte = static_cast<uint8_t>(byte | (codes[i + k] << (k * bits)));
    out[i / per_byte] = byte;
  }
}

// Inverse of PackCodes: n codes out, one per byte.
HWY_INLINE void UnpackCodes(const uint8_t* HWY_RESTRICT packed, size_t n, int bits,
                            uint8_t* HWY_RESTRICT codes) {
  size_t i = 0;
#if HWY_TARGET != HWY_SCALAR
  if (bits == 4) {
    const hn::ScalableTag<uint16_t> d16;
    const hn::Repartition<uint8_t, decltype(d16)> d8;
    const hn::Rebind<uint8_t, decltype(d16)> d8h;
    const size_t step = 2 * hn::Lanes(d16);
    const auto lo = hn::Set(d16, 0x000F), hi = hn::Set(d16, 0x0F00);
    for (; i + step <= n; i += step) {
      const auto x = hn::PromoteTo(d16, hn::LoadU(d8h, packed + i / 2));
      const auto y = hn::Or(hn::And(x, lo), hn::And(hn::ShiftLeft<4>(x), hi));
      hn::StoreU(hn::BitCast(d8, y), d8, codes + i);
    }
  } else {
    const hn::ScalableTag<uint32_t> d32;
    const hn::Repartition<uint8_t, decltype(d32)> d8;
    const hn::Rebind<uint8_t, decltype(d32)> d8q;
    const size_t step = 4 * hn::Lanes(d32);
    for (; i + step <= n; i += step) {
      const auto x = hn::PromoteTo(d32, hn::LoadU(d8q, packed + i / 4));
      const auto y = hn::Or(
          hn::Or(hn::And(x, hn::Set(d32, 0x3u)), hn::And(hn::ShiftLeft<6>(x), hn::Set(d32, 0x300u))),
          hn::Or(hn::And(hn::ShiftLeft<12>(x), hn::Set(d32, 0x30000u)),
                 hn::And(hn::ShiftLeft<18>(x), hn::Set(d32, 0x3000000u))));
      hn::StoreU(hn::BitCast(d8, y), d8, codes + i);
    }
  }
#endif
  const int per_byte = 8 / bits;
  const int mask = (1 << bits) - 1;
  for (; i < n; ++i) codes[i] = static_cast<uint8_t>((packed[i / per_byte] >> ((i % per_byte) * bits)) & mask);
}

}  // namespace HWY_NAMESPACE
}  // namespace kvarn
HWY_AFTER_NAMESPACE();

#endif  // KVARN_KERNELS_SIMD_INL_H_
