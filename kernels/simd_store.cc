// SIMD StoreTokens: widen, rotate (in-register Walsh-Hadamard) and narrow to fp16, one row
// of head_dim values at a time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd_store.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format off
#include "hwy/highway.h"
#include "kernels/simd-inl.h"
// clang-format on

#include "kernels/store_tokens.h"

HWY_BEFORE_NAMESPACE();
namespace kvarn {
namespace HWY_NAMESPACE {

void StoreTokensImpl(const Preset& preset, const BlockLayout& layout, uint8_t* slot, int first,
                     int n, const void* keys, const void* values, DType dtype) {
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
          for (size_t c = 0; c < d; c += N) StoreHalf(hn::Load(df, row + c), dst + c);
        }
      }
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kvarn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvarn {
HWY_EXPORT(StoreTokensImpl);

void SimdStoreTokens(const Preset& preset, const BlockLayout& layout, uint8_t* slot, int first,
                     int n, const void* keys, const void* values, DType dtype) {
  HWY_DYNAMIC_DISPATCH(StoreTokensImpl)(preset, layout, slot, first, n, keys, values, dtype);
}
}  // namespace kvarn
#endif
