// SIMD StoreTokens: a vectorized check of every value (NaN, Inf, fp16 range) and of every
// row's norm (a row can only overflow fp16 once rotated if its L2 norm exceeds the fp16 range;
// such rare rows go to the exact scalar check), then widen, rotate (in-register
// Walsh-Hadamard) and narrow to fp16, one row of head_dim values at a time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd_store.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format off
#include "hwy/highway.h"
#include "kernels/simd-inl.h"
// clang-format on

#include <algorithm>

#include "hwy/cache_control.h"
#include "kernels/store_tokens.h"

HWY_BEFORE_NAMESPACE();
namespace kvarn {
namespace HWY_NAMESPACE {

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
        const VF v = dtype == DType::kF32 ? hn::LoadU(df, static_cast<const float*>(in) + i)
                                          : LoadHalf(static_cast<const uint16_t*>(in) + i);
        bad = hn::Or(bad, hn::Not(hn::Le(hn::Abs(v), limit)));  // NaN compares false
        sq = hn::MulAdd(v, v, sq);
      }
      if (ReduceSum(sq) > norm_limit) return false;
    }
  }
  return hn::AllFalse(df, bad);
}

CodecStatus StoreTokensImpl(const Preset& preset, const BlockLayout& layout, uint8_t* slot, int first,
                            int n, const void* keys, const void* values, DType dtype) {
  if (!ValuesPlainlyFine(layout, n, keys, values, dtype)) {
    KVARN_RETURN_IF_ERROR(CheckStoreTokens(preset, layout, first, n, keys, values, dtype));
  }
  const DF df;
  const size_t N = hn::Lanes(df), d = static_cast<size_t>(layout.head_dim);
  alignas(64) float row[512];
  for (int t = 0; t < n; ++t) {
    for (int l = 0; l < layout.num_layers; ++l) {
      for (int h = 0; h < layout.num_kv_heads; ++h) {
        const size_t src = (static_cast<size_t>(t) * layout.slots() + layout.slot(l, h)) * d;
        for (int which = 0; which < 2; ++which) {
          const void* in = which == 0 ? keys : values;
          for (size_t c = 0; c < d; c += N) {
            const VF v = dtype == DType::kF32 ? hn::LoadU(df, static_cast<const float*>(in) + src + c)
                                              : LoadHalf(static_cast<const uint16_t*>(in) + src + c);
            hn::Store(v, df, row + c);
          }
          if (preset.rotates()) FwhtRows(row, 1, d);
          const size_t off = which == 0 ? layout.Fp16KeysOffset(l, h) : layout.Fp16ValuesOffset(l, h);
          auto* dst = reinterpret_cast<uint16_t*>(slot + off) + static_cast<size_t>(first + t) * d;
          // Streamed past the caches: the tail's rows for one token are 4,096-odd lines on
          // as many pages, written once and read back only by the commit's scan and the seal.
          if (reinterpret_cast<uintptr_t>(dst) % (N * sizeof(uint16_t)) == 0) {
            for (size_t c = 0; c < d; c += N) StreamHalf(hn::Load(df, row + c), dst + c);
          } else {
            for (size_t c = 0; c < d; c += N) StoreHalf(hn::Load(df, row + c), dst + c);
          }
        }
      }
    }
  }
  hwy::FlushStream();
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

size_t FindNonFiniteHalfStridedImpl(const uint16_t* HWY_RESTRICT x, size_t stride, size_t chunks, size_t len) {
  // The chunks are runs on different pages (a tail's rows of one token), which the hardware
  // prefetcher does not follow, and StoreTokens streamed them to memory: the first lines of
  // the run kAhead chunks on are fetched while this one is scanned.
  constexpr size_t kAhead = 8, kLines = 4;
  const size_t ahead_bytes = std::min(len * sizeof(uint16_t), kLines * 64);
  for (size_t c = 0; c < chunks; ++c) {
    if (c + kAhead < chunks) {
      const auto* next = reinterpret_cast<const uint8_t*>(x + (c + kAhead) * stride);
      for (size_t b = 0; b < ahead_bytes; b += 64) hwy::Prefetch(next + b);
    }
    const size_t i = FindNonFiniteHalfImpl(x + c * stride, len);
    if (i < len) return c * len + i;
  }
  return chunks * len;
}

}  // namespace HWY_NAMESPACE
}  // namespace kvarn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvarn {
HWY_EXPORT(StoreTokensImpl);
HWY_EXPORT(FindNonFiniteHalfImpl);
HWY_EXPORT(FindNonFiniteHalfStridedImpl);

size_t FindNonFiniteHalfStrided(const uint16_t* x, size_t stride, size_t chunks, size_t len) {
  return HWY_DYNAMIC_DISPATCH(FindNonFiniteHalfStridedImpl)(x, stride, chunks, len);
}

size_t FindNonFiniteHalf(const uint16_t* x, size_t n) {
  return HWY_DYNAMIC_DISPATCH(FindNonFiniteHalfImpl)(x, n);
}

CodecStatus SimdStoreTokens(const Preset& preset, const BlockLayout& layout, uint8_t* slot, int first,
                            int n, const void* keys, const void* values, DType dtype) {
  return HWY_DYNAMIC_DISPATCH(StoreTokensImpl)(preset, layout, slot, first, n, keys, values, dtype);
}
}  // namespace kvarn
#endif
