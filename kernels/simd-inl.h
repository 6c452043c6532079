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

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace kvarn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using DU8F = hn::Rebind<uint8_t, DF>;        // one byte per float lane
using DHF = hn::Rebind<hwy::float16_t, DF>;  // one half per float lane
using VF = hn::Vec<DF>;

HWY_INLINE VF LoadHalf(const uint16_t* p) {
  return hn::PromoteTo(DF(), hn::LoadU(DHF(), reinterpret_cast<const hwy::float16_t*>(p)));
}
HWY_INLINE void StoreHalf(VF v, uint16_t* p) {
  hn::StoreU(hn::DemoteTo(DHF(), v), DHF(), reinterpret_cast<hwy::float16_t*>(p));
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
alignas(64) inline constexpr int32_t kUpperLane[4][16] = {
    {0, -1, 0, -1, 0, -1, 0, -1, 0, -1, 0, -1, 0, -1, 0, -1},
    {0, 0, -1, -1, 0, 0, -1, -1, 0, 0, -1, -1, 0, 0, -1, -1},
    {0, 0, 0, 0, -1, -1, -1, -1, 0, 0, 0, 0, -1, -1, -1, -1},
    {0, 0, 0, 0, 0, 0, 0, 0, -1, -1, -1, -1, -1, -1, -1, -1}};

// Normalized fast Walsh-Hadamard transform of `rows` contiguous rows of n floats, in place.
// The butterflies are the scalar reference's, stage by stage, so results are bit-identical.
HWY_INLINE void FwhtRows(float* HWY_RESTRICT x, size_t rows, size_t n) {
  const DF df;
  const DI di;
  const size_t N = hn::Lanes(df);
  const VF norm = hn::Set(df, 1.0f / std::sqrt(static_cast<float>(n)));
  size_t in_lane_stages = 0;
  while ((size_t{1} << in_lane_stages) < N && (size_t{1} << in_lane_stages) < n) ++in_lane_stages;
  HWY_DASSERT(in_lane_stages <= 4);
  for (size_t r = 0; r < rows; ++r) {
    float* HWY_RESTRICT row = x + r * n;
    for (size_t i = 0; i < n; i += N) {
      VF v = hn::LoadU(df, row + i);
      for (size_t s = 0; s < in_lane_stages; ++s) {
        const VF p = hn::TableLookupLanes(v, hn::SetTableIndices(df, kSwapIndex[s]));
        const auto upper = hn::RebindMask(df, hn::Lt(hn::LoadU(di, kUpperLane[s]), hn::Zero(di)));
        v = hn::IfThenElse(upper, hn::Sub(p, v), hn::Add(v, p));
      }
      hn::StoreU(v, df, row + i);
    }
    for (size_t h = N; h < n; h *= 2) {
      for (size_t i = 0; i < n; i += 2 * h) {
        for (size_t j = i; j < i + h; j += N) {
          const VF a = hn::LoadU(df, row + j);
          const VF b = hn::LoadU(df, row + j + h);
          hn::StoreU(hn::Add(a, b), df, row + j);
          hn::StoreU(hn::Sub(a, b), df, row + j + h);
        }
      }
    }
    for (size_t i = 0; i < n; i += N) hn::StoreU(hn::Mul(hn::LoadU(df, row + i), norm), df, row + i);
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
