// Dual-axis balancing (KVARN_SPEC.md §3), per target, producing the scalar reference's bits.
//
// The arithmetic is the reference's (kernels/reference.cc), in the order the spec writes it
// (docs/codec_arithmetic.md):
//  - cur = T / exp(Lc) / exp(Lr) in float, two correctly rounded divisions in that order. A
//    division by a per-row or per-column scale b is done as Markstein's correction of a
//    product by r = RN(1/b): q0 = a * r, q = fma(a - q0 * b, r, q0), which is RN(a / b)
//    (three FMA-unit operations instead of a divider's ~6 cycles per vector);
//  - every std is kvarn_math.h BalanceStd of those float values: shifted by the first value,
//    accumulated in double in a fixed order (a token's channels in kChannelPartials
//    interleaved accumulators, a channel's tokens in one), so the sums are the same doubles
//    as the reference's, whatever the vector width;
//  - exp and log are ExpF and LogF: vector double Exp/Log rounded to float, deferring to the
//    scalar functions where the double lies near a float rounding midpoint.
// Per iteration: after the column update one pass forms u = T / exp(Lc) (kept) and
// cur1 = u / exp(Lr) and sums the rows of cur1; after the row update a second forms
// cur2 = u / exp(Lr) and sums both axes (the imbalance and the next column update need them).
// Vertical sums stream tokens past a strip of channels held in registers (ColPass for the
// keys' first pass, StripPass otherwise, which keeps each token's partial sums between strips
// in memory, and also takes both axes of the unscaled tile).
//
// K and V are both held token-major [G][D] (M). "Horizontal" sums run over a token's
// channels, "vertical" ones over a channel's tokens. For keys the spec's first-updated
// (column) axis is tokens and the row axis channels; for values the reverse.
#if defined(KVARN_KERNELS_SIMD_BALANCE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVARN_KERNELS_SIMD_BALANCE_INL_H_
#undef KVARN_KERNELS_SIMD_BALANCE_INL_H_
#else
#define KVARN_KERNELS_SIMD_BALANCE_INL_H_
#endif

#include <algorithm>
#include <cassert>
#include <cmath>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "kernels/kvarn_math.h"
#include "kernels/simd_scratch.h"

HWY_BEFORE_NAMESPACE();
namespace kvarn {
namespace HWY_NAMESPACE {
// HWY_SCALAR (one lane, no half vectors) encodes with the scalar reference instead.
#if HWY_TARGET != HWY_SCALAR

using DD = hn::ScalableTag<double>;
using DH = hn::Half<DF>;  // the floats of one double vector
using VD = hn::Vec<DD>;

// RN(a / b) for b > 0 normal, given r = RN(1 / b), |a / b| normal or zero. The residual
// a - q0 * b is exact in one FMA, and one more fused step rounds the corrected quotient
// correctly (Markstein); docs/codec_arithmetic.md has the argument and the exhaustive check.
// Without a native FMA, Highway's MulAdd rounds twice, so those targets divide.
template <class V>
HWY_INLINE V DivExact(V a, V b, V r) {
#if HWY_NATIVE_FMA
  const V q0 = hn::Mul(a, r);
  return hn::MulAdd(hn::NegMulAdd(q0, b, a), r, q0);
#else
  (void)r;
  return hn::Div(a, b);
#endif
}

// acc + y * y rounded once, as std::fma, on every target.
HWY_INLINE VD FmaSquare(VD y, VD acc) {
#if HWY_NATIVE_FMA
  return hn::MulAdd(y, y, acc);
#else
  const DD dd;
  HWY_ALIGN double ys[HWY_MAX_BYTES / sizeof(double)], as[HWY_MAX_BYTES / sizeof(double)];
  hn::Store(y, dd, ys);
  hn::Store(acc, dd, as);
  for (size_t i = 0; i < hn::Lanes(dd); ++i) as[i] = std::fma(ys[i], ys[i], as[i]);
  return hn::Load(dd, as);
#endif
}

// The per-row or per-column state of one axis: log-scale, scale exp(l), its reciprocal
// RN(1 / exp(l)) for DivExact, and the axis's current stds.
struct Axis {
  float* l;
  float* e;
  float* r;
  float* std;
  size_t n;
};

// out[i] = ExpF(in[i]) (kExp) or LogF(in[i]), n a multiple of the double vector length. The
// double result of Highway's Exp/Log is within a few double ulps of libm's; it rounds to the
// same float unless it lies within kBand double ulps of a float rounding midpoint (low 29
// mantissa bits near 2^28; results are normal floats here), where the lane is recomputed
// with the scalar function.
template <bool kExp>
HWY_INLINE void RoundedTranscendental(const float* in, float* out, size_t n) {
  const DD dd;
  const DH dh;
  const hn::RebindToUnsigned<DD> du;
  constexpr uint64_t kBand = uint64_t{1} << 12;
  const auto low_mask = hn::Set(du, (uint64_t{1} << 29) - 1);
  const auto band_start = hn::Set(du, (uint64_t{1} << 28) - kBand);
  const auto band_width = hn::Set(du, 2 * kBand);
  for (size_t i = 0; i < n; i += hn::Lanes(dd)) {
    const auto xf = hn::LoadU(dh, in + i);
    const VD x = hn::PromoteTo(dd, xf);
    const VD y = kExp ? hn::Exp(dd, x) : hn::Log(dd, x);
    const auto low = hn::And(hn::BitCast(du, y), low_mask);
    const auto near = hn::Lt(hn::Sub(low, band_start), band_width);  // wraps below the band
    if (HWY_UNLIKELY(!hn::AllFalse(du, near))) {
      HWY_ALIGN float xs[HWY_MAX_BYTES / sizeof(double)];
      hn::Store(xf, dh, xs);  // `in` may be `out`
      for (size_t j = 0; j < hn::Lanes(dd); ++j) out[i + j] = kExp ? ExpF(xs[j]) : LogF(xs[j]);
    } else {
      hn::StoreU(hn::DemoteTo(dh, y), dh, out + i);
    }
  }
}

// l = clamp(l + log(clamp(std))), e = exp(l), r = 1 / e. `tmp` holds a.n floats.
HWY_INLINE void UpdateAxis(const Axis& a, float* HWY_RESTRICT tmp) {
  const DF df;
  const VF smin = hn::Set(df, kStdMin), smax = hn::Set(df, kStdMax);
  const VF lmin = hn::Set(df, kLogScaleMin), lmax = hn::Set(df, kLogScaleMax);
  for (size_t i = 0; i < a.n; i += hn::Lanes(df)) {
    hn::StoreU(hn::Min(hn::Max(hn::LoadU(df, a.std + i), smin), smax), df, tmp + i);
  }
  RoundedTranscendental<false>(tmp, tmp, a.n);
  for (size_t i = 0; i < a.n; i += hn::Lanes(df)) {
    const VF l = hn::Add(hn::LoadU(df, a.l + i), hn::LoadU(df, tmp + i));
    hn::StoreU(hn::Min(hn::Max(l, lmin), lmax), df, a.l + i);
  }
  RoundedTranscendental<true>(a.l, a.e, a.n);
  const VF one = hn::Set(df, 1.0f);
  for (size_t i = 0; i < a.n; i += hn::Lanes(df)) {
    hn::StoreU(hn::Div(one, hn::LoadU(df, a.e + i)), df, a.r + i);
  }
}

// std from shifted sums, as StdFromShiftedMoments; n is a power of two, so the product by
// 1/n rounds as the division by n does.
HWY_INLINE hn::Vec<DH> StdsOf(VD s1, VD s2, size_t n) {
  const DD dd;
  const VD var = hn::Div(hn::Sub(s2, hn::Mul(hn::Mul(s1, s1), hn::Set(dd, 1.0 / static_cast<double>(n)))),
                         hn::Set(dd, static_cast<double>(n) - 1.0));
  return hn::DemoteTo(DH(), hn::Sqrt(hn::IfThenElse(hn::Gt(var, hn::Zero(dd)), var, hn::Zero(dd))));
}

// cur formed from x, a vector of `src` at token t and channels c.., per kDivs: 0, src is cur;
// 1, src is u and cur = u / second; 2, src is T, u = T / first (stored at u_at) and
// cur = u / second. te, tr are token t's scale and its reciprocal, ce, cr the channels'. For
// keys (kKeys) the first divisor is per token and the second per channel; for values the
// reverse.
// Where FormCurWith stores u: only kDivs == 2 stores it (u_out is null otherwise, and no
// offset may be applied to it).
template <int kDivs>
HWY_INLINE float* UAt(float* HWY_RESTRICT u_out, size_t offset) {
  return kDivs == 2 ? u_out + offset : nullptr;
}
template <int kDivs, bool kKeys, class V>
HWY_INLINE V FormCurWith(V x, V te, V tr, V ce, V cr, float* HWY_RESTRICT u_at) {
  if constexpr (kDivs == 0) {
    return x;
  } else {
    V u = x;
    if constexpr (kDivs == 2) {
      u = kKeys ? DivExact(x, te, tr) : DivExact(x, ce, cr);
      hn::StoreU(u, hn::DFromV<V>(), u_at);
    }
    return kKeys ? DivExact(u, ce, cr) : DivExact(u, te, tr);
  }
}

// The fold of FoldPartials over the lanes of v (lane j += lane j + w, w = Lanes/2 .. 1): each
// step adds the upper half of the vector to the lower half.
template <class D>
HWY_INLINE double FoldLanes(D d, hn::Vec<D> v) {
  if constexpr (hn::MaxLanes(D()) == 1) {
    return hn::GetLane(v);
  } else {
    const hn::Half<D> dh;
    (void)d;
    return FoldLanes(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  }
}

// A strip of two float vectors of channels, c .. c + 2 Lanes(df): the channels' scales and
// reciprocals, and FormCurWith at one token over the strip, whole float vectors through the
// divisions, their halves widened to four double vectors p. FormStrip returns cur at (t, c).
HWY_INLINE void LoadStripScales(const Axis& ch, size_t c, VF (&ce)[2], VF (&cr)[2]) {
  const DF df;
  for (size_t k = 0; k < 2; ++k) {
    ce[k] = hn::LoadU(df, ch.e + c + k * hn::Lanes(df));
    cr[k] = hn::LoadU(df, ch.r + c + k * hn::Lanes(df));
  }
}
template <int kDivs, bool kKeys>
HWY_INLINE float FormStrip(const float* HWY_RESTRICT src, size_t t, size_t c, size_t d, float te, float tr,
                           const VF (&ce)[2], const VF (&cr)[2], float* HWY_RESTRICT u_out, VD (&p)[4]) {
  const DF df;
  const DD dd;
  const DH dh;
  const size_t N = hn::Lanes(df);
  const VF tev = hn::Set(df, te), trv = hn::Set(df, tr);
  float first = 0.0f;
  for (size_t k = 0; k < 2; ++k) {
    const VF x = FormCurWith<kDivs, kKeys>(hn::LoadU(df, src + t * d + c + k * N), tev, trv, ce[k], cr[k],
                                           UAt<kDivs>(u_out, t * d + c + k * N));
    if (k == 0) first = hn::GetLane(x);
    p[2 * k] = hn::PromoteTo(dd, hn::LowerHalf(dh, x));
    p[2 * k + 1] = hn::PromoteTo(dd, hn::UpperHalf(dh, x));
  }
  return first;
}

// The stds over the channels of every token of cur (see FormCurWith) and, with kVertical, over
// the tokens of every channel, in one sweep of channel strips: a channel's sums stay in
// registers while the tokens stream past, a token's kChannelPartials partial sums live in
// `state` (32 doubles a token) between strips. Each partial receives its elements in order of
// channel, as BalanceStd's, so the sums are the same.
template <int kDivs, bool kKeys, bool kVertical>
HWY_NOINLINE void StripPass(const float* HWY_RESTRICT src, size_t g, size_t d, const Axis& tok,
                            const Axis& ch, float* HWY_RESTRICT u_out, double* HWY_RESTRICT state,
                            double* HWY_RESTRICT hrow, double* HWY_RESTRICT s1_out,
                            double* HWY_RESTRICT s2_out) {
  const DF df;
  const DD dd;
  const DH dh;
  const size_t N = hn::Lanes(df), L = hn::Lanes(dd);
  constexpr size_t kP = kChannelPartials;
  const size_t slots = std::min<size_t>(4, kP / L);
  const float* HWY_RESTRICT te = tok.e;
  const float* HWY_RESTRICT tr = tok.r;
  for (size_t c = 0; c < d; c += 2 * N) {
    VD hc[4], a[4], q[4];
    VF ce[2], cr[2];
    LoadStripScales(ch, c, ce, cr);
    for (size_t t = 0; t < g; ++t) {
      VD p[4];
      const float first = FormStrip<kDivs, kKeys>(src, t, c, d, te[t], tr[t], ce, cr, u_out, p);
      if (c == 0) hrow[t] = static_cast<double>(first);
      const VD hr = hn::Set(dd, hrow[t]);
      double* HWY_RESTRICT st = state + t * 2 * kP;
      for (size_t k = 0; kVertical && k < 4; ++k) {
        if (t == 0) {
          hc[k] = p[k];
          a[k] = q[k] = hn::Zero(dd);
        } else {
          const VD y = hn::Sub(p[k], hc[k]);
          a[k] = hn::Add(a[k], y);
          q[k] = FmaSquare(y, q[k]);
        }
      }
      // The strip's 4 double vectors fall into `slots` groups of accumulators (vector k into
      // k % slots); each group is loaded once, takes its vectors in channel order, and is
      // stored once. A group's first vector ever starts it from zero.
      VD r1[4], r2[4];
      for (size_t j = 0; j < slots; ++j) {
        const size_t at = (c + j * L) % kP;
        const bool first = c + j * L < kP;
        r1[j] = first ? hn::Zero(dd) : hn::Load(dd, st + at);
        r2[j] = first ? hn::Zero(dd) : hn::Load(dd, st + kP + at);
      }
      for (size_t k = 0; k < 4; ++k) {
        const VD y = hn::Sub(p[k], hr);
        r1[k % slots] = hn::Add(r1[k % slots], y);
        r2[k % slots] = FmaSquare(y, r2[k % slots]);
      }
      for (size_t j = 0; j < slots; ++j) {
        const size_t at = (c + j * L) % kP;
        hn::Store(r1[j], dd, st + at);
        hn::Store(r2[j], dd, st + kP + at);
      }
    }
    for (size_t k = 0; kVertical && k < 4; ++k) hn::StoreU(StdsOf(a[k], q[k], g), dh, ch.std + c + k * L);
  }
  for (size_t t = 0; t < g; ++t) {
    const double* HWY_RESTRICT st = state + t * 2 * kP;
    VD s1[kP / hn::MaxLanes(DD())], s2[kP / hn::MaxLanes(DD())];
    for (size_t k = 0; k < kP / L; ++k) s1[k] = hn::Load(dd, st + k * L), s2[k] = hn::Load(dd, st + kP + k * L);
    for (size_t w = kP / 2; w >= L; w /= 2) {
      for (size_t k = 0; k < w / L; ++k) {
        s1[k] = hn::Add(s1[k], s1[k + w / L]);
        s2[k] = hn::Add(s2[k], s2[k + w / L]);
      }
    }
    s1_out[t] = FoldLanes(dd, s1[0]);
    s2_out[t] = FoldLanes(dd, s2[0]);
  }
  for (size_t t = 0; t < g; t += L) {
    hn::StoreU(StdsOf(hn::LoadU(dd, s1_out + t), hn::LoadU(dd, s2_out + t), d), dh, tok.std + t);
  }
}

// Vertical: the std over the tokens of every channel of cur (see FormCurWith), each channel's
// sums in one accumulator in token order. Strips of two float vectors of channels stay in
// registers while the tokens stream past.
template <int kDivs, bool kKeys>
HWY_NOINLINE void ColPass(const float* HWY_RESTRICT src, size_t g, size_t d, const Axis& tok,
                          const Axis& ch, float* HWY_RESTRICT u_out, float* HWY_RESTRICT std_out) {
  const DF df;
  const DD dd;
  const DH dh;
  const size_t N = hn::Lanes(df), L = hn::Lanes(dd);
  const float* HWY_RESTRICT te = tok.e;
  const float* HWY_RESTRICT tr = tok.r;
  for (size_t c = 0; c < d; c += 2 * N) {
    VF ce[2], cr[2];
    LoadStripScales(ch, c, ce, cr);
    VD h[4], p[4];
    FormStrip<kDivs, kKeys>(src, 0, c, d, te[0], tr[0], ce, cr, u_out, h);
    // Token 0 adds y = 0 to every sum.
    VD a0 = hn::Zero(dd), a1 = a0, a2 = a0, a3 = a0, q0 = a0, q1 = a0, q2 = a0, q3 = a0;
    for (size_t t = 1; t < g; ++t) {
      FormStrip<kDivs, kKeys>(src, t, c, d, te[t], tr[t], ce, cr, u_out, p);
      const VD y0 = hn::Sub(p[0], h[0]);
      const VD y1 = hn::Sub(p[1], h[1]);
      const VD y2 = hn::Sub(p[2], h[2]);
      const VD y3 = hn::Sub(p[3], h[3]);
      a0 = hn::Add(a0, y0), a1 = hn::Add(a1, y1), a2 = hn::Add(a2, y2), a3 = hn::Add(a3, y3);
      q0 = FmaSquare(y0, q0), q1 = FmaSquare(y1, q1), q2 = FmaSquare(y2, q2), q3 = FmaSquare(y3, q3);
    }
    hn::StoreU(StdsOf(a0, q0, g), dh, std_out + c);
    hn::StoreU(StdsOf(a1, q1, g), dh, std_out + c + L);
    hn::StoreU(StdsOf(a2, q2, g), dh, std_out + c + 2 * L);
    hn::StoreU(StdsOf(a3, q3, g), dh, std_out + c + 3 * L);
  }
}

// One axis's share of Imb: max(std) / max(min(std), 1e-8).
HWY_INLINE float AxisImbalanceOf(const Axis& a) {
  const DF df;
  VF lo = hn::Set(df, HUGE_VALF), hi = hn::Set(df, -HUGE_VALF);
  for (size_t i = 0; i < a.n; i += hn::Lanes(df)) {
    const VF v = hn::LoadU(df, a.std + i);
    lo = hn::Min(lo, v);
    hi = hn::Max(hi, v);
  }
  return AxisImbalance(ReduceMax(hi), ReduceMin(lo));
}

// Balances M [g][d] (keys: the first-updated axis is tokens; values: channels). Writes the
// best-so-far scales of each axis and their reciprocals RN(1 / scale).
// REQUIRES: g and d are powers of two, multiples of 2 float vectors and of kChannelPartials.
HWY_INLINE void Balance(const float* HWY_RESTRICT m, size_t g, size_t d, bool keys, int iterations,
                        BalanceScratch& s, float* HWY_RESTRICT tok_scale, float* HWY_RESTRICT tok_inv,
                        float* HWY_RESTRICT ch_scale, float* HWY_RESTRICT ch_inv) {
  assert((g & (g - 1)) == 0 && (d & (d - 1)) == 0 && g >= 32 && d >= 32);
  const Axis tok{s.l_tok.get(), s.e_tok.get(), s.r_tok.get(), s.std_tok.get(), g};
  const Axis ch{s.l_ch.get(), s.e_ch.get(), s.r_ch.get(), s.std_ch.get(), d};
  for (const Axis* a : {&tok, &ch}) {
    std::fill_n(a->l, a->n, 0.0f);
    std::fill_n(a->e, a->n, 1.0f);
    std::fill_n(a->r, a->n, 1.0f);
  }
  std::fill_n(tok_scale, g, 1.0f);
  std::fill_n(ch_scale, d, 1.0f);
  float* u = s.u.get();
  float* tmp = s.tmp.get();
  double* s1 = s.s1.get();
  double* s2 = s.s2.get();
  double* state = s.state.get();
  double* hrow = s.hrow.get();
  StripPass<0, true, true>(m, g, d, tok, ch, nullptr, state, hrow, s1, s2);
  // Imb = column part + row part; the spec's columns are tokens for keys.
  const auto imbalance = [&] {
    return keys ? AxisImbalanceOf(tok) + AxisImbalanceOf(ch) : AxisImbalanceOf(ch) + AxisImbalanceOf(tok);
  };
  float best = imbalance();
  for (int it = 0; it < iterations; ++it) {
    if (keys) {
      UpdateAxis(tok, tmp);
      ColPass<2, true>(m, g, d, tok, ch, u, ch.std);
      UpdateAxis(ch, tmp);
      StripPass<1, true, true>(u, g, d, tok, ch, nullptr, state, hrow, s1, s2);
    } else {
      UpdateAxis(ch, tmp);
      StripPass<2, false, false>(m, g, d, tok, ch, u, state, hrow, s1, s2);
      UpdateAxis(tok, tmp);
      StripPass<1, false, true>(u, g, d, tok, ch, nullptr, state, hrow, s1, s2);
    }
    const float imb = imbalance();
    if (imb <= best) {
      best = imb;
      std::copy_n(tok.e, g, tok_scale);
      std::copy_n(ch.e, d, ch_scale);
    }
  }
  const DF df;
  const VF one = hn::Set(df, 1.0f);
  for (size_t i = 0; i < g; i += hn::Lanes(df)) {
    hn::StoreU(hn::Div(one, hn::LoadU(df, tok_scale + i)), df, tok_inv + i);
  }
  for (size_t i = 0; i < d; i += hn::Lanes(df)) {
    hn::StoreU(hn::Div(one, hn::LoadU(df, ch_scale + i)), df, ch_inv + i);
  }
}

#endif  // HWY_TARGET != HWY_SCALAR
}  // namespace HWY_NAMESPACE
}  // namespace kvarn
HWY_AFTER_NAMESPACE();

#endif  // KVARN_KERNELS_SIMD_BALANCE_INL_H_
