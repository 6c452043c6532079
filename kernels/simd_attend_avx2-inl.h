// Integer dot products of decode attention (KVARN_SPEC.md §7) for x86 CPUs with AVX2 and no
// AVX-512 VNNI: the same approximation as simd_attend_int-inl.h (int8 folded query in one or
// two levels, u8 softmax weights, the mean code times what the rounding drops added back),
// with vpmaddubsw (u8 x s8 pairs into s16) where VNNI has vpdpbusd. Each s16 lane sums a few
// groups of four codes before vpmaddwd widens it, within bounds stated at each kernel.
//
// Plane order is simd_attend.cc's for the AVX2 target's 8 float lanes: key scores in
// token-plane order (position 16*chunk + 8*plane + lane holds token 2*(8*chunk + lane) +
// plane), value sums in channel-plane order (position 32*chunk + 8*plane + lane holds
// channel 4*(8*chunk + lane) + plane), so the fp32 bookkeeping around them is the exact
// path's.
//
// Include guard in Highway's per-target form: this header is re-included once per target.
#if defined(KVARN_KERNELS_SIMD_ATTEND_AVX2_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVARN_KERNELS_SIMD_ATTEND_AVX2_INL_H_
#undef KVARN_KERNELS_SIMD_ATTEND_AVX2_INL_H_
#else
#define KVARN_KERNELS_SIMD_ATTEND_AVX2_INL_H_
#endif

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "hwy/highway.h"
#include "kernels/attend_exp2.h"

#undef KVARN_ATTEND_AVX2INT
#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
#define KVARN_ATTEND_AVX2INT 1
#include <immintrin.h>
#else
#define KVARN_ATTEND_AVX2INT 0
#endif

#if KVARN_ATTEND_AVX2INT
HWY_BEFORE_NAMESPACE();
namespace kvarn {
namespace HWY_NAMESPACE {
namespace avx2int {

// Dword j (j < 8) of the result holds byte j of the four rows r, r + stride, r + 2 stride,
// r + 3 stride, in that order: a 4 x 8 byte transpose by unpacks.
HWY_INLINE __m256i Quad8(const uint8_t* HWY_RESTRICT r, size_t stride) {
  const __m128i a = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(r));
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(r + stride));
  const __m128i c = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(r + 2 * stride));
  const __m128i e = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(r + 3 * stride));
  const __m128i ab = _mm_unpacklo_epi8(a, b), ce = _mm_unpacklo_epi8(c, e);
  return _mm256_set_m128i(_mm_unpackhi_epi16(ab, ce), _mm_unpacklo_epi16(ab, ce));
}

HWY_INLINE __m256i Dword(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// One step of KeyDots<4>: the four rows p, p + rb, p + 2 rb, p + 3 rb (8 bytes each) as
// Quad8, split into even and odd tokens, times the four heads' query dwords at q, q + dq,
// q + 2 dq, q + 3 dq, added into s[h][0] (even) and s[h][1] (odd). Written in assembly
// because gcc 12 keeps three of the eight sums of the intrinsics version on the stack
// (a store-to-load chain through every step, docs/benchmarks.md); here they are operands
// that stay in registers across the loop. Same instructions and order as the intrinsics.
// REQUIRES: rb <= 64 and dq <= 128 (FastPathApplies: g <= 128, d = 128).
HWY_INLINE void KeyStep4(const uint8_t* p, size_t rb, size_t rb3, const int8_t* q, size_t dq,
                         size_t dq3, __m256i low, __m256i (&s)[4][2]) {
  __m256i t0, t1, t2, t3;
  asm("vmovq (%[p]), %x[t0]\n\t"
      "vmovq (%[p],%[rb]), %x[t1]\n\t"
      "vpunpcklbw %x[t1], %x[t0], %x[t0]\n\t"
      "vmovq (%[p],%[rb],2), %x[t1]\n\t"
      "vmovq (%[p],%[rb3]), %x[t2]\n\t"
      "vpunpcklbw %x[t2], %x[t1], %x[t1]\n\t"
      "vpunpckhwd %x[t1], %x[t0], %x[t2]\n\t"
      "vpunpcklwd %x[t1], %x[t0], %x[t0]\n\t"
      "vinserti128 $1, %x[t2], %t[t0], %t[t0]\n\t"
      "vpsrlw $4, %t[t0], %t[t1]\n\t"
      "vpand %t[low], %t[t0], %t[t0]\n\t"
      "vpand %t[low], %t[t1], %t[t1]\n\t"
      "vpbroadcastd (%[q]), %t[t2]\n\t"
      "vpmaddubsw %t[t2], %t[t0], %t[t3]\n\t"
      "vpaddw %t[t3], %t[s00], %t[s00]\n\t"
      "vpmaddubsw %t[t2], %t[t1], %t[t3]\n\t"
      "vpaddw %t[t3], %t[s01], %t[s01]\n\t"
      "vpbroadcastd (%[q],%[dq]), %t[t2]\n\t"
      "vpmaddubsw %t[t2], %t[t0], %t[t3]\n\t"
      "vpaddw %t[t3], %t[s10], %t[s10]\n\t"
      "vpmaddubsw %t[t2], %t[t1], %t[t3]\n\t"
      "vpaddw %t[t3], %t[s11], %t[s11]\n\t"
      "vpbroadcastd (%[q],%[dq],2), %t[t2]\n\t"
      "vpmaddubsw %t[t2], %t[t0], %t[t3]\n\t"
      "vpaddw %t[t3], %t[s20], %t[s20]\n\t"
      "vpmaddubsw %t[t2], %t[t1], %t[t3]\n\t"
      "vpaddw %t[t3], %t[s21], %t[s21]\n\t"
      "vpbroadcastd (%[q],%[dq3]), %t[t2]\n\t"
      "vpmaddubsw %t[t2], %t[t0], %t[t3]\n\t"
      "vpaddw %t[t3], %t[s30], %t[s30]\n\t"
      "vpmaddubsw %t[t2], %t[t1], %t[t3]\n\t"
      "vpaddw %t[t3], %t[s31], %t[s31]"
      : [s00] "+x"(s[0][0]), [s01] "+x"(s[0][1]), [s10] "+x"(s[1][0]), [s11] "+x"(s[1][1]),
        [s20] "+x"(s[2][0]), [s21] "+x"(s[2][1]), [s30] "+x"(s[3][0]), [s31] "+x"(s[3][1]),
        [t0] "=&x"(t0), [t1] "=&x"(t1), [t2] "=&x"(t2), [t3] "=&x"(t3)
      : [p] "r"(p), [rb] "r"(rb), [rb3] "r"(rb3), [q] "r"(q), [dq] "r"(dq), [dq3] "r"(dq3),
        [low] "x"(low),
        // What the instructions read (at most, for g and d up to 128), for the compiler's
        // ordering of loads and stores.
        "m"(*reinterpret_cast<const uint8_t(*)[3 * 64 + 8]>(p)),
        "m"(*reinterpret_cast<const int8_t(*)[3 * 128 + 4]>(q)));
}

// out[h][pos] = sum_c qi[h][c] * qK[c][t(pos)] in token-plane order, for H query heads.
// codes: the record's [d][g/2] key codes; qi: [H][d] int8 in [-127, 127]. g a multiple of 16,
// d of 32. A vpmaddubsw lane is two products of at most 15 * 127: eight groups of channels
// (32) stay below 8 * 3810 = 30480 < 2^15 in s16. pf.Step() once per group of 4 channels.
template <int H, class Prefetch>
HWY_INLINE void KeyDots(const uint8_t* HWY_RESTRICT codes, size_t g, size_t d,
                        const int8_t* HWY_RESTRICT qi, int32_t* HWY_RESTRICT out, Prefetch& pf) {
  const size_t row_bytes = g / 2;
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (size_t k = 0; k < row_bytes; k += 8) {  // 16 tokens: positions 2k .. 2k + 15
    // The s32 sums live in `out` between blocks of 32 channels: the registers hold the
    // 2H s16 sums.
    for (size_t c0 = 0; c0 < d; c0 += 32) {
      __m256i s[H][2];
      for (int h = 0; h < H; ++h) s[h][0] = s[h][1] = _mm256_setzero_si256();
      for (size_t c = c0; c < c0 + 32; c += 4) {
        pf.Step();
        if constexpr (H == 4) {
          KeyStep4(codes + c * row_bytes + k, row_bytes, 3 * row_bytes, qi + c, d, 3 * d, low, s);
        } else {
          const __m256i x = Quad8(codes + c * row_bytes + k, row_bytes);
          const __m256i even = _mm256_and_si256(x, low);                      // tokens 2j
          const __m256i odd = _mm256_and_si256(_mm256_srli_epi16(x, 4), low);  // tokens 2j + 1
          for (int h = 0; h < H; ++h) {
            const __m256i qv = Dword(qi + h * d + c);
            s[h][0] = _mm256_add_epi16(s[h][0], _mm256_maddubs_epi16(even, qv));
            s[h][1] = _mm256_add_epi16(s[h][1], _mm256_maddubs_epi16(odd, qv));
          }
        }
      }
      for (int h = 0; h < H; ++h) {
        for (int j = 0; j < 2; ++j) {
          auto* o = reinterpret_cast<__m256i*>(out + h * g + 2 * k + 8 * j);
          const __m256i sum = _mm256_madd_epi16(s[h][j], ones);
          _mm256_storeu_si256(o, c0 == 0 ? sum : _mm256_add_epi32(_mm256_loadu_si256(o), sum));
        }
      }
    }
  }
}

// out[h][pos] = sum_t w[h][t] * qV[t][c(pos)] in channel-plane order, for H query heads and
// d = 128 channels. codes: the record's [g][32] value codes (2 bits); w: [H][g] u8 weights in
// natural token order. g a multiple of 4. A vpmaddubsw lane is two products of at most
// 255 * 3: sixteen groups of tokens (64) stay below 16 * 1530 = 24480 in s16.
template <int H, class Prefetch>
HWY_INLINE void ValueSums(const uint8_t* HWY_RESTRICT codes, size_t g,
                          const uint8_t* HWY_RESTRICT w, int32_t* HWY_RESTRICT out, Prefetch& pf) {
  constexpr size_t kRowBytes = 32;
  const __m256i three = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
  for (size_t k = 0; k < kRowBytes; k += 8) {  // 32 channels: positions 4k .. 4k + 31
    for (size_t t0 = 0; t0 < g; t0 += 64) {
      __m256i s[H][4];
      for (int h = 0; h < H; ++h) s[h][0] = s[h][1] = s[h][2] = s[h][3] = _mm256_setzero_si256();
      const size_t t1 = t0 + 64 < g ? t0 + 64 : g;
      for (size_t t = t0; t < t1; t += 4) {
        pf.Step();
        const __m256i x = Quad8(codes + t * kRowBytes + k, kRowBytes);
        const __m256i v0 = _mm256_and_si256(x, three);
        const __m256i v1 = _mm256_and_si256(_mm256_srli_epi16(x, 2), three);
        const __m256i v2 = _mm256_and_si256(_mm256_srli_epi16(x, 4), three);
        const __m256i v3 = _mm256_and_si256(_mm256_srli_epi16(x, 6), three);
        for (int h = 0; h < H; ++h) {
          const __m256i wv = Dword(w + h * g + t);
          s[h][0] = _mm256_add_epi16(s[h][0], _mm256_maddubs_epi16(wv, v0));
          s[h][1] = _mm256_add_epi16(s[h][1], _mm256_maddubs_epi16(wv, v1));
          s[h][2] = _mm256_add_epi16(s[h][2], _mm256_maddubs_epi16(wv, v2));
          s[h][3] = _mm256_add_epi16(s[h][3], _mm256_maddubs_epi16(wv, v3));
        }
      }
      for (int h = 0; h < H; ++h) {
        for (int p = 0; p < 4; ++p) {
          auto* o = reinterpret_cast<__m256i*>(out + h * 128 + 4 * k + 8 * p);
          const __m256i sum = _mm256_madd_epi16(s[h][p], ones);
          _mm256_storeu_si256(o, t0 == 0 ? sum : _mm256_add_epi32(_mm256_loadu_si256(o), sum));
        }
      }
    }
  }
}

// The folded query of one head for one tile, as vnni::FoldQuery (simd_attend_int-inl.h):
// x = q * a_K rounded to int8 in one or two levels, and beta = sum_c q b_K plus the mean code
// 7.5 times what the rounding left. d = 128.
struct QueryLevels {
  float s_hi = 0, s_lo = 0, beta = 0;
  bool refined = false;
};
// REQUIRES: d == 128.
HWY_INLINE QueryLevels FoldQuery(const float* HWY_RESTRICT q, const float* HWY_RESTRICT a_k,
                                 const float* HWY_RESTRICT b_k, size_t d, float score_gain,
                                 float refine_above, int8_t* HWY_RESTRICT hi,
                                 int8_t* HWY_RESTRICT lo) {
  constexpr size_t kD = 128;  // a constant, so that the loops unroll
  (void)d;
  const DF df;
  const DI di;
  const hn::Rebind<int8_t, DF> d8;
  const size_t N = hn::Lanes(df);
  QueryLevels r;
  alignas(32) float x[kD];
  VF mx = hn::Zero(df), bsum = hn::Zero(df), xsum = hn::Zero(df);
  for (size_t i = 0; i < kD; i += N) {
    const VF qv = hn::LoadU(df, q + i);
    const VF xv = hn::Mul(qv, hn::LoadU(df, a_k + i));
    hn::Store(xv, df, x + i);
    bsum = hn::MulAdd(qv, hn::LoadU(df, b_k + i), bsum);
    xsum = hn::Add(xsum, xv);
    mx = hn::Max(mx, hn::Abs(xv));
  }
  const float m = ReduceMax(mx);
  r.beta = ReduceSum(bsum);
  if (!(m > 0.0f)) {
    std::memset(hi, 0, kD);
    std::memset(lo, 0, kD);
    return r;
  }
  r.s_hi = m / 127.0f;
  const VF inv = hn::Set(df, 127.0f / m);
  auto qsum = hn::Zero(di);
  for (size_t i = 0; i < kD; i += N) {
    const auto qv = hn::NearestInt(hn::Mul(hn::Load(df, x + i), inv));
    qsum = hn::Add(qsum, qv);
    hn::StoreU(hn::DemoteTo(d8, qv), d8, hi + i);
  }
  // What is left after rounding, summed: sum x - s_hi * sum hi (the integer sum is exact).
  const float left =
      ReduceSum(xsum) - r.s_hi * static_cast<float>(hn::GetLane(hn::SumOfLanes(di, qsum)));
  r.refined = r.s_hi * std::sqrt(static_cast<float>(kD) / 12.0f) * score_gain > refine_above;
  float rm = 0.0f;
  if (r.refined) {
    const VF sv = hn::Set(df, r.s_hi);
    VF rmx = hn::Zero(df);
    for (size_t i = 0; i < kD; i += N) {
      const VF h8 = hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, hi + i)));
      const VF rest = hn::NegMulAdd(h8, sv, hn::Load(df, x + i));
      hn::Store(rest, df, x + i);
      rmx = hn::Max(rmx, hn::Abs(rest));
    }
    rm = ReduceMax(rmx);
    r.refined = rm > 0.0f;
  }
  if (!r.refined) {
    std::memset(lo, 0, kD);
    r.beta += 7.5f * left;
    return r;
  }
  r.s_lo = rm / 127.0f;
  const VF inv2 = hn::Set(df, 127.0f / rm), sv2 = hn::Set(df, r.s_lo);
  VF sum = hn::Zero(df);
  for (size_t i = 0; i < kD; i += N) {
    const VF xv = hn::Load(df, x + i);
    const auto qv = hn::NearestInt(hn::Mul(xv, inv2));
    sum = hn::Add(sum, hn::NegMulAdd(hn::ConvertTo(df, qv), sv2, xv));
    hn::StoreU(hn::DemoteTo(d8, qv), d8, lo + i);
  }
  r.beta += 7.5f * ReduceSum(sum);
  return r;
}

// 2^y for y <= 0 (and -inf), as vnni::Exp2NonPositive: y = n + f with f in [-0.5, 0.5], 2^f
// the same degree-3 polynomial (relative error < 7.5e-5), 2^n put into the exponent field;
// below 2^-126 the result is 0 (a weight that small is 0 after its rounding to 1/255 steps).
HWY_INLINE __m256 Exp2NonPositive(__m256 y) {
  const __m256 floor = _mm256_set1_ps(-126.0f);
  const __m256 yc = _mm256_max_ps(y, floor);  // -inf and NaN-free from here
  const __m256 n = _mm256_round_ps(yc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(yc, n);
  __m256 p = _mm256_set1_ps(kExp2Poly[0]);
  for (int i = 1; i < 4; ++i) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2Poly[i]));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 r = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  return _mm256_and_ps(r, _mm256_cmp_ps(y, floor, _CMP_GT_OQ));
}

// Rounds 16 weights of one chunk, given in token-plane order (p0: tokens 2j, p1: tokens
// 2j + 1, as float), to u8 at `w` in natural token order; returns their integer sum's lanes.
HWY_INLINE __m256i RoundWeights16(__m256 p0, __m256 p1, __m256 inv, uint8_t* HWY_RESTRICT w) {
  const __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(p0, inv));
  const __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(p1, inv));
  // [t0 t1 t2 t3 | t8 t9 t10 t11] and [t4 t5 t6 t7 | t12 t13 t14 t15]
  const __m256i lo = _mm256_unpacklo_epi32(q0, q1), hi = _mm256_unpackhi_epi32(q0, q1);
  const __m256i n0 = _mm256_permute2x128_si256(lo, hi, 0x20);  // t0 .. t7
  const __m256i n1 = _mm256_permute2x128_si256(lo, hi, 0x31);  // t8 .. t15
  const __m256i w16 = _mm256_permute4x64_epi64(_mm256_packus_epi32(n0, n1), 0xD8);
  const __m128i w8 = _mm_packus_epi16(_mm256_castsi256_si128(w16), _mm256_extracti128_si256(w16, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(w), w8);
  return _mm256_add_epi32(q0, q1);
}

}  // namespace avx2int
}  // namespace HWY_NAMESPACE
}  // namespace kvarn
HWY_AFTER_NAMESPACE();
#endif  // KVARN_ATTEND_AVX2INT

#endif  // KVARN_KERNELS_SIMD_ATTEND_AVX2_INL_H_
