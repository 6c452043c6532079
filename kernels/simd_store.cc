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
          // Plain stores: the commit's scan reads the token's run (contiguous, token-major)
          // right after, from the caches (docs/commit_ring.md: non-temporal stores left it
          // to read from memory, 92-97 us for a 64-sequence step against 23-41 us).
          auto* dst = reinterpret_cast<uint16_t*>(
              slot + off + static_cast<size_t>(first + t) * layout.fp16_token_bytes());
          for (size_t c = 0; c < d; c += N) StoreHalf(hn::Load(df, row + c), dst + c);
        }
      }
    }
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
