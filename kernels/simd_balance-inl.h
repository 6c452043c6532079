// Dual-axis balancing (KVARN_SPEC.md §3), per target.
//
// The iteration keeps the best-so-far scales, and near convergence successive iterations
// tie to within a few float ulps of the imbalance; which one wins decides how the scales
// split between the two axes. To pick the iteration the reference picks, statistics are
// exact in the reference's sense: the scaled tile T / exp(Lc) / exp(Lr) is formed in double
// (a float times the double reciprocal of a float is exact to 1e-16), stds accumulate in
// double and are rounded to float once, like the reference's double std. The std of the axis
// updated second needs no pass: rescaling a row by r_new / r_old scales its std by exactly
// that factor. Two passes per iteration remain, each 8 doubles wide.
#if defined(KVARN_KERNELS_SIMD_BALANCE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVARN_KERNELS_SIMD_BALANCE_INL_H_
#undef KVARN_KERNELS_SIMD_BALANCE_INL_H_
#else
#define KVARN_KERNELS_SIMD_BALANCE_INL_H_
#endif

#include <algorithm>
#include <cmath>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "kernels/kvarn_math.h"
#include "kernels/simd_scratch.h"

HWY_BEFORE_NAMESPACE();
namespace kvarn {
namespace HWY_NAMESPACE {

using DD = hn::ScalableTag<double>;
using DFD = hn::Rebind<float, DD>;  // as many floats as double lanes
using VD = hn::Vec<DD>;

HWY_INLINE VD LoadWide(const float* p) { return hn::PromoteTo(DD(), hn::LoadU(DFD(), p)); }

HWY_INLINE double StdFromSums(double n, double s1, double s2) {
  const double var = (s2 - s1 * s1 / n) / (n - 1.0);
  return std::sqrt(var > 0.0 ? var : 0.0);
}

// std of each row of cur[r][c] = m[r][c] * rc[c] * rr[r], shifted one-pass sums in double.
HWY_INLINE void RowStds(const float* HWY_RESTRICT m, size_t rows, size_t cols,
                        const double* HWY_RESTRICT rc, const double* HWY_RESTRICT rr,
                        double* HWY_RESTRICT out) {
  const DD dd;
  const size_t N = hn::Lanes(dd);
  for (size_t r = 0; r < rows; ++r) {
    const float* HWY_RESTRICT row = m + r * cols;
    const VD shift = hn::Set(dd, static_cast<double>(row[0]) * rc[0]);
    VD s1a = hn::Zero(dd), s2a = s1a, s1b = s1a, s2b = s1a;
    for (size_t c = 0; c < cols; c += 2 * N) {
      const VD ya = hn::MulSub(LoadWide(row + c), hn::LoadU(dd, rc + c), shift);
      const VD yb = hn::MulSub(LoadWide(row + c + N), hn::LoadU(dd, rc + c + N), shift);
      s1a = hn::Add(s1a, ya);
      s2a = hn::MulAdd(ya, ya, s2a);
      s1b = hn::Add(s1b, yb);
      s2b = hn::MulAdd(yb, yb, s2b);
    }
    const double s1 = hn::GetLane(hn::SumOfLanes(dd, hn::Add(s1a, s1b)));
    const double s2 = hn::GetLane(hn::SumOfLanes(dd, hn::Add(s2a, s2b)));
    out[r] = rr[r] * StdFromSums(static_cast<double>(cols), s1, s2);
  }
}

// std of each column of cur; four vectors of columns stay in registers while rows stream.
HWY_INLINE void ColStds(const float* HWY_RESTRICT m, size_t rows, size_t cols,
                        const double* HWY_RESTRICT rc, const double* HWY_RESTRICT rr,
                        double* HWY_RESTRICT out) {
  const DD dd;
  const size_t N = hn::Lanes(dd);
  const auto finish = [&](VD s1, VD s2, size_t c) {
    alignas(64) double a[HWY_MAX_BYTES / sizeof(double)], b[HWY_MAX_BYTES / sizeof(double)];
    hn::Store(s1, dd, a);
    hn::Store(s2, dd, b);
    for (size_t i = 0; i < N; ++i) out[c + i] = rc[c + i] * StdFromSums(static_cast<double>(rows), a[i], b[i]);
  };
  for (size_t c = 0; c < cols; c += 4 * N) {
    const VD r0 = hn::Set(dd, rr[0]);
    const VD h0 = hn::Mul(LoadWide(m + c), r0), h1 = hn::Mul(LoadWide(m + c + N), r0);
    const VD h2 = hn::Mul(LoadWide(m + c + 2 * N), r0), h3 = hn::Mul(LoadWide(m + c + 3 * N), r0);
    VD a0 = hn::Zero(dd), a1 = a0, a2 = a0, a3 = a0, q0 = a0, q1 = a0, q2 = a0, q3 = a0;
    for (size_t r = 0; r < rows; ++r) {
      const float* HWY_RESTRICT row = m + r * cols + c;
      const VD ir = hn::Set(dd, rr[r]);
      const VD y0 = hn::MulSub(LoadWide(row), ir, h0);
      const VD y1 = hn::MulSub(LoadWide(row + N), ir, h1);
      const VD y2 = hn::MulSub(LoadWide(row + 2 * N), ir, h2);
      const VD y3 = hn::MulSub(LoadWide(row + 3 * N), ir, h3);
      a0 = hn::Add(a0, y0), a1 = hn::Add(a1, y1), a2 = hn::Add(a2, y2), a3 = hn::Add(a3, y3);
      q0 = hn::MulAdd(y0, y0, q0), q1 = hn::MulAdd(y1, y1, q1);
      q2 = hn::MulAdd(y2, y2, q2), q3 = hn::MulAdd(y3, y3, q3);
    }
    finish(a0, q0, c), finish(a1, q1, c + N), finish(a2, q2, c + 2 * N), finish(a3, q3, c + 3 * N);
  }
}

// Imb on float-rounded stds, as the reference computes it.
HWY_INLINE float Imbalance(const double* a, size_t na, const double* b, size_t nb) {
  const auto axis = [](const double* s, size_t n) {
    float lo = static_cast<float>(s[0]), hi = lo;
    for (size_t i = 1; i < n; ++i) {
      const float v = static_cast<float>(s[i]);
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    return AxisImbalance(hi, lo);
  };
  return axis(a, na) + axis(b, nb);
}

// l = clamp(l + log(clamp(float(std)))), e = exp(l), recip = 1 / e. With `std_after`,
// std *= recip_new / recip_old: the axis's std once the update is applied.
HWY_INLINE void UpdateAxis(size_t n, double* HWY_RESTRICT std, float* HWY_RESTRICT l,
                           float* HWY_RESTRICT e, double* HWY_RESTRICT recip,
                           float* HWY_RESTRICT tmp, bool std_after) {
  const DF df;
  for (size_t i = 0; i < n; ++i) tmp[i] = static_cast<float>(std[i]);
  const VF smin = hn::Set(df, kStdMin), smax = hn::Set(df, kStdMax);
  const VF lmin = hn::Set(df, kLogScaleMin), lmax = hn::Set(df, kLogScaleMax);
  for (size_t i = 0; i < n; i += hn::Lanes(df)) {
    const VF s = hn::Min(hn::Max(hn::LoadU(df, tmp + i), smin), smax);
    const VF lnew = hn::Min(hn::Max(hn::Add(hn::LoadU(df, l + i), hn::Log(df, s)), lmin), lmax);
    hn::StoreU(lnew, df, l + i);
    hn::StoreU(hn::Exp(df, lnew), df, e + i);
  }
  for (size_t i = 0; i < n; ++i) {
    const double r = 1.0 / static_cast<double>(e[i]);
    if (std_after) std[i] *= r / recip[i];
    recip[i] = r;
  }
}

// Balances m [rows][cols]. `rows_first`: the spec's first-updated ("column") axis is m's
// rows (keys: per token) rather than m's columns (values: per channel). Writes the
// best-so-far scales and their float reciprocals.
HWY_INLINE void Balance(const float* HWY_RESTRICT m, size_t rows, size_t cols, bool rows_first,
                        int iterations, BalanceScratch& s, float* HWY_RESTRICT row_scale,
                        float* HWY_RESTRICT row_inv, float* HWY_RESTRICT col_scale,
                        float* HWY_RESTRICT col_inv) {
  std::fill_n(s.lr.get(), rows, 0.0f);
  std::fill_n(s.lc.get(), cols, 0.0f);
  std::fill_n(s.rr.get(), rows, 1.0);
  std::fill_n(s.rc.get(), cols, 1.0);
  std::fill_n(s.best_lr.get(), rows, 0.0f);
  std::fill_n(s.best_lc.get(), cols, 0.0f);
  RowStds(m, rows, cols, s.rc.get(), s.rr.get(), s.sr.get());
  ColStds(m, rows, cols, s.rc.get(), s.rr.get(), s.sc.get());
  float best = Imbalance(s.sc.get(), cols, s.sr.get(), rows);
  for (int it = 0; it < iterations; ++it) {
    if (rows_first) {
      UpdateAxis(rows, s.sr.get(), s.lr.get(), s.er.get(), s.rr.get(), s.fr.get(), false);
      ColStds(m, rows, cols, s.rc.get(), s.rr.get(), s.sc.get());
      UpdateAxis(cols, s.sc.get(), s.lc.get(), s.ec.get(), s.rc.get(), s.fc.get(), true);
      RowStds(m, rows, cols, s.rc.get(), s.rr.get(), s.sr.get());
    } else {
      UpdateAxis(cols, s.sc.get(), s.lc.get(), s.ec.get(), s.rc.get(), s.fc.get(), false);
      RowStds(m, rows, cols, s.rc.get(), s.rr.get(), s.sr.get());
      UpdateAxis(rows, s.sr.get(), s.lr.get(), s.er.get(), s.rr.get(), s.fr.get(), true);
      ColStds(m, rows, cols, s.rc.get(), s.rr.get(), s.sc.get());
    }
    const float imb = Imbalance(s.sc.get(), cols, s.sr.get(), rows);
    if (imb <= best) {
      best = imb;
      std::copy_n(s.lr.get(), rows, s.best_lr.get());
      std::copy_n(s.lc.get(), cols, s.best_lc.get());
    }
  }
  const DF df;
  for (size_t i = 0; i < rows; i += hn::Lanes(df)) {
    const VF l = hn::LoadU(df, s.best_lr.get() + i);
    hn::StoreU(hn::Exp(df, l), df, row_scale + i);
    hn::StoreU(hn::Exp(df, hn::Neg(l)), df, row_inv + i);
  }
  for (size_t i = 0; i < cols; i += hn::Lanes(df)) {
    const VF l = hn::LoadU(df, s.best_lc.get() + i);
    hn::StoreU(hn::Exp(df, l), df, col_scale + i);
    hn::StoreU(hn::Exp(df, hn::Neg(l)), df, col_inv + i);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kvarn
HWY_AFTER_NAMESPACE();

#endif  // KVARN_KERNELS_SIMD_BALANCE_INL_H_
