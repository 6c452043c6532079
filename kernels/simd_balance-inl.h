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
//
// Speed: the passes are pure multiply-add streams (two per element, the floor for a shifted
// sum and sum of squares of scaled values) over the tile, widened to double once (exactly).
// A row's std is taken without the row's own scale and a column's without the column's own
// (each factors out), so a pass reads only the other axis's scales; everything per row or per
// column (std from the sums, log-scale update, reciprocal, the imbalance) is vectorized along
// the axis. Every value comes from the same IEEE operations, in the same order, as the
// straightforward per-element form. The three passes are kept out of line: one copy of each
// hot loop, whose speed then does not depend on the code around its call site (inlined
// copies measured up to 1.5x apart).
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

using DD = hn::ScalableTag<double>;
using DFD = hn::Rebind<float, DD>;  // as many floats as double lanes
using VD = hn::Vec<DD>;

// std[i] = scale[i] * Bessel-corrected std of n values with shifted sums s1[i], s2[i], for
// `count` (a multiple of the double vector length) elements. n is a power of two, so
// multiplying by 1/n rounds exactly as dividing by n does.
HWY_INLINE void StdsFromSums(size_t count, size_t n, const double* HWY_RESTRICT s1,
                             const double* HWY_RESTRICT s2, const double* HWY_RESTRICT scale,
                             double* HWY_RESTRICT std) {
  const DD dd;
  HWY_DASSERT((n & (n - 1)) == 0);
  const VD inv_n = hn::Set(dd, 1.0 / static_cast<double>(n));
  const VD n1 = hn::Set(dd, static_cast<double>(n) - 1.0), zero = hn::Zero(dd);
  for (size_t i = 0; i < count; i += hn::Lanes(dd)) {
    const VD a = hn::LoadU(dd, s1 + i);
    const VD var = hn::Div(hn::Sub(hn::LoadU(dd, s2 + i), hn::Mul(hn::Mul(a, a), inv_n)), n1);
    const VD sd = hn::Sqrt(hn::IfThenElse(hn::Gt(var, zero), var, zero));
    hn::StoreU(hn::Mul(hn::LoadU(dd, scale + i), sd), dd, std + i);
  }
}

// The first pass over the rows, where every scale is 1 (x * 1 - h is x - h): widens the float
// tile to double into md (exactly) and takes each row's shifted sums, the shift being the
// row's first element.
HWY_NOINLINE inline void WidenAndRowSums(const float* HWY_RESTRICT m, size_t rows, size_t cols,
                                         double* HWY_RESTRICT md, double* HWY_RESTRICT s1,
                                         double* HWY_RESTRICT s2) {
  const DD dd;
  const DFD df;
  const size_t N = hn::Lanes(dd);
  for (size_t r = 0; r < rows; ++r) {
    const float* HWY_RESTRICT row = m + r * cols;
    double* HWY_RESTRICT out = md + r * cols;
    const VD h = hn::Set(dd, static_cast<double>(row[0])), one = hn::Set(dd, 1.0);
    VD a = hn::Zero(dd), b = a, q = a, p = a;
    for (size_t c = 0; c < cols; c += 2 * N) {
      const VD xa = hn::PromoteTo(dd, hn::LoadU(df, row + c));
      const VD xb = hn::PromoteTo(dd, hn::LoadU(df, row + c + N));
      hn::StoreU(xa, dd, out + c);
      hn::StoreU(xb, dd, out + c + N);
      // x - h, once on the adder and once as x * 1 - h on the FMA unit (same rounding).
      const VD ya = hn::Sub(xa, h), yb = hn::MulSub(xb, one, h);
      a = hn::Add(a, ya), q = hn::MulAdd(ya, ya, q);
      b = hn::Add(b, yb), p = hn::MulAdd(yb, yb, p);
    }
    s1[r] = hn::GetLane(hn::SumOfLanes(dd, hn::Add(a, b)));
    s2[r] = hn::GetLane(hn::SumOfLanes(dd, hn::Add(q, p)));
  }
}

// Shifted sums of each row of m[r][c] * rc[c], the shift being the row's first element. Two
// rows at a time, two accumulators each (even and odd vectors), so that the multiply-add
// streams are independent.
HWY_NOINLINE inline void RowSums(const double* HWY_RESTRICT m, size_t rows, size_t cols,
                                 const double* HWY_RESTRICT rc, double* HWY_RESTRICT s1,
                                 double* HWY_RESTRICT s2) {
  const DD dd;
  const size_t N = hn::Lanes(dd);
  for (size_t r = 0; r < rows; r += 2) {
    const double* HWY_RESTRICT row0 = m + r * cols;
    const double* HWY_RESTRICT row1 = row0 + cols;
    const VD h0 = hn::Set(dd, row0[0] * rc[0]), h1 = hn::Set(dd, row1[0] * rc[0]);
    VD a0 = hn::Zero(dd), b0 = a0, q0 = a0, p0 = a0, a1 = a0, b1 = a0, q1 = a0, p1 = a0;
    for (size_t c = 0; c < cols; c += 2 * N) {
      const VD sa = hn::LoadU(dd, rc + c), sb = hn::LoadU(dd, rc + c + N);
      const VD y0 = hn::MulSub(hn::LoadU(dd, row0 + c), sa, h0);
      const VD z0 = hn::MulSub(hn::LoadU(dd, row0 + c + N), sb, h0);
      const VD y1 = hn::MulSub(hn::LoadU(dd, row1 + c), sa, h1);
      const VD z1 = hn::MulSub(hn::LoadU(dd, row1 + c + N), sb, h1);
      a0 = hn::Add(a0, y0), q0 = hn::MulAdd(y0, y0, q0);
      b0 = hn::Add(b0, z0), p0 = hn::MulAdd(z0, z0, p0);
      a1 = hn::Add(a1, y1), q1 = hn::MulAdd(y1, y1, q1);
      b1 = hn::Add(b1, z1), p1 = hn::MulAdd(z1, z1, p1);
    }
    s1[r] = hn::GetLane(hn::SumOfLanes(dd, hn::Add(a0, b0)));
    s2[r] = hn::GetLane(hn::SumOfLanes(dd, hn::Add(q0, p0)));
    s1[r + 1] = hn::GetLane(hn::SumOfLanes(dd, hn::Add(a1, b1)));
    s2[r + 1] = hn::GetLane(hn::SumOfLanes(dd, hn::Add(q1, p1)));
  }
}

// Shifted sums of each column of m[r][c] * rr[r], the shift being the column's first element.
// Four vectors of columns stay in registers while the rows stream past. kUnitScales: the
// first pass, where every rr is 1 and x * 1 - h is x - h.
template <bool kUnitScales>
HWY_NOINLINE void ColSums(const double* HWY_RESTRICT m, size_t rows, size_t cols,
                          const double* HWY_RESTRICT rr, double* HWY_RESTRICT s1,
                          double* HWY_RESTRICT s2) {
  const DD dd;
  const size_t N = hn::Lanes(dd);
  const auto scaled_minus = [](VD x, VD scale, VD h) {
    return kUnitScales ? hn::Sub(x, h) : hn::MulSub(x, scale, h);
  };
  for (size_t c = 0; c < cols; c += 4 * N) {
    const VD r0 = hn::Set(dd, rr[0]);
    const VD h0 = hn::Mul(hn::LoadU(dd, m + c), r0), h1 = hn::Mul(hn::LoadU(dd, m + c + N), r0);
    const VD h2 = hn::Mul(hn::LoadU(dd, m + c + 2 * N), r0);
    const VD h3 = hn::Mul(hn::LoadU(dd, m + c + 3 * N), r0);
    VD a0 = hn::Zero(dd), a1 = a0, a2 = a0, a3 = a0, q0 = a0, q1 = a0, q2 = a0, q3 = a0;
    for (size_t r = 0; r < rows; ++r) {
      const double* HWY_RESTRICT row = m + r * cols + c;
      const VD ir = hn::Set(dd, rr[r]);
      const VD y0 = scaled_minus(hn::LoadU(dd, row), ir, h0);
      const VD y1 = scaled_minus(hn::LoadU(dd, row + N), ir, h1);
      const VD y2 = scaled_minus(hn::LoadU(dd, row + 2 * N), ir, h2);
      const VD y3 = scaled_minus(hn::LoadU(dd, row + 3 * N), ir, h3);
      a0 = hn::Add(a0, y0), a1 = hn::Add(a1, y1), a2 = hn::Add(a2, y2), a3 = hn::Add(a3, y3);
      q0 = hn::MulAdd(y0, y0, q0), q1 = hn::MulAdd(y1, y1, q1);
      q2 = hn::MulAdd(y2, y2, q2), q3 = hn::MulAdd(y3, y3, q3);
    }
    hn::StoreU(a0, dd, s1 + c), hn::StoreU(a1, dd, s1 + c + N);
    hn::StoreU(a2, dd, s1 + c + 2 * N), hn::StoreU(a3, dd, s1 + c + 3 * N);
    hn::StoreU(q0, dd, s2 + c), hn::StoreU(q1, dd, s2 + c + N);
    hn::StoreU(q2, dd, s2 + c + 2 * N), hn::StoreU(q3, dd, s2 + c + 3 * N);
  }
}

// The stds of every row (resp. column) of cur = m * rc (per column) * rr (per row): a row's
// own scale factors out of its sums, and multiplies its std.
HWY_INLINE void RowStds(const double* HWY_RESTRICT m, size_t rows, size_t cols, BalanceScratch& s) {
  RowSums(m, rows, cols, s.rc.get(), s.s1.get(), s.s2.get());
  StdsFromSums(rows, cols, s.s1.get(), s.s2.get(), s.rr.get(), s.sr.get());
}
template <bool kUnitScales = false>
HWY_INLINE void ColStds(const double* HWY_RESTRICT m, size_t rows, size_t cols, BalanceScratch& s) {
  ColSums<kUnitScales>(m, rows, cols, s.rr.get(), s.s1.get(), s.s2.get());
  StdsFromSums(cols, rows, s.s1.get(), s.s2.get(), s.rc.get(), s.sc.get());
}

// One axis's share of Imb on float-rounded stds, as the reference computes it.
HWY_INLINE float AxisImbalanceOf(const double* HWY_RESTRICT std, size_t n) {
  const DD dd;
  const DFD df;
  auto lo = hn::Set(df, HUGE_VALF), hi = hn::Set(df, -HUGE_VALF);
  for (size_t i = 0; i < n; i += hn::Lanes(dd)) {
    const auto v = hn::DemoteTo(df, hn::LoadU(dd, std + i));
    lo = hn::Min(lo, v);
    hi = hn::Max(hi, v);
  }
  return AxisImbalance(hn::GetLane(hn::MaxOfLanes(df, hi)), hn::GetLane(hn::MinOfLanes(df, lo)));
}

// l = clamp(l + log(clamp(float(std)))), recip = 1 / double(exp(l)). With `std_after`,
// std *= recip_new / recip_old: the axis's std once the update is applied. `tmp` holds n
// floats.
HWY_INLINE void UpdateAxis(size_t n, double* HWY_RESTRICT std, float* HWY_RESTRICT l,
                           double* HWY_RESTRICT recip, bool std_after, float* HWY_RESTRICT tmp) {
  const DD dd;
  const DF df;
  for (size_t i = 0; i < n; i += hn::Lanes(dd)) {
    hn::StoreU(hn::DemoteTo(DFD(), hn::LoadU(dd, std + i)), DFD(), tmp + i);
  }
  const VF smin = hn::Set(df, kStdMin), smax = hn::Set(df, kStdMax);
  const VF lmin = hn::Set(df, kLogScaleMin), lmax = hn::Set(df, kLogScaleMax);
  // Two loops, so that the logs (and then the exps) of different vectors overlap.
  for (size_t i = 0; i < n; i += hn::Lanes(df)) {
    const VF s = hn::Min(hn::Max(hn::LoadU(df, tmp + i), smin), smax);
    hn::StoreU(hn::Min(hn::Max(hn::Add(hn::LoadU(df, l + i), hn::Log(df, s)), lmin), lmax), df,
               l + i);
  }
  for (size_t i = 0; i < n; i += hn::Lanes(df))
    hn::StoreU(hn::Exp(df, hn::LoadU(df, l + i)), df, tmp + i);
  const VD one = hn::Set(dd, 1.0);
  for (size_t i = 0; i < n; i += hn::Lanes(dd)) {
    const VD r = hn::Div(one, hn::PromoteTo(dd, hn::LoadU(DFD(), tmp + i)));
    if (std_after) {
      hn::StoreU(hn::Mul(hn::LoadU(dd, std + i), hn::Div(r, hn::LoadU(dd, recip + i))), dd,
                 std + i);
    }
    hn::StoreU(r, dd, recip + i);
  }
}

// Balances m [rows][cols]. `rows_first`: the spec's first-updated ("column") axis is m's
// rows (keys: per token) rather than m's columns (values: per channel). Writes the
// best-so-far scales and their float reciprocals.
// REQUIRES: rows and cols are powers of two and multiples of 4 double vectors (G, D >= 64).
HWY_INLINE void Balance(const float* HWY_RESTRICT m_float, size_t rows, size_t cols,
                        bool rows_first, int iterations, BalanceScratch& s,
                        float* HWY_RESTRICT row_scale, float* HWY_RESTRICT row_inv,
                        float* HWY_RESTRICT col_scale, float* HWY_RESTRICT col_inv) {
  assert((rows & (rows - 1)) == 0 && (cols & (cols - 1)) == 0 && rows >= 64 && cols >= 64);
  double* HWY_RESTRICT m = s.tile.get();
  std::fill_n(s.lr.get(), rows, 0.0f);
  std::fill_n(s.lc.get(), cols, 0.0f);
  std::fill_n(s.rr.get(), rows, 1.0);
  std::fill_n(s.rc.get(), cols, 1.0);
  std::fill_n(s.best_lr.get(), rows, 0.0f);
  std::fill_n(s.best_lc.get(), cols, 0.0f);
  WidenAndRowSums(m_float, rows, cols, m, s.s1.get(), s.s2.get());
  StdsFromSums(rows, cols, s.s1.get(), s.s2.get(), s.rr.get(), s.sr.get());
  ColStds</*kUnitScales=*/true>(m, rows, cols, s);
  const auto imbalance = [&] {
    return AxisImbalanceOf(s.sc.get(), cols) + AxisImbalanceOf(s.sr.get(), rows);
  };
  float best = imbalance();
  for (int it = 0; it < iterations; ++it) {
    if (rows_first) {
      UpdateAxis(rows, s.sr.get(), s.lr.get(), s.rr.get(), false, s.tmp.get());
      ColStds(m, rows, cols, s);
      UpdateAxis(cols, s.sc.get(), s.lc.get(), s.rc.get(), true, s.tmp.get());
      RowStds(m, rows, cols, s);
    } else {
      UpdateAxis(cols, s.sc.get(), s.lc.get(), s.rc.get(), false, s.tmp.get());
      RowStds(m, rows, cols, s);
      UpdateAxis(rows, s.sr.get(), s.lr.get(), s.rr.get(), true, s.tmp.get());
      ColStds(m, rows, cols, s);
    }
    const float imb = imbalance();
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
