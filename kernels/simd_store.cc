// SIMD StoreTokens: a check of every value, then widen, rotate (in-register Walsh-Hadamard)
// and narrow to fp16, one row of head_dim values at a time.
//
// The check has three levels, each taken only when the one before cannot vouch for the
// values: the largest magnitude bits (small enough that no row can overflow fp16 once
// rotated, which real K/V almost always are); then every row's norm (a row can only overflow
// once rotated if its L2 norm exceeds the fp16 range); then the exact scalar check, which
// names the first bad element.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd_store.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format off
#include "hwy/highway.h"
#include "kernels/simd-inl.h"
// clang-format on

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "hwy/cache_control.h"
#include "kernels/fp16.h"
#include "kernels/store_tokens.h"

HWY_BEFORE_NAMESPACE();
namespace kvarn {
namespace HWY_NAMESPACE {

// Element i of K/V input in f32 or fp16, widened.
HWY_INLINE VF LoadInput(const void* in, size_t i, DType dtype) {
  return dtype == DType::kF32 ? hn::LoadU(DF(), static_cast<const float*>(in) + i)
                              : LoadHalf(static_cast<const uint16_t*>(in) + i);
}

// True when every value is finite, within the fp16 range, and every row's L2 norm is well
// inside it (so the rotated row cannot overflow). False asks for the exact scalar check.
bool ValuesPlainlyFine(const BlockLayout& layout, int n, const void* keys, const void* values, DType dtype) {
  const DF df;
  const size_t N = hn::Lanes(df), d = static_cast<size_t>(layout.head_dim);
  const size_t rows = static_cast<size_t>(n) * layout.slots();
  const VF limit = hn::Set(df, 65504.0f);
  // Float sums of squares carry a relative error far below this margin.
  const float norm_limit = 0.99f * 65504.0f * 65504.0f;
  auto bad = hn::Lt(limit, hn::Zero(df));  // all false
  for (int which = 0; which < 2; ++which) {
    const void* in = which == 0 ? keys : values;
    for (size_t r = 0; r < rows; ++r) {
      VF sq = hn::Zero(df);
      for (size_t c = 0; c < d; c += N) {
        const size_t i = r * d + c;
        const VF v = LoadInput(in, i, dtype);
        bad = hn::Or(bad, hn::Not(hn::Le(hn::Abs(v), limit)));  // NaN compares false
        sq = hn::MulAdd(v, v, sq);
      }
      if (ReduceSum(sq) > norm_limit) return false;
    }
  }
  return hn::AllFalse(df, bad);
}

// The magnitude up to which a value needs no further check: the fp16 range, and where the
// preset rotates, small enough that no row can overflow once rotated (a rotated element is at
// most the row's L2 norm, at most sqrt(d) times the row's largest magnitude; 0.98 of the
// range leaves room for the float arithmetic computing the bound).
float PlainMagnitude(const Preset& preset, size_t d) {
  return preset.rotates() ? 65504.0f * std::sqrt(0.98f / static_cast<float>(d)) : 65504.0f;
}

// True when no value of `in` has a magnitude above `limit` (NaN and Inf have): the largest
// magnitude's bits against the limit's, as unsigned integers (binary16 and binary32 order
// non-negative values like their bit patterns, NaN above Inf above every finite value).
template <typename T>
bool BitsWithin(const T* HWY_RESTRICT p, size_t count, T limit_bits) {
  const hn::ScalableTag<T> du;
  const size_t N = hn::Lanes(du);
  const T mag_mask = std::numeric_limits<T>::max() >> 1;
  const auto mag = hn::Set(du, mag_mask);
  auto m0 = hn::Zero(du), m1 = hn::Zero(du);
  size_t i = 0;
  for (; i + 2 * N <= count; i += 2 * N) {
    m0 = hn::Max(m0, hn::And(hn::LoadU(du, p + i), mag));
    m1 = hn::Max(m1, hn::And(hn::LoadU(du, p + i + N), mag));
  }
  HWY_ALIGN T lanes[HWY_MAX_BYTES / sizeof(T)];
  hn::Store(hn::Max(m0, m1), du, lanes);
  T m = 0;
  for (size_t j = 0; j < N; ++j) m = std::max(m, lanes[j]);
  for (; i < count; ++i) m = std::max(m, static_cast<T>(p[i] & mag_mask));
  return m <= limit_bits;
}
bool MagnitudesWithin(const void* in, size_t count, DType dtype, float limit) {
  if (dtype == DType::kF32) {
    uint32_t bits;
    std::memcpy(&bits, &limit, sizeof(bits));
    return BitsWithin(static_cast<const uint32_t*>(in), count, bits);
  }
  uint16_t bits = FloatToHalf(limit);  // the largest binary16 not above the limit
  if (HalfToFloat(bits) > limit) --bits;
  return BitsWithin(static_cast<const uint16_t*>(in), count, bits);
}

// Calls row(in, src, dst) for every key and value row of tokens [first, first + n): `in` the
// keys or the values, `src` the index of the row's first element there, `dst` where its fp16
// goes in the slot. The callers' lambdas are forced inline: gcc 12 left them a call per row,
// which took a 64-sequence Stage from ~130 us to ~170 us.
template <class Row>
HWY_INLINE void ForEachRow(const BlockLayout& layout, uint8_t* slot, int first, int n,
                           const void* keys, const void* values, Row&& row) {
  const size_t d = static_cast<size_t>(layout.head_dim);
  for (int t = 0; t < n; ++t) {
    for (int l = 0; l < layout.num_layers; ++l) {
      for (int h = 0; h < layout.num_kv_heads; ++h) {
        const size_t src = (static_cast<size_t>(t) * layout.slots() + layout.slot(l, h)) * d;
        for (int which = 0; which < 2; ++which) {
          const size_t off =
              which == 0 ? layout.Fp16KeysOffset(l, h) : layout.Fp16ValuesOffset(l, h);
          // Plain stores: the commit's scan reads the token's run (contiguous, token-major)
          // right after, from the caches (docs/commit_ring.md: non-temporal stores left it
          // to read from memory, 92-97 us for a 64-sequence step against 23-41 us).
          row(which == 0 ? keys : values, src,
              reinterpret_cast<uint16_t*>(
                  slot + off + static_cast<size_t>(first + t) * layout.fp16_token_bytes()));
        }
      }
    }
  }
}

// The rows written into the slot: widened, rotated where the preset rotates, narrowed. Rows
// of kVecs vectors stay in registers throughout.
template <size_t kVecs>
void StoreRowsInRegisters(const Preset& preset, const BlockLayout& layout, uint8_t* slot, int first,
                          int n, const void* keys, const void* values, DType dtype) {
  const size_t N = hn::Lanes(DF());
  // FwhtRows' normalization of a row that is one chunk.
  const float norm = 1.0f / std::sqrt(static_cast<float>(layout.head_dim));
  ForEachRow(
      layout, slot, first, n, keys, values,
      [&](const void* in, size_t src, uint16_t* dst) HWY_ATTR __attribute__((always_inline)) {
        VF v[kVecs];
        for (size_t i = 0; i < kVecs; ++i) v[i] = LoadInput(in, src + i * N, dtype);
        if (preset.rotates()) FwhtVecs<kVecs>(v, &norm);
        for (size_t i = 0; i < kVecs; ++i) StoreHalf(v[i], dst + i * N);
      });
}

// The same for rows longer than FwhtRows keeps in registers, through a row buffer.
void StoreRowsThroughMemory(const Preset& preset, const BlockLayout& layout, uint8_t* slot,
                            int first, int n, const void* keys, const void* values, DType dtype) {
  const DF df;
  const size_t N = hn::Lanes(df), d = static_cast<size_t>(layout.head_dim);
  alignas(64) float row[512];
  ForEachRow(
      layout, slot, first, n, keys, values,
      [&](const void* in, size_t src, uint16_t* dst) HWY_ATTR __attribute__((always_inline)) {
        for (size_t c = 0; c < d; c += N) hn::Store(LoadInput(in, src + c, dtype), df, row + c);
        if (preset.rotates()) FwhtRows(row, 1, d);
        for (size_t c = 0; c < d; c += N) StoreHalf(hn::Load(df, row + c), dst + c);
      });
}

CodecStatus StoreTokensImpl(const Preset& preset, const BlockLayout& layout, uint8_t* slot,
                            int first, int n, const void* keys, const void* values, DType dtype) {
  const size_t d = static_cast<size_t>(layout.head_dim);
  const size_t count = static_cast<size_t>(n) * layout.slots() * d;
  const float plain = PlainMagnitude(preset, d);
  if (!(MagnitudesWithin(keys, count, dtype, plain) &&
        MagnitudesWithin(values, count, dtype, plain)) &&
      !ValuesPlainlyFine(layout, n, keys, values, dtype)) {
    KVARN_RETURN_IF_ERROR(CheckStoreTokens(preset, layout, first, n, keys, values, dtype));
  }
  switch (d / hn::Lanes(DF())) {  // FwhtRows keeps rows of up to 8 vectors in registers
    case 1:
      StoreRowsInRegisters<1>(preset, layout, slot, first, n, keys, values, dtype);
      break;
    case 2:
      StoreRowsInRegisters<2>(preset, layout, slot, first, n, keys, values, dtype);
      break;
    case 4:
      StoreRowsInRegisters<4>(preset, layout, slot, first, n, keys, values, dtype);
      break;
    case 8:
      StoreRowsInRegisters<8>(preset, layout, slot, first, n, keys, values, dtype);
      break;
    default:
      StoreRowsThroughMemory(preset, layout, slot, first, n, keys, values, dtype);
      break;
  }
  return {};
}

HWY_INLINE size_t FindNonFiniteHalfImpl(const uint16_t* HWY_RESTRICT x, size_t n) {
  const hn::ScalableTag<uint16_t> d16;
  const size_t N = hn::Lanes(d16);
  const auto exp = hn::Set(d16, uint16_t{0x7C00});
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    const auto a = hn::Eq(hn::And(hn::LoadU(d16, x + i), exp), exp);
    const auto b = hn::Eq(hn::And(hn::LoadU(d16, x + i + N), exp), exp);
    const auto c = hn::Eq(hn::And(hn::LoadU(d16, x + i + 2 * N), exp), exp);
    const auto e = hn::Eq(hn::And(hn::LoadU(d16, x + i + 3 * N), exp), exp);
    if (!hn::AllFalse(d16, hn::Or(hn::Or(a, b), hn::Or(c, e)))) break;
  }
  for (; i < n; ++i) {
    if ((x[i] & 0x7C00u) == 0x7C00u) return i;
  }
  return n;
}

}  // namespace HWY_NAMESPACE
}  // namespace kvarn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvarn {
HWY_EXPORT(StoreTokensImpl);
HWY_EXPORT(FindNonFiniteHalfImpl);

size_t FindNonFiniteHalf(const uint16_t* x, size_t n) {
  return HWY_DYNAMIC_DISPATCH(FindNonFiniteHalfImpl)(x, n);
}

CodecStatus SimdStoreTokens(const Preset& preset, const BlockLayout& layout, uint8_t* slot, int first,
                            int n, const void* keys, const void* values, DType dtype) {
  return HWY_DYNAMIC_DISPATCH(StoreTokensImpl)(preset, layout, slot, first, n, keys, values, dtype);
}
}  // namespace kvarn
#endif
