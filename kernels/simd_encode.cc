// SIMD encoder: rotation, dual-axis balancing, RTN and packing (KVARN_SPEC.md §2-§5).
//
// Both K and V are held token-major [G][D] as they arrive, so no float transpose is needed:
// the Hadamard transform runs along each row, balancing statistics are row (horizontal) or
// column (vertical, vectors across columns) reductions, and only the packed key codes,
// which the record wants channel-major, go through a byte transpose.
//
// Every value is the scalar reference's (kernels/reference.cc), bit for bit: the spec's
// formulas in fp32 in the order written, divisions done exactly (simd_balance-inl.h DivExact),
// statistics in the reference's summation order (docs/codec_arithmetic.md).

// The codec's results must not depend on the compiler fusing a * b + c into one rounding:
// every fused multiply-add is written out (MulAdd), and nothing else may be contracted.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
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
#include "hwy/cache_control.h"
#include "kernels/codec_internal.h"
#include "kernels/fp16.h"
#include "kernels/kvarn_math.h"
#include "kernels/simd_scratch.h"
#include "kernels/tile_io.h"

HWY_BEFORE_NAMESPACE();
namespace kvarn {
namespace HWY_NAMESPACE {
namespace {

#if HWY_TARGET != HWY_SCALAR
// Converts one [G][D] tile to fp32 in `dst` with a vectorized range check, rotating rows a
// few at a time while they are still in L1 (the transforms of different rows overlap).
CodecStatus LoadTile(const Preset& preset, int d, const void* src, DType dtype, Frame frame,
                     float* HWY_RESTRICT dst, const char* what) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const size_t g = static_cast<size_t>(preset.tile_tokens), n = static_cast<size_t>(d);
  constexpr size_t kRows = 4;  // divides G
  const bool rotate = preset.rotates() && frame == Frame::kOriginal;
  const VF limit = hn::Set(df, kFp16Max);
  auto bad = hn::Lt(hn::Zero(df), hn::Zero(df));  // all false
  for (size_t t = 0; t < g; t += kRows) {
    for (size_t i = t * n; i < (t + kRows) * n; i += N) {
      const VF v = dtype == DType::kF32 ? hn::LoadU(df, static_cast<const float*>(src) + i)
                                        : LoadHalf(static_cast<const uint16_t*>(src) + i);
      bad = hn::Or(bad, hn::Not(hn::Le(hn::Abs(v), limit)));  // NaN compares false
      hn::StoreU(v, df, dst + i);
    }
    if (rotate) FwhtRows(dst + t * n, kRows, n);
  }
  if (!hn::AllFalse(df, bad)) {
    // Rare: let the scalar loader name the first bad element.
    return LoadTileToStorage(preset, d, src, dtype, frame, dst, what);
  }
  return {};
}

// Codes of one vector of groups in int32 lanes: clamp(round_half_even((x - lo) / step), 0,
// qmax), the quotient correctly rounded (DivExact, rstep = RN(1 / step)). It lies in
// [0, qmax * (1 + 2^-23)] (x >= lo, step >= (hi - lo) / qmax up to rounding), so adding 2^23
// rounds it to an integer exactly as rint does and leaves that integer in the low mantissa
// bits; the clamp is then an integer min on the bit pattern.
struct CodeQuantizer {
  explicit CodeQuantizer(int bits)
      : magic(hn::Set(DF(), 8388608.0f)),
        max_bits(hn::Set(DI(), 0x4B000000 + (1 << bits) - 1)),
        low_bits(hn::Set(DI(), 0xFF)) {}
  hn::Vec<DI> operator()(VF x, VF lo, VF step, VF rstep) const {
    const VF shifted = hn::Add(DivExact(hn::Sub(x, lo), step, rstep), magic);
    return hn::And(hn::Min(hn::BitCast(DI(), shifted), max_bits), low_bits);
  }
  VF magic;
  hn::Vec<DI> max_bits, low_bits;
};

// Keys: M = K [G][D]; groups are channels (columns). B = M / S_token / S_channel. One vector
// of channels at a time: B's column strip goes to an L1 buffer while its range is found, then
// the p = 8/bits codes of consecutive tokens are packed into one byte per channel (the packed
// tile is [G/p][D]) and a byte transpose writes the record's channel-major rows.
void QuantizeKeys(const float* HWY_RESTRICT m, size_t g, size_t d, int bits, EncodeScratch& s,
                  uint8_t* HWY_RESTRICT packed, float* HWY_RESTRICT step_out, float* HWY_RESTRICT lo_out) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const size_t per_byte = static_cast<size_t>(8 / bits);
  const VF qmax = hn::Set(df, static_cast<float>((1 << bits) - 1));
  const CodeQuantizer quantize(bits);
  float* HWY_RESTRICT strip = s.b.get();       // [G][N]
  uint8_t* HWY_RESTRICT tile = s.codes.get();  // [G/p][D]
  const float* HWY_RESTRICT tok_scale = s.tok_scale.get();
  const float* HWY_RESTRICT tok_inv = s.tok_inv.get();
  for (size_t c = 0; c < d; c += N) {
    const VF ec = hn::LoadU(df, s.ch_scale.get() + c), ic = hn::LoadU(df, s.ch_inv.get() + c);
    VF lo = hn::Set(df, HUGE_VALF), hi = hn::Set(df, -HUGE_VALF);
    for (size_t t = 0; t < g; ++t) {
      const VF u = DivExact(hn::LoadU(df, m + t * d + c), hn::Set(df, tok_scale[t]), hn::Set(df, tok_inv[t]));
      const VF x = DivExact(u, ec, ic);
      hn::Store(x, df, strip + t * N);
      lo = hn::Min(lo, x);
      hi = hn::Max(hi, x);
    }
    const VF step = hn::Max(hn::Div(hn::Sub(hi, lo), qmax), hn::Set(df, kStepFloor));
    const VF rstep = hn::Div(hn::Set(df, 1.0f), step);
    hn::StoreU(step, df, step_out + c);
    hn::StoreU(lo, df, lo_out + c);
    for (size_t t = 0; t < g; t += per_byte) {
      auto byte = quantize(hn::Load(df, strip + t * N), lo, step, rstep);
      for (size_t k = 1; k < per_byte; ++k) {
        const auto code = quantize(hn::Load(df, strip + (t + k) * N), lo, step, rstep);
        byte = hn::Or(byte, hn::ShiftLeftSame(code, static_cast<int>(k) * bits));
      }
      hn::StoreU(hn::TruncateTo(DU8F(), hn::BitCast(DU(), byte)), DU8F(),
                 tile + (t / per_byte) * d + c);
    }
  }
  TransposeBytes(tile, g / per_byte, d, packed);  // -> channel-major [D][G/p]
}

// Values: M = V [G][D]; groups are tokens (rows). B = M / S_channel / S_token. Per row: B
// into an L1 buffer while its range is found, then the codes, packing the p = 8/bits codes
// of adjacent channels into each byte of the record's token-major rows.
void QuantizeValues(const float* HWY_RESTRICT m, size_t g, size_t d, int bits, EncodeScratch& s,
                    uint8_t* HWY_RESTRICT packed, float* HWY_RESTRICT step_out, float* HWY_RESTRICT lo_out) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const float qmax = static_cast<float>((1 << bits) - 1);
  const float* HWY_RESTRICT ch_scale = s.ch_scale.get();
  const float* HWY_RESTRICT ch_inv = s.ch_inv.get();
  const float* HWY_RESTRICT tok_scale = s.tok_scale.get();
  const float* HWY_RESTRICT tok_inv = s.tok_inv.get();
  const CodeQuantizer quantize(bits);
  uint8_t* HWY_RESTRICT codes = s.codes.get();
  float* HWY_RESTRICT row = s.b.get();  // B's row t
  const size_t row_bytes = d * bits / 8;
  for (size_t t = 0; t < g; ++t) {
    const VF te = hn::Set(df, tok_scale[t]), tr = hn::Set(df, tok_inv[t]);
    VF lo = hn::Set(df, HUGE_VALF), hi = hn::Set(df, -HUGE_VALF);
    for (size_t c = 0; c < d; c += N) {
      const VF u = DivExact(hn::LoadU(df, m + t * d + c), hn::LoadU(df, ch_scale + c), hn::LoadU(df, ch_inv + c));
      const VF x = DivExact(u, te, tr);
      hn::Store(x, df, row + c);
      lo = hn::Min(lo, x);
      hi = hn::Max(hi, x);
    }
    const float lo_s = ReduceMin(lo), hi_s = ReduceMax(hi);
    step_out[t] = std::max((hi_s - lo_s) / qmax, kStepFloor);  // QuantStep; never NaN here
    lo_out[t] = lo_s;
    const VF lov = hn::Set(df, lo_s), step = hn::Set(df, step_out[t]);
    const VF rstep = hn::Set(df, 1.0f / step_out[t]);
    for (size_t c = 0; c < d; c += N) {
      hn::StoreU(hn::TruncateTo(DU8F(), hn::BitCast(DU(), quantize(hn::Load(df, row + c), lov, step, rstep))),
                 DU8F(), codes + c);
    }
    PackCodes(codes, d, bits, packed + t * row_bytes);
  }
}

// Folds balancing scales into fp16 affine fields: a = S*step, b = S*lo (per group), and the
// other axis's S. Returns false if any does not fit in fp16.
bool StoreScales(size_t groups, const float* HWY_RESTRICT group_scale,
                 const float* HWY_RESTRICT step, const float* HWY_RESTRICT lo, size_t others,
                 const float* HWY_RESTRICT other_scale, uint8_t* a_out, uint8_t* b_out,
                 uint8_t* s_out) {
  const DF df;
  const size_t N = hn::Lanes(df);
  HWY_ALIGN uint16_t h[HWY_MAX_BYTES / sizeof(float)];
  bool ok = true;
  const auto put = [&](VF x, uint8_t* dst) {
    StoreHalf(x, h);
    for (size_t i = 0; i < N; ++i) ok &= (h[i] & 0x7C00u) != 0x7C00u;
    std::memcpy(dst, h, N * sizeof(uint16_t));
  };
  for (size_t i = 0; i < groups; i += N) {
    const VF sc = hn::LoadU(df, group_scale + i);
    put(hn::Mul(sc, hn::LoadU(df, step + i)), a_out + 2 * i);
    put(hn::Mul(sc, hn::LoadU(df, lo + i)), b_out + 2 * i);
  }
  for (size_t i = 0; i < others; i += N) put(hn::LoadU(df, other_scale + i), s_out + 2 * i);
  return ok;
}

// Whether the tile holds a nonzero |x| < 2^-90. DivExact needs normal quotients: the
// quotients of balancing and quantization stay normal for |x| >= 2^-90 (scales are within
// [e^-0.3, e^10]); the rare tile with smaller values is encoded by the scalar reference.
bool HasTinyValues(const float* HWY_RESTRICT x, size_t n) {
  const DF df;
  const VF tiny = hn::Set(df, 0x1p-90f), zero = hn::Zero(df);
  auto any = hn::Lt(zero, zero);
  for (size_t i = 0; i < n; i += hn::Lanes(df)) {
    const VF a = hn::Abs(hn::LoadU(df, x + i));
    any = hn::Or(any, hn::And(hn::Lt(a, tiny), hn::Gt(a, zero)));
  }
  return !hn::AllFalse(df, any);
}

CodecStatus EncodeImpl(const Preset& preset, int head_dim, const TileIn& in, uint8_t* record,
                       int iterations) {
  const size_t g = static_cast<size_t>(preset.tile_tokens), d = static_cast<size_t>(head_dim);
  EncodeScratch& s = EncodeScratch::ForThread(g, d);
  float* k = s.k.get();
  float* v = s.v.get();
  KVARN_RETURN_IF_ERROR(LoadTile(preset, head_dim, in.keys, in.dtype, in.frame, k, "keys"));
  if (!preset.quantizes()) {
    KVARN_RETURN_IF_ERROR(LoadTile(preset, head_dim, in.values, in.dtype, in.frame, v, "values"));
    const size_t n = g * d;
    auto* out = reinterpret_cast<uint16_t*>(record);
    for (size_t i = 0; i < n; i += hn::Lanes(DF())) {
      StoreHalf(hn::LoadU(DF(), k + i), out + i);
      StoreHalf(hn::LoadU(DF(), v + i), out + n + i);
    }
    return {};
  }
  // The values are read only once the keys are done: fetch them meanwhile.
  const size_t in_bytes = g * d * (in.dtype == DType::kF32 ? sizeof(float) : sizeof(uint16_t));
  for (size_t i = 0; i < in_bytes; i += 64)
    hwy::Prefetch(static_cast<const uint8_t*>(in.values) + i);
  if (HasTinyValues(k, g * d)) return ReferenceKernels().encode(preset, head_dim, in, record, iterations);
  const RecordLayout l = preset.Layout(head_dim);
  uint8_t* r = s.record.get();
  // Keys: first axis per token (M's rows); values: first axis per channel (M's columns).
  for (ScratchArray<float>* a : {&s.tok_scale, &s.tok_inv}) std::fill_n(a->get(), g, 1.0f);
  for (ScratchArray<float>* a : {&s.ch_scale, &s.ch_inv}) std::fill_n(a->get(), d, 1.0f);
  if (preset.balances()) {
    Balance(k, g, d, /*keys=*/true, iterations, s.balance, s.tok_scale.get(), s.tok_inv.get(),
            s.ch_scale.get(), s.ch_inv.get());
  }
  QuantizeKeys(k, g, d, preset.key_bits, s, r + l.k_codes, s.step.get(), s.lo.get());
  bool ok = StoreScales(d, s.ch_scale.get(), s.step.get(), s.lo.get(), g, s.tok_scale.get(),
                        r + l.k_a, r + l.k_b, r + l.k_r);
  KVARN_RETURN_IF_ERROR(LoadTile(preset, head_dim, in.values, in.dtype, in.frame, v, "values"));
  if (HasTinyValues(v, g * d)) return ReferenceKernels().encode(preset, head_dim, in, record, iterations);
  if (preset.balances()) {
    Balance(v, g, d, /*keys=*/false, iterations, s.balance, s.tok_scale.get(), s.tok_inv.get(),
            s.ch_scale.get(), s.ch_inv.get());
  }
  QuantizeValues(v, g, d, preset.value_bits, s, r + l.v_codes, s.step.get(), s.lo.get());
  ok &= StoreScales(g, s.tok_scale.get(), s.step.get(), s.lo.get(), d, s.ch_scale.get(), r + l.v_a,
                    r + l.v_b, r + l.v_c);
  if (!ok) return FpRangeError();
  std::memcpy(record, r, l.total);
  return {};
}

#else   // HWY_TARGET == HWY_SCALAR
CodecStatus EncodeImpl(const Preset& preset, int head_dim, const TileIn& in, uint8_t* record,
                       int iterations) {
  return ReferenceKernels().encode(preset, head_dim, in, record, iterations);
}
#endif  // HWY_TARGET != HWY_SCALAR

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
