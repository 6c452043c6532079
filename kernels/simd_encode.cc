// SIMD encoder: rotation, dual-axis balancing, RTN and packing (KVARN_SPEC.md §2-§5).
//
// Both K and V are held token-major [G][D] as they arrive, so no float transpose is needed:
// the Hadamard transform runs along each row, balancing statistics are row (horizontal) or
// column (vertical, vectors across columns) reductions, and only the packed key codes,
// which the record wants channel-major, go through a byte transpose.
//
// Balancing (simd_balance-inl.h) accumulates its statistics in double, as the reference does.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd_encode.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format off
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"
#include "kernels/simd-inl.h"
#include "kernels/simd_balance-inl.h"
// clang-format on

#include <algorithm>
#include <vector>

#include "hwy/aligned_allocator.h"
#include "kernels/codec_internal.h"
#include "kernels/fp16.h"
#include "kernels/kvarn_math.h"
#include "kernels/simd_scratch.h"
#include "kernels/tile_io.h"

HWY_BEFORE_NAMESPACE();
namespace kvarn {
namespace HWY_NAMESPACE {
namespace {

// Converts one [G][D] tile to fp32 in `dst` with a vectorized range check, then rotates.
CodecStatus LoadTile(const Preset& preset, int d, const void* src, DType dtype, Frame frame,
                     float* HWY_RESTRICT dst, const char* what) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const size_t n = static_cast<size_t>(preset.tile_tokens) * d;
  const VF limit = hn::Set(df, 65504.0f);
  auto bad = hn::Lt(hn::Zero(df), hn::Zero(df));  // all false
  for (size_t i = 0; i < n; i += N) {
    const VF v = dtype == DType::kF32 ? hn::LoadU(df, static_cast<const float*>(src) + i)
                                      : LoadHalf(static_cast<const uint16_t*>(src) + i);
    bad = hn::Or(bad, hn::Not(hn::Le(hn::Abs(v), limit)));  // NaN compares false
    hn::StoreU(v, df, dst + i);
  }
  if (!hn::AllFalse(df, bad)) {
    // Rare: let the scalar loader name the first bad element.
    return LoadTileToStorage(preset, d, src, dtype, frame, dst, what);
  }
  if (preset.rotates() && frame == Frame::kOriginal) FwhtRows(dst, preset.tile_tokens, d);
  return {};
}

// Keys: M = K [G][D]; groups are channels (columns). B = M / S_token / S_channel.
void QuantizeKeys(const float* HWY_RESTRICT m, size_t g, size_t d, int bits, const float* HWY_RESTRICT tok_inv,
                  const float* HWY_RESTRICT ch_inv, EncodeScratch& s, uint8_t* HWY_RESTRICT packed,
                  float* HWY_RESTRICT step_out, float* HWY_RESTRICT lo_out) {
  const DF df;
  const DI di;
  const size_t N = hn::Lanes(df);
  float* HWY_RESTRICT b = s.b.get();
  for (size_t c = 0; c < d; c += N) {
    const VF ic = hn::LoadU(df, ch_inv + c);
    VF lo = hn::Set(df, HUGE_VALF), hi = hn::Set(df, -HUGE_VALF);
    for (size_t t = 0; t < g; ++t) {
      const VF x = hn::Mul(hn::Mul(hn::LoadU(df, m + t * d + c), hn::Set(df, tok_inv[t])), ic);
      hn::StoreU(x, df, b + t * d + c);
      lo = hn::Min(lo, x);
      hi = hn::Max(hi, x);
    }
    const float qmax = static_cast<float>((1 << bits) - 1);
    const VF step = hn::Max(hn::Div(hn::Sub(hi, lo), hn::Set(df, qmax)), hn::Set(df, kStepFloor));
    hn::StoreU(step, df, step_out + c);
    hn::StoreU(lo, df, lo_out + c);
  }
  const VF qmaxv = hn::Set(df, static_cast<float>((1 << bits) - 1));
  uint8_t* HWY_RESTRICT codes = s.codes.get();
  for (size_t t = 0; t < g; ++t) {
    for (size_t c = 0; c < d; c += N) {
      const VF q = hn::Round(hn::Div(hn::Sub(hn::LoadU(df, b + t * d + c), hn::LoadU(df, lo_out + c)),
                                     hn::LoadU(df, step_out + c)));
      const auto qi = hn::ConvertTo(di, hn::Min(hn::Max(q, hn::Zero(df)), qmaxv));
      hn::StoreU(hn::DemoteTo(DU8F(), qi), DU8F(), codes + t * d + c);
    }
  }
  TransposeBytes(codes, g, d, s.codes_t.get());  // -> channel-major [D][G]
  const size_t row_bytes = g * bits / 8;
  for (size_t c = 0; c < d; ++c) PackCodes(s.codes_t.get() + c * g, g, bits, packed + c * row_bytes);
}

// Values: M = V [G][D]; groups are tokens (rows). B = M / S_channel / S_token.
void QuantizeValues(const float* HWY_RESTRICT m, size_t g, size_t d, int bits,
                    const float* HWY_RESTRICT tok_inv, const float* HWY_RESTRICT ch_inv, EncodeScratch& s,
                    uint8_t* HWY_RESTRICT packed, float* HWY_RESTRICT step_out, float* HWY_RESTRICT lo_out) {
  const DF df;
  const DI di;
  const size_t N = hn::Lanes(df);
  const float qmax = static_cast<float>((1 << bits) - 1);
  const VF qmaxv = hn::Set(df, qmax);
  float* HWY_RESTRICT b = s.b.get();
  uint8_t* HWY_RESTRICT codes = s.codes.get();
  const size_t row_bytes = d * bits / 8;
  for (size_t t = 0; t < g; ++t) {
    const VF it = hn::Set(df, tok_inv[t]);
    VF lo = hn::Set(df, HUGE_VALF), hi = hn::Set(df, -HUGE_VALF);
    for (size_t c = 0; c < d; c += N) {
      const VF x = hn::Mul(hn::Mul(hn::LoadU(df, m + t * d + c), hn::LoadU(df, ch_inv + c)), it);
      hn::StoreU(x, df, b + c);
      lo = hn::Min(lo, x);
      hi = hn::Max(hi, x);
    }
    const float lo_s = ReduceMin(lo), hi_s = ReduceMax(hi);
    const float step = QuantStep(lo_s, hi_s, bits);
    step_out[t] = step;
    lo_out[t] = lo_s;
    const VF lov = hn::Set(df, lo_s), stepv = hn::Set(df, step);
    for (size_t c = 0; c < d; c += N) {
      const VF q = hn::Round(hn::Div(hn::Sub(hn::LoadU(df, b + c), lov), stepv));
      const auto qi = hn::ConvertTo(di, hn::Min(hn::Max(q, hn::Zero(df)), qmaxv));
      hn::StoreU(hn::DemoteTo(DU8F(), qi), DU8F(), codes + c);
    }
    PackCodes(codes, d, bits, packed + t * row_bytes);
  }
}

// Folds balancing scales into fp16 affine fields: a = S*step, b = S*lo (per group), and the
// other axis's S. Returns false if any does not fit in fp16.
bool StoreScales(size_t groups, const float* group_scale, const float* step, const float* lo,
                 size_t others, const float* other_scale, uint8_t* a_out, uint8_t* b_out,
                 uint8_t* s_out) {
  bool ok = true;
  const auto put = [&](uint8_t* dst, size_t i, float x) {
    const uint16_t h = FloatToHalf(x);
    ok &= (h & 0x7C00u) != 0x7C00u;
    std::memcpy(dst + 2 * i, &h, 2);
  };
  for (size_t i = 0; i < groups; ++i) {
    put(a_out, i, group_scale[i] * step[i]);
    put(b_out, i, group_scale[i] * lo[i]);
  }
  for (size_t i = 0; i < others; ++i) put(s_out, i, other_scale[i]);
  return ok;
}

CodecStatus EncodeImpl(const Preset& preset, int head_dim, const TileIn& in, uint8_t* record,
                       int iterations) {
  const size_t g = static_cast<size_t>(preset.tile_tokens), d = static_cast<size_t>(head_dim);
  EncodeScratch& s = EncodeScratch::ForThread(g, d);
  float* k = s.k.get();
  float* v = s.v.get();
  KVARN_RETURN_IF_ERROR(LoadTile(preset, head_dim, in.keys, in.dtype, in.frame, k, "keys"));
  KVARN_RETURN_IF_ERROR(LoadTile(preset, head_dim, in.values, in.dtype, in.frame, v, "values"));
  if (!preset.quantizes()) {
    const size_t n = g * d;
    auto* out = reinterpret_cast<uint16_t*>(record);
    for (size_t i = 0; i < n; i += hn::Lanes(DF())) {
      StoreHalf(hn::LoadU(DF(), k + i), out + i);
      StoreHalf(hn::LoadU(DF(), v + i), out + n + i);
    }
    return {};
  }
  const RecordLayout l = preset.Layout(head_dim);
  uint8_t* r = s.record.get();
  // Keys: first axis per token (M's rows); values: first axis per channel (M's columns).
  for (ScratchArray<float>* a : {&s.tok_scale, &s.tok_inv}) std::fill_n(a->get(), g, 1.0f);
  for (ScratchArray<float>* a : {&s.ch_scale, &s.ch_inv}) std::fill_n(a->get(), d, 1.0f);
  if (preset.balances()) {
    Balance(k, g, d, /*rows_first=*/true, iterations, s.balance, s.tok_scale.get(), s.tok_inv.get(),
            s.ch_scale.get(), s.ch_inv.get());
  }
  QuantizeKeys(k, g, d, preset.key_bits, s.tok_inv.get(), s.ch_inv.get(), s, r + l.k_codes,
               s.step.get(), s.lo.get());
  bool ok = StoreScales(d, s.ch_scale.get(), s.step.get(), s.lo.get(), g, s.tok_scale.get(),
                        r + l.k_a, r + l.k_b, r + l.k_r);
  if (preset.balances()) {
    Balance(v, g, d, /*rows_first=*/false, iterations, s.balance, s.tok_scale.get(), s.tok_inv.get(),
            s.ch_scale.get(), s.ch_inv.get());
  }
  QuantizeValues(v, g, d, preset.value_bits, s.tok_inv.get(), s.ch_inv.get(), s, r + l.v_codes,
                 s.step.get(), s.lo.get());
  ok &= StoreScales(g, s.tok_scale.get(), s.step.get(), s.lo.get(), d, s.ch_scale.get(), r + l.v_a,
                    r + l.v_b, r + l.v_c);
  if (!ok) return FpRangeError();
  std::memcpy(record, r, l.total);
  return {};
}

}  // namespace

const char* TargetNameImpl() { return hwy::TargetName(HWY_TARGET); }
CodecStatus EncodeEntry(const Preset& preset, int head_dim, const TileIn& in, uint8_t* record,
                        int iterations) {
  return EncodeImpl(preset, head_dim, in, record, iterations);
}

}  // namespace HWY_NAMESPACE
}  // namespace kvarn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvarn {
HWY_EXPORT(TargetNameImpl);
HWY_EXPORT(EncodeEntry);

const char* SimdTargetName() { return HWY_DYNAMIC_DISPATCH(TargetNameImpl)(); }
CodecStatus SimdEncode(const Preset& preset, int head_dim, const TileIn& in, uint8_t* record,
                       int iterations) {
  return HWY_DYNAMIC_DISPATCH(EncodeEntry)(preset, head_dim, in, record, iterations);
}
}  // namespace kvarn
#endif
