// Integer dot products of decode attention (KVARN_SPEC.md §7) for x86 CPUs with AVX-512 VNNI
// and VBMI: the 4-bit key codes against an int8 query, and the 2-bit value codes against u8
// softmax weights, 64 multiply-adds per instruction (vpdpbusd) where the fp32 fold does 16.
//
// Highway 1.0 has no VNNI target (AVX3_DL is not compiled here) and no op for it, so these
// kernels are intrinsics under a function target attribute, compiled into the AVX3 target
// only, and used only when the CPU reports both extensions (HasVnni()); every other target
// keeps the fp32 fold.
//
// Both kernels work in the plane order of simd_attend.cc for 16 float lanes: key scores come
// out in token-plane order (position 32*chunk + 16*plane + lane holds token
// 2*(16*chunk + lane) + plane), value sums in channel-plane order (position
// 64*chunk + 16*plane + lane holds channel 4*(16*chunk + lane) + plane), so the fp32
// bookkeeping around them is the exact path's.
//
// Include guard in Highway's per-target form: this header is re-included once per target.
#if defined(KVARN_KERNELS_SIMD_ATTEND_INT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVARN_KERNELS_SIMD_ATTEND_INT_INL_H_
#undef KVARN_KERNELS_SIMD_ATTEND_INT_INL_H_
#else
#define KVARN_KERNELS_SIMD_ATTEND_INT_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "hwy/highway.h"
#include "kernels/attend_exp2.h"

#undef KVARN_ATTEND_VNNI
#if HWY_ARCH_X86 && (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL) && \
    (defined(__GNUC__) || defined(__clang__))
#define KVARN_ATTEND_VNNI 1
#include <immintrin.h>
#else
#define KVARN_ATTEND_VNNI 0
#endif

#if KVARN_ATTEND_VNNI
#ifndef KVARN_VNNI_ATTR
// The current Highway target's features plus the two extensions (clang inlines Highway's
// functions only into a superset of their target), expanded where it is used.
#define KVARN_VNNI_ATTR __attribute__((target(HWY_TARGET_STR ",avx512vnni,avx512vbmi")))
#endif

HWY_BEFORE_NAMESPACE();
namespace kvarn {
namespace HWY_NAMESPACE {
namespace vnni {

// Both extensions, asked of the CPU once.
inline bool HasVnni() {
  static const bool has =
      __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi");
  return has;
}

// acc += the dot products of the u8 quads of u with the s8 quads of s (vpdpbusd, as
// _mm512_dpbusd_epi32(acc, u, s)), in place. An asm statement rather than the intrinsic
// because gcc 12 gave the loops below a register copy per accumulator and step (KeyDots<4>:
// 16 vpdpbusd and 16 vmovdqa per step; a copy ties up a vector pipe unless the core
// eliminates it), which the tied "+v" operand rules out (docs/benchmarks.md, 2026-12-03).
KVARN_VNNI_ATTR HWY_INLINE void AddDots(__m512i& acc, __m512i u, __m512i s) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
}

// Byte 4j+i of the result is byte j (+16 for the upper half) of row i, the rows being the
// four 32-byte quarters of a 128-byte (first operand, second operand) pair: a 4x4 byte
// transpose that puts one byte of each of four rows in every dword.
alignas(64) inline constexpr uint8_t kQuadIndex[2][64] = {
    {0,  32, 64, 96,  1,  33, 65, 97,  2,  34, 66, 98,  3,  35, 67, 99,
     4,  36, 68, 100, 5,  37, 69, 101, 6,  38, 70, 102, 7,  39, 71, 103,
     8,  40, 72, 104, 9,  41, 73, 105, 10, 42, 74, 106, 11, 43, 75, 107,
     12, 44, 76, 108, 13, 45, 77, 109, 14, 46, 78, 110, 15, 47, 79, 111},
    {16, 48, 80, 112, 17, 49, 81, 113, 18, 50, 82, 114, 19, 51, 83, 115,
     20, 52, 84, 116, 21, 53, 85, 117, 22, 54, 86, 118, 23, 55, 87, 119,
     24, 56, 88, 120, 25, 57, 89, 121, 26, 58, 90, 122, 27, 59, 91, 123,
     28, 60, 92, 124, 29, 61, 93, 125, 30, 62, 94, 126, 31, 63, 95, 127}};

// out[h][pos] = sum_c qi[h][c] * qK[c][t(pos)] in token-plane order, for H query heads.
// codes: the record's [d][g/2] key codes; qi: [H][d] int8, natural channel order (each dword
// holds channels 4k..4k+3, the layout the transpose gives the codes). g a multiple of 64.
// pf.Step() is called twice per step to fetch the next record on the way.
template <int H, class Prefetch>
KVARN_VNNI_ATTR void KeyDots(const uint8_t* HWY_RESTRICT codes, size_t g, size_t d,
                             const int8_t* HWY_RESTRICT qi, int32_t* HWY_RESTRICT out,
                             Prefetch& pf) {
  const size_t row_bytes = g / 2;
  const __m512i idx0 = _mm512_load_si512(kQuadIndex[0]);
  const __m512i idx1 = _mm512_load_si512(kQuadIndex[1]);
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (size_t half = 0; half < row_bytes; half += 32) {  // 64 tokens per pass
    __m512i acc[H][4];
    for (int h = 0; h < H; ++h) {
      for (int j = 0; j < 4; ++j) acc[h][j] = _mm512_setzero_si512();
    }
    for (size_t c = 0; c < d; c += 4) {
      pf.Step();
      pf.Step();
      const uint8_t* r = codes + c * row_bytes + half;
      const __m512i a = _mm512_inserti64x4(
          _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r))),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + row_bytes)), 1);
      const __m512i b = _mm512_inserti64x4(
          _mm512_castsi256_si512(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + 2 * row_bytes))),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + 3 * row_bytes)), 1);
      const __m512i x0 = _mm512_permutex2var_epi8(a, idx0, b);  // bytes 0..15 of the pass
      const __m512i x1 = _mm512_permutex2var_epi8(a, idx1, b);  // bytes 16..31
      // Even tokens' codes, and odd tokens' left in the high nibble (16 x the code, as u8):
      // their sums are 16 x the dot product, shifted back at the end.
      const __m512i k0 = _mm512_and_si512(x0, low);
      const __m512i k1 = _mm512_andnot_si512(low, x0);
      const __m512i k2 = _mm512_and_si512(x1, low);
      const __m512i k3 = _mm512_andnot_si512(low, x1);
      for (int h = 0; h < H; ++h) {
        int32_t qd;
        __builtin_memcpy(&qd, qi + h * d + c, 4);
        const __m512i qv = _mm512_set1_epi32(qd);
        AddDots(acc[h][0], k0, qv);
        AddDots(acc[h][1], k1, qv);
        AddDots(acc[h][2], k2, qv);
        AddDots(acc[h][3], k3, qv);
      }
    }
    // The pass's bytes j hold tokens 2j, 2j+1: chunk (half/16 + j/16), plane 0 or 1.
    for (int h = 0; h < H; ++h) {
      int32_t* o = out + h * g + 2 * half;
      _mm512_storeu_si512(o, acc[h][0]);
      _mm512_storeu_si512(o + 16, _mm512_srai_epi32(acc[h][1], 4));  // exact: multiples of 16
      _mm512_storeu_si512(o + 32, acc[h][2]);
      _mm512_storeu_si512(o + 48, _mm512_srai_epi32(acc[h][3], 4));
    }
  }
}

// out[h][pos] = sum_t w[h][t] * qV[t][c(pos)] in channel-plane order, for H query heads and
// d = 128 channels. codes: the record's [g][32] value codes (2 bits); w: [H][g] u8 weights in
// natural token order (each dword holds tokens 4k..4k+3, the layout the transpose gives the
// codes). g a multiple of 4.
template <int H, class Prefetch>
KVARN_VNNI_ATTR void ValueSums(const uint8_t* HWY_RESTRICT codes, size_t g,
                               const uint8_t* HWY_RESTRICT w, int32_t* HWY_RESTRICT out,
                               Prefetch& pf) {
  constexpr size_t kRowBytes = 32;
  const __m512i mask = _mm512_set1_epi8(0x03), mask1 = _mm512_set1_epi8(0x0C);
  const __m512i mask2 = _mm512_set1_epi8(0x30);
  for (int chunk = 0; chunk < 2; ++chunk) {  // channels 0..63, then 64..127
    const __m512i idx = _mm512_load_si512(kQuadIndex[chunk]);
    __m512i acc[H][4];
    for (int h = 0; h < H; ++h) {
      for (int j = 0; j < 4; ++j) acc[h][j] = _mm512_setzero_si512();
    }
    for (size_t t = 0; t < g; t += 4) {
      pf.Step();
      pf.Step();
      const uint8_t* r = codes + t * kRowBytes;
      const __m512i a = _mm512_loadu_si512(r);       // tokens t, t+1
      const __m512i b = _mm512_loadu_si512(r + 64);  // tokens t+2, t+3
      const __m512i x = _mm512_permutex2var_epi8(a, idx, b);
      // Planes 1 and 2 stay in place (4 and 16 x the code, both below 128 as s8), plane 3 is
      // moved down to bits 2-3 (4 x): the sums are shifted back at the end.
      const __m512i v0 = _mm512_and_si512(x, mask);
      const __m512i v1 = _mm512_and_si512(x, mask1);
      const __m512i v2 = _mm512_and_si512(x, mask2);
      const __m512i v3 = _mm512_and_si512(_mm512_srli_epi16(x, 4), mask1);
      for (int h = 0; h < H; ++h) {
        int32_t wd;
        __builtin_memcpy(&wd, w + h * g + t, 4);
        const __m512i wv = _mm512_set1_epi32(wd);
        AddDots(acc[h][0], wv, v0);
        AddDots(acc[h][1], wv, v1);
        AddDots(acc[h][2], wv, v2);
        AddDots(acc[h][3], wv, v3);
      }
    }
    for (int h = 0; h < H; ++h) {
      int32_t* o = out + h * 128 + 64 * chunk;
      _mm512_storeu_si512(o, acc[h][0]);
      _mm512_storeu_si512(o + 16, _mm512_srai_epi32(acc[h][1], 2));  // exact: multiples of 4
      _mm512_storeu_si512(o + 32, _mm512_srai_epi32(acc[h][2], 4));  // of 16
      _mm512_storeu_si512(o + 48, _mm512_srai_epi32(acc[h][3], 2));  // of 4
    }
  }
}

// The folded query of one head for one tile, x = q * a_K (natural channel order), rounded to
// int8 in one or two levels: hi with scale max|x| / 127 and, when the first level's error
// could move a score by more than `refine_above` (its L2 norm times `score_gain`; the norm
// taken as that of uniform rounding errors, s_hi * sqrt(d / 12), which needs no pass), the rest
// x - s_hi * hi rounded to int8 again with its own scale (about 1/254 of the first); else
// s_lo is 0 and lo all zeros. Also returns beta = sum_c q b_K plus the sum of what is left
// after rounding times the mean code 7.5 (the part of sum_c x code that the mean carries).
// REQUIRES: d == 128.
struct QueryLevels {
  float s_hi = 0, s_lo = 0, beta = 0;
  bool refined = false;
};
KVARN_VNNI_ATTR inline QueryLevels FoldQuery(const float* HWY_RESTRICT q,
                                             const float* HWY_RESTRICT a_k,
                                             const float* HWY_RESTRICT b_k, size_t d,
                                             float score_gain, float refine_above,
                                             int8_t* HWY_RESTRICT hi, int8_t* HWY_RESTRICT lo) {
  constexpr size_t vecs = 8;  // d = 128, a constant so that x stays in registers
  (void)d;
  QueryLevels r;
  __m512 x[vecs];
  __m512 mx = _mm512_setzero_ps(), bsum = _mm512_setzero_ps(), xsum = _mm512_setzero_ps();
  for (size_t i = 0; i < vecs; ++i) {
    const __m512 qv = _mm512_loadu_ps(q + 16 * i);
    x[i] = _mm512_mul_ps(qv, _mm512_loadu_ps(a_k + 16 * i));
    bsum = _mm512_fmadd_ps(qv, _mm512_loadu_ps(b_k + 16 * i), bsum);
    xsum = _mm512_add_ps(xsum, x[i]);
    mx = _mm512_max_ps(mx, _mm512_abs_ps(x[i]));
  }
  const float m = _mm512_reduce_max_ps(mx);
  r.beta = _mm512_reduce_add_ps(bsum);
  if (!(m > 0.0f)) {
    for (size_t i = 0; i < 16 * vecs; ++i) hi[i] = lo[i] = 0;
    return r;
  }
  r.s_hi = m / 127.0f;
  const __m512 inv = _mm512_set1_ps(127.0f / m);
  __m512i qsum = _mm512_setzero_si512();
  for (size_t i = 0; i < vecs; ++i) {
    const __m512i qv = _mm512_cvtps_epi32(_mm512_mul_ps(x[i], inv));  // nearest even
    qsum = _mm512_add_epi32(qsum, qv);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(hi + 16 * i), _mm512_cvtsepi32_epi8(qv));
  }
  // What is left after rounding, summed: sum x - s_hi * sum hi (the integer sum is exact).
  const float left =
      _mm512_reduce_add_ps(xsum) - r.s_hi * static_cast<float>(_mm512_reduce_add_epi32(qsum));
  r.refined = r.s_hi * std::sqrt(16.0f * vecs / 12.0f) * score_gain > refine_above;
  float rm = 0.0f;
  if (r.refined) {
    const __m512 sv = _mm512_set1_ps(r.s_hi);
    __m512 rmx = _mm512_setzero_ps();
    for (size_t i = 0; i < vecs; ++i) {
      const __m128i h8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi + 16 * i));
      x[i] =
          _mm512_fnmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(h8)), sv, x[i]);  // what is left
      rmx = _mm512_max_ps(rmx, _mm512_abs_ps(x[i]));
    }
    rm = _mm512_reduce_max_ps(rmx);
    r.refined = rm > 0.0f;
  }
  if (!r.refined) {
    for (size_t i = 0; i < vecs; ++i)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(lo + 16 * i), _mm_setzero_si128());
    r.beta += 7.5f * left;
    return r;
  }
  r.s_lo = rm / 127.0f;
  const __m512 inv2 = _mm512_set1_ps(127.0f / rm), sv2 = _mm512_set1_ps(r.s_lo);
  __m512 sum = _mm512_setzero_ps();
  for (size_t i = 0; i < vecs; ++i) {
    const __m512i qv = _mm512_cvtps_epi32(_mm512_mul_ps(x[i], inv2));
    sum = _mm512_add_ps(sum, _mm512_fnmadd_ps(_mm512_cvtepi32_ps(qv), sv2, x[i]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(lo + 16 * i), _mm512_cvtsepi32_epi8(qv));
  }
  r.beta += 7.5f * _mm512_reduce_add_ps(sum);
  return r;
}

// 2^y for y <= 0 (and -inf): y split into an integer n and a fraction f in [-0.5, 0.5], 2^f a
// degree-3 polynomial (kernels/attend_exp2.h; relative error < 7.5e-5 in float: the weights
// are rounded to 1/255 steps after it, and the normalizer's error stays 50x below that);
// vscalefps applies 2^n and underflows gracefully to 0. The scores arrive already in
// log2 units, so no multiply by log2(e).
KVARN_VNNI_ATTR inline __m512 Exp2NonPositive(__m512 y) {
  const __m512 n = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(y, n);
  __m512 p = _mm512_set1_ps(kExp2Poly[0]);
  for (int i = 1; i < 4; ++i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Poly[i]));
  return _mm512_scalef_ps(p, n);
}

// Horizontal reductions of four vectors at once: lane h of the result is the reduction of
// the h-th argument (14 operations where four separate reductions take 32, and one chain of
// latency instead of four).
template <class Op>
KVARN_VNNI_ATTR inline __m128 Reduce4(__m512 a, __m512 b, __m512 c, __m512 d, Op op) {
  // 128-bit blocks: [a0+a2, a1+a3, b0+b2, b1+b3] and the same of c, d.
  const __m512 ab = op(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                       _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 cd = op(_mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(1, 0, 1, 0)),
                       _mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(3, 2, 3, 2)));
  // Block h now holds four partial values of argument h.
  __m512 v = op(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
  v = op(v, _mm512_permute_ps(v, _MM_SHUFFLE(1, 0, 3, 2)));
  v = op(v, _mm512_permute_ps(v, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(
      _mm512_set_epi32(12, 8, 4, 0, 12, 8, 4, 0, 12, 8, 4, 0, 12, 8, 4, 0), v));
}
struct AddPs {
  KVARN_VNNI_ATTR __m512 operator()(__m512 x, __m512 y) const { return _mm512_add_ps(x, y); }
};
struct AddEpi32 {  // on integer lanes carried in float vectors
  KVARN_VNNI_ATTR __m512 operator()(__m512 x, __m512 y) const {
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(x), _mm512_castps_si512(y)));
  }
};
struct MaxPs {
  KVARN_VNNI_ATTR __m512 operator()(__m512 x, __m512 y) const { return _mm512_max_ps(x, y); }
};
// Reduce4 of H <= 4 vectors, lane h for v[h] (the lanes past H repeat v[0]).
template <int H, class Op>
KVARN_VNNI_ATTR inline __m128 ReduceHeads(const __m512* v, Op op) {
  return Reduce4(v[0], v[H > 1 ? 1 : 0], v[H > 2 ? 2 : 0], v[H > 3 ? 3 : 0], op);
}

// H query heads' share of a tile after their key dots, H at most 4 (arrays indexed by head;
// si, si_lo and w point at head 0's rows, g apart): scores
// x = (qscale * si + qscale_lo * si_lo + beta) * r_k (si_lo only where refined; the softmax
// scale folded into qscale, qscale_lo and beta by the caller; r_k in token-plane order), the
// online softmax update of (max, sum), and the weights p * a_V rounded to u8 in natural token
// order (wscale their scale). Returns in rescale the factor for the accumulator and in pb
// sum_t p b_V plus what the weights' rounding drops on average (mean value code 1.5).
// The scores are taken in log2 units (log2(e) folded into the three scalars), so the
// exponentials are plain powers of two; max stays in nats, as the fp16 paths keep it. What
// the rounding drops is sum(p a_V) - scale * sum(rounded): two running sums, one of them
// integer, in place of a per-weight remainder. The scale vectors are loaded once for the H
// heads, and their horizontal reductions go together (Reduce4 reduces each argument by the
// same tree, so a head's results do not depend on its group).
struct SoftmaxHeads {
  float qscale[4], qscale_lo[4], beta[4];
  bool refined[4];
};
template <int H, size_t kVecs>  // kVecs = g / 16, at most 8
KVARN_VNNI_ATTR inline void SoftmaxWeights(
    const int32_t* HWY_RESTRICT si, const int32_t* HWY_RESTRICT si_lo, const SoftmaxHeads& in,
    const float* HWY_RESTRICT r_k, const float* HWY_RESTRICT a_v, const float* HWY_RESTRICT b_v,
    float* max, float* sum, float* rescale, uint8_t* HWY_RESTRICT w, float* wscale, float* pb) {
  constexpr float kLog2e = 1.44269504088896341f, kLn2 = 0.693147180559945309f;
  constexpr size_t g = 16 * kVecs;
  alignas(64) float x[H][g];
  __m512 qs[H], qs_lo[H], bv[H], mx[H];
  for (int h = 0; h < H; ++h) {
    qs[h] = _mm512_set1_ps(in.qscale[h] * kLog2e);
    qs_lo[h] = _mm512_set1_ps(in.qscale_lo[h] * kLog2e);
    bv[h] = _mm512_set1_ps(in.beta[h] * kLog2e);
    mx[h] = _mm512_set1_ps(-HUGE_VALF);
  }
  for (size_t i = 0; i < kVecs; ++i) {
    const __m512 rk = _mm512_loadu_ps(r_k + 16 * i);
    for (int h = 0; h < H; ++h) {
      const __m512 dot = _mm512_cvtepi32_ps(_mm512_loadu_si512(si + h * g + 16 * i));
      __m512 y = _mm512_fmadd_ps(dot, qs[h], bv[h]);
      if (in.refined[h]) {
        y = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(si_lo + h * g + 16 * i)),
                            qs_lo[h], y);
      }
      const __m512 xv = _mm512_mul_ps(y, rk);
      _mm512_store_ps(x[h] + 16 * i, xv);
      mx[h] = _mm512_max_ps(mx[h], xv);
    }
  }
  alignas(16) float tile_max[4];
  _mm_store_ps(tile_max, ReduceHeads<H>(mx, MaxPs()));
  __m512 mv[H], psum[H], bsum[H], pmax[H], xsum[H];
  for (int h = 0; h < H; ++h) {
    // In log2 units: the old maximum converted, the new one the larger.
    const float old2 = max[h] * kLog2e;
    const float m_new = std::max(old2, tile_max[h]);
    // Past the first tiles the running maximum rarely moves: no exponential then.
    rescale[h] = m_new == old2 ? 1.0f : std::exp2(old2 - m_new);
    max[h] = m_new * kLn2;
    mv[h] = _mm512_set1_ps(m_new);
    psum[h] = bsum[h] = pmax[h] = xsum[h] = _mm512_setzero_ps();
  }
  for (size_t i = 0; i < kVecs; ++i) {
    const __m512 av = _mm512_loadu_ps(a_v + 16 * i), bvv = _mm512_loadu_ps(b_v + 16 * i);
    for (int h = 0; h < H; ++h) {
      const __m512 pr = Exp2NonPositive(_mm512_sub_ps(_mm512_load_ps(x[h] + 16 * i), mv[h]));
      psum[h] = _mm512_add_ps(psum[h], pr);
      bsum[h] = _mm512_fmadd_ps(pr, bvv, bsum[h]);
      const __m512 xv = _mm512_mul_ps(pr, av);
      _mm512_store_ps(x[h] + 16 * i, xv);
      xsum[h] = _mm512_add_ps(xsum[h], xv);
      pmax[h] = _mm512_max_ps(pmax[h], xv);
    }
  }
  alignas(16) float ps[4], bs[4], xs[4], wmax[4];
  _mm_store_ps(ps, ReduceHeads<H>(psum, AddPs()));
  _mm_store_ps(bs, ReduceHeads<H>(bsum, AddPs()));
  _mm_store_ps(xs, ReduceHeads<H>(xsum, AddPs()));
  _mm_store_ps(wmax, ReduceHeads<H>(pmax, MaxPs()));
  // Natural tokens 32k + 2l + plane: interleave the two planes of each chunk.
  const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i hi = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
  __m512 inv[H];
  __m512 qsum[H];  // integer lanes
  for (int h = 0; h < H; ++h) {
    sum[h] = sum[h] * rescale[h] + ps[h];
    wscale[h] = wmax[h] > 0.0f ? wmax[h] / 255.0f : 0.0f;
    inv[h] = _mm512_set1_ps(wmax[h] > 0.0f ? 255.0f / wmax[h] : 0.0f);
    qsum[h] = _mm512_setzero_ps();
  }
  for (size_t i = 0; i < kVecs; i += 2) {
    for (int h = 0; h < H; ++h) {
      const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(x[h] + 16 * i), inv[h]));
      const __m512i q1 =
          _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(x[h] + 16 * i + 16), inv[h]));
      qsum[h] = AddEpi32()(qsum[h], _mm512_castsi512_ps(_mm512_add_epi32(q0, q1)));
      uint8_t* wh = w + h * g + 16 * i;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(wh),
                       _mm512_cvtusepi32_epi8(_mm512_permutex2var_epi32(q0, lo, q1)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(wh + 16),
                       _mm512_cvtusepi32_epi8(_mm512_permutex2var_epi32(q0, hi, q1)));
    }
  }
  alignas(16) float qs_sum[4];
  _mm_store_ps(qs_sum, _mm_cvtepi32_ps(_mm_castps_si128(ReduceHeads<H>(qsum, AddEpi32()))));
  for (int h = 0; h < H; ++h) {
    // The rounded weights are at most 255 each, so their sum is exact in float.
    const float residual = wmax[h] > 0.0f ? xs[h] - wscale[h] * qs_sum[h] : 0.0f;
    pb[h] = bs[h] + 1.5f * residual;
  }
}

}  // namespace vnni
}  // namespace HWY_NAMESPACE
}  // namespace kvarn
HWY_AFTER_NAMESPACE();
#endif  // KVARN_ATTEND_VNNI

#endif  // KVARN_KERNELS_SIMD_ATTEND_INT_INL_H_
