// SIMD decode attention over a sequence of fp16 sink, quantized tiles and fp16 tail
// (KVARN_SPEC.md §7), with grouped-query attention: every tile is streamed once for all
// query heads of its kv-head, and no tile is ever dequantized into memory.
//
// Codes are widened straight from their packed bytes. A vector of N bytes yields p = 8/bits
// vectors of codes, one per bit plane, so tokens (for keys) and channels (for values) are
// visited in "plane order": position (chunk*p + plane)*N + lane holds element
// p*(chunk*N + lane) + plane. Scores, scales and value accumulators are kept in plane order
// throughout, and only the final output is put back into natural channel order.
//
// The fp16 parts and the quantized tiles are reduced separately (two online-softmax states)
// and merged once at the end with a log-sum-exp combine.
//
// Two paths over quantized tiles: the exact one (the fp32 fold, equal to attention over
// DecodeTile's output to fp32 rounding) and, for rotating 4-bit-key 2-bit-value presets at
// D = 128 on CPUs with AVX-512 VNNI and VBMI (simd_attend_int-inl.h) or with AVX2 and neither
// (simd_attend_avx2-inl.h, vpmaddubsw in place of vpdpbusd), the fast one: per tile
// and query head the folded query q * a_K is rounded to int8 (in two levels where one could
// move a score by more than kRefineLogit) and the softmax weights p * a_V to u8, each with
// one scale, and the dot products over the codes are integer. What the rounding drops on
// average (its sum times the mean code, 7.5 or 1.5) is added back with the offsets. Its
// extra error against exact attention is far below the codec's own
// (tests/kernels/attend_accuracy_test.cc).

// The codec's results must not depend on the compiler fusing a * b + c into one rounding:
// every fused multiply-add is written out (MulAdd), and nothing else may be contracted.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd_attend.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format off
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"
#include "kernels/simd-inl.h"
#include "kernels/simd_attend_int-inl.h"
#include "kernels/simd_attend_avx2-inl.h"
#include "kernels/simd_attend_fp16-inl.h"
// clang-format on

#include <algorithm>
#include <cmath>

#include "hwy/cache_control.h"
#include "kernels/codec_internal.h"
#include "kernels/fp16.h"
#include "kernels/simd_scratch.h"

HWY_BEFORE_NAMESPACE();
namespace kvarn {
namespace HWY_NAMESPACE {
namespace {

// Plane order of n elements packed `bits` wide, for this target's vector length.
void PlanePermutation(size_t n, int bits, int32_t* perm) {
  const size_t N = hn::Lanes(DF()), p = static_cast<size_t>(8 / bits);
  // pos = (chunk * p + plane) * N + lane, without divisions (this runs once per call).
  size_t pos = 0;
  for (size_t chunk = 0; pos < n; ++chunk) {
    for (size_t plane = 0; plane < p && pos < n; ++plane) {
      for (size_t lane = 0; lane < N && pos < n; ++lane, ++pos) {
        perm[pos] = static_cast<int32_t>(p * (chunk * N + lane) + plane);
      }
    }
  }
}

// Widens the codes of one step: 4 vectors = 4N consecutive plane positions, from 2N bytes
// (4-bit) or N bytes (2-bit).
template <int kBits>
HWY_INLINE void UnpackStep(const uint8_t* HWY_RESTRICT bytes, VF& c0, VF& c1, VF& c2, VF& c3) {
  const DF df;
  const DI di;
  const DU8F d8;
  if constexpr (kBits == 4) {
    const auto x0 = hn::PromoteTo(di, hn::LoadU(d8, bytes));
    const auto x1 = hn::PromoteTo(di, hn::LoadU(d8, bytes + hn::Lanes(df)));
    const auto low = hn::Set(di, 15);
    c0 = hn::ConvertTo(df, hn::And(x0, low));
    c1 = hn::ConvertTo(df, hn::ShiftRight<4>(x0));
    c2 = hn::ConvertTo(df, hn::And(x1, low));
    c3 = hn::ConvertTo(df, hn::ShiftRight<4>(x1));
  } else {
    const auto x = hn::PromoteTo(di, hn::LoadU(d8, bytes));
    const auto low = hn::Set(di, 3);
    c0 = hn::ConvertTo(df, hn::And(x, low));
    c1 = hn::ConvertTo(df, hn::And(hn::ShiftRight<2>(x), low));
    c2 = hn::ConvertTo(df, hn::And(hn::ShiftRight<4>(x), low));
    c3 = hn::ConvertTo(df, hn::ShiftRight<6>(x));
  }
}

template <int kBits>
constexpr size_t StepBytes(size_t lanes) {
  return kBits == 4 ? 2 * lanes : lanes;
}

// Fetches the next tile's record a cache line per step of the current tile's loops. Records
// are wherever the pool put them, so the hardware prefetcher cannot find the next one, and a
// burst of prefetches at once would overflow the core's outstanding misses. Into L2 (T1), not
// L1: with cold caches that measured ~20% faster steps (tests/bench/attend_bench.cc), the L1
// fill buffers being left to the current tile's demand loads.
class Prefetcher {
 public:
  Prefetcher(const uint8_t* next, size_t bytes)
      : next_(next), end_(next == nullptr ? next : next + bytes) {}
  HWY_INLINE void Step() {
    if (next_ < end_) {
      __builtin_prefetch(next_, /*rw=*/0, /*locality=*/2);  // prefetcht1
      next_ += 64;
    }
  }

 private:
  const uint8_t* next_;
  const uint8_t* end_;
};

// scores[h][pos] = sum_c w[h][c] * qK[c][t(pos)] for H heads.
template <int kBits, int H>
void KeyDots(const uint8_t* HWY_RESTRICT codes, size_t g, size_t d, const float* HWY_RESTRICT w,
             float* HWY_RESTRICT scores, Prefetcher& prefetch) {
  const DF df;
  const size_t N = hn::Lanes(df), row_bytes = g * kBits / 8;
  for (size_t off = 0, pos = 0; off < row_bytes; off += StepBytes<kBits>(N), pos += 4 * N) {
    VF acc[H][4];
    for (int h = 0; h < H; ++h) acc[h][0] = acc[h][1] = acc[h][2] = acc[h][3] = hn::Zero(df);
    for (size_t c = 0; c < d; ++c) {
      prefetch.Step();
      VF c0, c1, c2, c3;
      UnpackStep<kBits>(codes + c * row_bytes + off, c0, c1, c2, c3);
      for (int h = 0; h < H; ++h) {
        const VF wv = hn::Set(df, w[h * d + c]);
        acc[h][0] = hn::MulAdd(wv, c0, acc[h][0]);
        acc[h][1] = hn::MulAdd(wv, c1, acc[h][1]);
        acc[h][2] = hn::MulAdd(wv, c2, acc[h][2]);
        acc[h][3] = hn::MulAdd(wv, c3, acc[h][3]);
      }
    }
    for (int h = 0; h < H; ++h) {
      for (int j = 0; j < 4; ++j) hn::StoreU(acc[h][j], df, scores + h * g + pos + j * N);
    }
  }
}

// tile_acc[h][cpos] = sum_pos pa[h][pos] * qV[t(pos)][c(cpos)] for H heads.
template <int kBits, int H>
void ValueSums(const uint8_t* HWY_RESTRICT codes, size_t g, size_t d,
               const int32_t* HWY_RESTRICT tok_perm, const float* HWY_RESTRICT pa,
               float* HWY_RESTRICT tile_acc, Prefetcher& prefetch) {
  const DF df;
  const size_t N = hn::Lanes(df), row_bytes = d * kBits / 8;
  for (size_t off = 0, cpos = 0; off < row_bytes; off += StepBytes<kBits>(N), cpos += 4 * N) {
    VF acc[H][4];
    for (int h = 0; h < H; ++h) acc[h][0] = acc[h][1] = acc[h][2] = acc[h][3] = hn::Zero(df);
    for (size_t pos = 0; pos < g; ++pos) {
      prefetch.Step();
      VF c0, c1, c2, c3;
      UnpackStep<kBits>(codes + static_cast<size_t>(tok_perm[pos]) * row_bytes + off, c0, c1, c2, c3);
      for (int h = 0; h < H; ++h) {
        const VF pv = hn::Set(df, pa[h * g + pos]);
        acc[h][0] = hn::MulAdd(pv, c0, acc[h][0]);
        acc[h][1] = hn::MulAdd(pv, c1, acc[h][1]);
        acc[h][2] = hn::MulAdd(pv, c2, acc[h][2]);
        acc[h][3] = hn::MulAdd(pv, c3, acc[h][3]);
      }
    }
    for (int h = 0; h < H; ++h) {
      for (int j = 0; j < 4; ++j) hn::StoreU(acc[h][j], df, tile_acc + h * d + cpos + j * N);
    }
  }
}

template <int kBits, int vBits>
void TileDots(int heads, const uint8_t* k_codes, const uint8_t* v_codes, size_t g, size_t d,
              const float* w, float* scores, const int32_t* tok_perm, bool values, float* tile_acc,
              Prefetcher& prefetch) {
  for (int h0 = 0; h0 < heads; h0 += kMaxHeadBlock) {
    const int hb = std::min(kMaxHeadBlock, heads - h0);
    const float* wh = w + h0 * d;
    float* sh = scores + h0 * g;
    float* th = tile_acc + h0 * d;
#define KVARN_BLOCK(H)                                  \
  if (!values)                                          \
    KeyDots<kBits, H>(k_codes, g, d, wh, sh, prefetch); \
  else                                                  \
    ValueSums<vBits, H>(v_codes, g, d, tok_perm, sh, th, prefetch);
    switch (hb) {
      case 1: KVARN_BLOCK(1) break;
      case 2: KVARN_BLOCK(2) break;
      case 3: KVARN_BLOCK(3) break;
      default: KVARN_BLOCK(4) break;
    }
#undef KVARN_BLOCK
  }
}

using TileDotsFn = void (*)(int, const uint8_t*, const uint8_t*, size_t, size_t, const float*,
                            float*, const int32_t*, bool, float*, Prefetcher&);

TileDotsFn SelectTileDots(int kbits, int vbits) {
  if (kbits == 4) return vbits == 4 ? &TileDots<4, 4> : &TileDots<4, 2>;
  return vbits == 4 ? &TileDots<2, 4> : &TileDots<2, 2>;
}

void WidenHalves(const uint8_t* src, size_t n, float* dst) {
  for (size_t i = 0; i < n; i += hn::Lanes(DF())) {
    hn::StoreU(LoadHalf(reinterpret_cast<const uint16_t*>(src) + i), DF(), dst + i);
  }
}
// Widens n halves into plane order for codes packed `bits` wide: in each chunk of p*N
// elements, plane k (positions k*N .. k*N + N) holds the elements i with i % p == k, in order.
void WidenPlaneOrder(const uint8_t* src, size_t n, int bits, float* HWY_RESTRICT dst) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const auto* h = reinterpret_cast<const uint16_t*>(src);
#if HWY_TARGET == HWY_SCALAR
  (void)bits;
  for (size_t i = 0; i < n; i += N) hn::StoreU(LoadHalf(h + i), df, dst + i);  // one lane: natural
#else
  if (bits == 4) {
    for (size_t i = 0; i < n; i += 2 * N) {
      const VF v0 = LoadHalf(h + i), v1 = LoadHalf(h + i + N);
      hn::StoreU(hn::ConcatEven(df, v1, v0), df, dst + i);
      hn::StoreU(hn::ConcatOdd(df, v1, v0), df, dst + i + N);
    }
  } else {
    for (size_t i = 0; i < n; i += 4 * N) {
      const VF v0 = LoadHalf(h + i), v1 = LoadHalf(h + i + N);
      const VF v2 = LoadHalf(h + i + 2 * N), v3 = LoadHalf(h + i + 3 * N);
      const VF even = hn::ConcatEven(df, v1, v0), even2 = hn::ConcatEven(df, v3, v2);
      const VF odd = hn::ConcatOdd(df, v1, v0), odd2 = hn::ConcatOdd(df, v3, v2);
      hn::StoreU(hn::ConcatEven(df, even2, even), df, dst + i);         // i % 4 == 0
      hn::StoreU(hn::ConcatEven(df, odd2, odd), df, dst + i + N);       // 1
      hn::StoreU(hn::ConcatOdd(df, even2, even), df, dst + i + 2 * N);  // 2
      hn::StoreU(hn::ConcatOdd(df, odd2, odd), df, dst + i + 3 * N);    // 3
    }
  }
#endif
}

// The record's six fp16 scale vectors widened into the scratch, those indexed by token or
// channel in the order of the code planes the dot products use.
void WidenScales(const Preset& p, size_t d, const uint8_t* record, const RecordLayout& l,
                 AttendScratch& s) {
  const size_t g = static_cast<size_t>(p.tile_tokens);
  WidenHalves(record + l.k_a, d, s.a_k.get());
  WidenHalves(record + l.k_b, d, s.b_k.get());
  WidenPlaneOrder(record + l.k_r, g, p.key_bits, s.r_k.get());
  WidenPlaneOrder(record + l.v_a, g, p.key_bits, s.a_v.get());
  WidenPlaneOrder(record + l.v_b, g, p.key_bits, s.b_v.get());
  WidenPlaneOrder(record + l.v_c, d, p.value_bits, s.c_v.get());
}

// Folds one quantized tile into the tiles' softmax state and accumulator, fetching the next
// record (or none: nullptr) on the way.
void AttendTile(const Preset& p, size_t d, int heads, const uint8_t* record, const uint8_t* next,
                const RecordLayout& l, float scale, TileDotsFn dots, AttendScratch& s,
                SoftmaxState& st) {
  const DF df;
  const size_t N = hn::Lanes(df), g = static_cast<size_t>(p.tile_tokens);
  // Local copies: vector stores may alias anything as far as the compiler knows.
  float* HWY_RESTRICT a_k = s.a_k.get();
  float* HWY_RESTRICT b_k = s.b_k.get();
  float* HWY_RESTRICT r_k = s.r_k.get();
  float* HWY_RESTRICT a_v = s.a_v.get();
  float* HWY_RESTRICT b_v = s.b_v.get();
  float* HWY_RESTRICT c_v = s.c_v.get();
  const float* HWY_RESTRICT queries = s.q.get();
  float* HWY_RESTRICT w = s.w.get();
  float* HWY_RESTRICT scores = s.scores.get();
  float* HWY_RESTRICT tile_acc = s.tile_acc.get();
  float* HWY_RESTRICT acc_q = s.acc_q.get();
  Prefetcher prefetch(next, l.total);
  WidenScales(p, d, record, l, s);

  float beta[64];
  for (int h = 0; h < heads; ++h) {
    const float* HWY_RESTRICT q = queries + h * d;
    VF bsum = hn::Zero(df);
    for (size_t c = 0; c < d; c += N) {
      const VF qv = hn::LoadU(df, q + c);
      hn::StoreU(hn::Mul(qv, hn::LoadU(df, a_k + c)), df, w + h * d + c);
      bsum = hn::MulAdd(qv, hn::LoadU(df, b_k + c), bsum);
    }
    beta[h] = ReduceSum(bsum);
  }
  dots(heads, record + l.k_codes, record + l.v_codes, g, d, w, scores, s.tok_perm.get(), false,
       tile_acc, prefetch);

  float rescale[64], pb[64];
  for (int h = 0; h < heads; ++h) {
    float* HWY_RESTRICT sc = scores + h * g;
    const VF bv = hn::Set(df, beta[h]), scv = hn::Set(df, scale);
    VF mx = hn::Set(df, -HUGE_VALF);
    for (size_t i = 0; i < g; i += N) {
      const VF x =
          hn::Mul(hn::Mul(hn::Add(hn::LoadU(df, sc + i), bv), hn::LoadU(df, r_k + i)), scv);
      hn::StoreU(x, df, sc + i);
      mx = hn::Max(mx, x);
    }
    const float m_new = std::max(st.max[h], ReduceMax(mx));
    rescale[h] = std::exp(st.max[h] - m_new);
    st.max[h] = m_new;
    const VF mv = hn::Set(df, m_new);
    VF psum = hn::Zero(df), bsum = hn::Zero(df);
    for (size_t i = 0; i < g; i += N) {
      const VF pr = hn::Exp(df, hn::Sub(hn::LoadU(df, sc + i), mv));
      psum = hn::Add(psum, pr);
      bsum = hn::MulAdd(pr, hn::LoadU(df, b_v + i), bsum);
      hn::StoreU(hn::Mul(pr, hn::LoadU(df, a_v + i)), df, sc + i);  // p * a_V
    }
    st.sum[h] = st.sum[h] * rescale[h] + ReduceSum(psum);
    pb[h] = ReduceSum(bsum);
  }
  dots(heads, record + l.k_codes, record + l.v_codes, g, d, w, scores, s.tok_perm.get(), true,
       tile_acc, prefetch);
  for (int h = 0; h < heads; ++h) {
    float* HWY_RESTRICT acc = acc_q + h * d;
    const float* HWY_RESTRICT ta = tile_acc + h * d;
    const VF rs = hn::Set(df, rescale[h]), pbv = hn::Set(df, pb[h]);
    for (size_t c = 0; c < d; c += N) {
      const VF add = hn::Mul(hn::Add(hn::LoadU(df, ta + c), pbv), hn::LoadU(df, c_v + c));
      hn::StoreU(hn::MulAdd(hn::LoadU(df, acc + c), rs, add), df, acc + c);
    }
  }
}

#if KVARN_ATTEND_VNNI || KVARN_ATTEND_AVX2INT
// Working memory of the fast path: D = 128, G <= 128, up to 64 query heads.
struct IntScratch {
  alignas(64) int8_t qi[64 * 128];     // [H][D] int8 folded queries, natural channel order
  alignas(64) int8_t qi_lo[64 * 128];  // [H][D] their second level, or zeros
  alignas(64) int32_t si[64 * 128];    // [H][G] integer scores, token-plane order
  alignas(64) int32_t si_lo[64 * 128];  // [H][G] the second level's
  alignas(64) uint8_t wu[64 * 128];     // [H][G] u8 weights, natural token order
  alignas(64) int32_t vi[64 * 128];     // [H][D] integer value sums, channel-plane order
  float qscale[64], qscale_lo[64], wscale[64];
  bool refined[64];
};

// The score error (nats) above which a head's folded query takes a second int8 level.
// 0.05 keeps the measured rise of the error at most 0.3% on the accuracy test's data, and
// refines none of the benchmark's Gaussian heads (tests/bench/attend_bench.cc).
constexpr float kRefineLogit = 0.05f;

// Rotating presets only: without the rotation (kivi) outlier channels dominate the folded
// query's int8 scale, and on `kvarnctl codec synth` data the error rose 1.6% (measured).
bool FastPathApplies(const Preset& p, size_t d) {
#if KVARN_ATTEND_VNNI
  if (!vnni::HasVnni()) return false;
#endif
  return p.rotates() && p.key_bits == 4 && p.value_bits == 2 && d == 128 &&
         p.tile_tokens % 64 == 0 && p.tile_tokens <= 128;
}

#if KVARN_ATTEND_VNNI
namespace intk = vnni;  // this target's integer kernels
#else
namespace intk = avx2int;
#endif

// The first half of a fast tile: the record's scales widened, every head's folded query (one
// or two int8 levels) and the integer key dots of each level into is.si / is.si_lo; beta[h]
// the head's offset term.
void BeginFastTile(const Preset& p, size_t d, int heads, const uint8_t* record,
                   const RecordLayout& l, float scale, AttendScratch& s, IntScratch& is,
                   float* beta, Prefetcher& pf) {
  const DF df;
  const size_t N = hn::Lanes(df), g = static_cast<size_t>(p.tile_tokens);
  const uint8_t* k_codes = record + l.k_codes;
  WidenScales(p, d, record, l, s);
  const float* HWY_RESTRICT r_k = s.r_k.get();
  // The rounding of the folded query to int8 moves a score by about
  // scale * r_K * |q a_K - rounded| * (spread of the codes, at most 4.6 for uniform 4-bit
  // codes): where that could exceed kRefineLogit nats for some token, the head takes a
  // second int8 level (twice the key dots, errors 1/254 as large). The decision is the
  // head's own, so a head's output does not depend on the group it is computed in.
  VF rmax = hn::Zero(df);
  for (size_t i = 0; i < g; i += N) rmax = hn::Max(rmax, hn::Abs(hn::LoadU(df, r_k + i)));
  const float score_gain = scale * ReduceMax(rmax) * 4.6f;
  for (int h = 0; h < heads; ++h) {
    const intk::QueryLevels lv =
        intk::FoldQuery(s.q.get() + h * d, s.a_k.get(), s.b_k.get(), d, score_gain,
                        kRefineLogit, is.qi + h * d, is.qi_lo + h * d);
    is.refined[h] = lv.refined;
    is.qscale[h] = lv.s_hi;
    is.qscale_lo[h] = lv.s_lo;
    beta[h] = lv.beta;
  }
  for (int h0 = 0; h0 < heads; h0 += kMaxHeadBlock) {
    const int hb = std::min(kMaxHeadBlock, heads - h0);
    bool refine = false;
    for (int h = h0; h < h0 + hb; ++h) refine |= is.refined[h];
    for (int level = 0; level < (refine ? 2 : 1); ++level) {
      const int8_t* qi = (level == 0 ? is.qi : is.qi_lo) + h0 * d;
      int32_t* si = (level == 0 ? is.si : is.si_lo) + h0 * g;
      switch (hb) {
        case 1: intk::KeyDots<1>(k_codes, g, d, qi, si, pf); break;
        case 2: intk::KeyDots<2>(k_codes, g, d, qi, si, pf); break;
        case 3: intk::KeyDots<3>(k_codes, g, d, qi, si, pf); break;
        default: intk::KeyDots<4>(k_codes, g, d, qi, si, pf); break;
      }
    }
  }
}

// The last step of a fast tile: acc = acc * rescale + (value sums * wscale + pb) * c_V.
void AddValueSums(size_t d, int heads, const IntScratch& is, const float* rescale,
                  const float* pb, const float* HWY_RESTRICT c_v, float* HWY_RESTRICT acc_q) {
  const DF df;
  const size_t N = hn::Lanes(df);
  for (int h = 0; h < heads; ++h) {
    float* HWY_RESTRICT acc = acc_q + h * d;
    const int32_t* HWY_RESTRICT vi = is.vi + h * d;
    const VF rs = hn::Set(df, rescale[h]), pbv = hn::Set(df, pb[h]), ws = hn::Set(df, is.wscale[h]);
    for (size_t c = 0; c < d; c += N) {
      const VF sum = hn::Mul(hn::ConvertTo(df, hn::LoadU(DI(), vi + c)), ws);
      const VF add = hn::Mul(hn::Add(sum, pbv), hn::LoadU(df, c_v + c));
      hn::StoreU(hn::MulAdd(hn::LoadU(df, acc + c), rs, add), df, acc + c);
    }
  }
}
#endif  // KVARN_ATTEND_VNNI || KVARN_ATTEND_AVX2INT

#if KVARN_ATTEND_VNNI

template <int H>
void ValueSumsInt(const uint8_t* codes, size_t g, const uint8_t* wu, int32_t* vi, Prefetcher& pf) {
  vnni::ValueSums<H>(codes, g, wu, vi, pf);
}

// The softmax and weights of query heads h0 .. h0 + H - 1 (vnni::SoftmaxWeights).
template <int H>
void SoftmaxInt(size_t g, IntScratch& is, int h0, const vnni::SoftmaxHeads& in, const float* r_k,
                const float* a_v, const float* b_v, SoftmaxState& st, float* rescale, float* pb) {
  const size_t at = static_cast<size_t>(h0) * g;
  if (g == 128) {
    vnni::SoftmaxWeights<H, 8>(is.si + at, is.si_lo + at, in, r_k, a_v, b_v, &st.max[h0],
                               &st.sum[h0], &rescale[h0], is.wu + at, &is.wscale[h0], &pb[h0]);
  } else {
    vnni::SoftmaxWeights<H, 4>(is.si + at, is.si_lo + at, in, r_k, a_v, b_v, &st.max[h0],
                               &st.sum[h0], &rescale[h0], is.wu + at, &is.wscale[h0], &pb[h0]);
  }
}

// AttendTile with integer dot products (see the top of the file).
void AttendTileFast(const Preset& p, size_t d, int heads, const uint8_t* record,
                    const uint8_t* next, const RecordLayout& l, float scale, AttendScratch& s,
                    IntScratch& is, SoftmaxState& st) {
  const size_t g = static_cast<size_t>(p.tile_tokens);
  float* HWY_RESTRICT r_k = s.r_k.get();
  float* HWY_RESTRICT a_v = s.a_v.get();
  float* HWY_RESTRICT b_v = s.b_v.get();
  Prefetcher prefetch(next, l.total);
  float beta[64];
  BeginFastTile(p, d, heads, record, l, scale, s, is, beta, prefetch);

  float rescale[64], pb[64];
  for (int h0 = 0; h0 < heads; h0 += kMaxHeadBlock) {
    const int hb = std::min(kMaxHeadBlock, heads - h0);
    vnni::SoftmaxHeads in{};
    for (int j = 0; j < hb; ++j) {
      in.qscale[j] = scale * is.qscale[h0 + j];
      in.qscale_lo[j] = scale * is.qscale_lo[h0 + j];
      in.beta[j] = scale * beta[h0 + j];
      in.refined[j] = is.refined[h0 + j];
    }
    switch (hb) {
      case 1: SoftmaxInt<1>(g, is, h0, in, r_k, a_v, b_v, st, rescale, pb); break;
      case 2: SoftmaxInt<2>(g, is, h0, in, r_k, a_v, b_v, st, rescale, pb); break;
      case 3: SoftmaxInt<3>(g, is, h0, in, r_k, a_v, b_v, st, rescale, pb); break;
      default: SoftmaxInt<4>(g, is, h0, in, r_k, a_v, b_v, st, rescale, pb); break;
    }
  }
  for (int h0 = 0; h0 < heads; h0 += kMaxHeadBlock) {
    const int hb = std::min(kMaxHeadBlock, heads - h0);
    const uint8_t* codes = record + l.v_codes;
    const uint8_t* wu = is.wu + h0 * g;
    int32_t* vi = is.vi + h0 * d;
    switch (hb) {
      case 1: ValueSumsInt<1>(codes, g, wu, vi, prefetch); break;
      case 2: ValueSumsInt<2>(codes, g, wu, vi, prefetch); break;
      case 3: ValueSumsInt<3>(codes, g, wu, vi, prefetch); break;
      default: ValueSumsInt<4>(codes, g, wu, vi, prefetch); break;
    }
  }
  AddValueSums(d, heads, is, rescale, pb, s.c_v.get(), s.acc_q.get());
}
#endif  // KVARN_ATTEND_VNNI

#if KVARN_ATTEND_AVX2INT
// AttendTile with integer dot products on AVX2 (simd_attend_avx2-inl.h): the folded query and
// the weights rounded as on the VNNI path, the softmax in fp32 as on the exact path.
void AttendTileFast(const Preset& p, size_t d, int heads, const uint8_t* record,
                    const uint8_t* next, const RecordLayout& l, float scale, AttendScratch& s,
                    IntScratch& is, SoftmaxState& st) {
  const DF df;
  const DI di;
  const size_t N = hn::Lanes(df), g = static_cast<size_t>(p.tile_tokens);
  float* HWY_RESTRICT r_k = s.r_k.get();
  float* HWY_RESTRICT a_v = s.a_v.get();
  float* HWY_RESTRICT b_v = s.b_v.get();
  float* HWY_RESTRICT scores = s.scores.get();
  Prefetcher prefetch(next, l.total);
  float beta[64];
  BeginFastTile(p, d, heads, record, l, scale, s, is, beta, prefetch);

  float rescale[64], pb[64];
  for (int h = 0; h < heads; ++h) {
    float* HWY_RESTRICT sc = scores + h * g;
    const int32_t* HWY_RESTRICT si = is.si + h * g;
    const int32_t* HWY_RESTRICT si_lo = is.si_lo + h * g;
    const VF qs = hn::Set(df, is.qscale[h]), qs_lo = hn::Set(df, is.qscale_lo[h]);
    const bool refined = is.refined[h];
    // Scores in log2 units (log2(e) folded into the scale), so the exponentials are powers
    // of two, as on the VNNI path; the running maximum stays in nats.
    constexpr float kLog2e = 1.44269504088896341f, kLn2 = 0.693147180559945309f;
    const VF bv = hn::Set(df, beta[h]), scv = hn::Set(df, scale * kLog2e);
    VF mx = hn::Set(df, -HUGE_VALF);
    for (size_t i = 0; i < g; i += N) {
      VF y = hn::MulAdd(hn::ConvertTo(df, hn::LoadU(di, si + i)), qs, bv);
      if (refined) y = hn::MulAdd(hn::ConvertTo(df, hn::LoadU(di, si_lo + i)), qs_lo, y);
      const VF x = hn::Mul(hn::Mul(y, hn::LoadU(df, r_k + i)), scv);
      hn::StoreU(x, df, sc + i);
      mx = hn::Max(mx, x);
    }
    const float old2 = st.max[h] * kLog2e;
    const float m_new = std::max(old2, ReduceMax(mx));
    rescale[h] = m_new == old2 ? 1.0f : std::exp2(old2 - m_new);
    st.max[h] = m_new * kLn2;
    const VF mv = hn::Set(df, m_new);
    VF psum = hn::Zero(df), bsum = hn::Zero(df), xsum = hn::Zero(df), pmax = hn::Zero(df);
    for (size_t i = 0; i < g; i += N) {
      const VF pr{avx2int::Exp2NonPositive(hn::Sub(hn::LoadU(df, sc + i), mv).raw)};
      psum = hn::Add(psum, pr);
      bsum = hn::MulAdd(pr, hn::LoadU(df, b_v + i), bsum);
      const VF xv = hn::Mul(pr, hn::LoadU(df, a_v + i));  // p * a_V
      hn::StoreU(xv, df, sc + i);
      xsum = hn::Add(xsum, xv);
      pmax = hn::Max(pmax, xv);
    }
    st.sum[h] = st.sum[h] * rescale[h] + ReduceSum(psum);
    const float wmax = ReduceMax(pmax);
    is.wscale[h] = wmax > 0.0f ? wmax / 255.0f : 0.0f;
    const __m256 inv = _mm256_set1_ps(wmax > 0.0f ? 255.0f / wmax : 0.0f);
    __m256i qsum = _mm256_setzero_si256();
    for (size_t i = 0; i < g; i += 2 * N) {
      qsum = _mm256_add_epi32(qsum, avx2int::RoundWeights16(_mm256_loadu_ps(sc + i),
                                                            _mm256_loadu_ps(sc + i + N), inv,
                                                            is.wu + h * g + i));
    }
    // The rounded weights are at most 255 each, so their sum is exact in float.
    const float qs_sum = static_cast<float>(hn::GetLane(hn::SumOfLanes(di, hn::Vec<DI>{qsum})));
    const float residual = wmax > 0.0f ? ReduceSum(xsum) - is.wscale[h] * qs_sum : 0.0f;
    pb[h] = ReduceSum(bsum) + 1.5f * residual;
  }
  const uint8_t* v_codes = record + l.v_codes;
  for (int h0 = 0; h0 < heads; h0 += 2) {  // two heads' sixteen accumulators fill the registers
    if (heads - h0 >= 2) {
      avx2int::ValueSums<2>(v_codes, g, is.wu + h0 * g, is.vi + h0 * d, prefetch);
    } else {
      avx2int::ValueSums<1>(v_codes, g, is.wu + h0 * g, is.vi + h0 * d, prefetch);
    }
  }
  AddValueSums(d, heads, is, rescale, pb, s.c_v.get(), s.acc_q.get());
}
#endif  // KVARN_ATTEND_AVX2INT

// The record `i` tiles into the sequence, counting on into the next view's (the hint of
// SequenceView::next) past the last; null past both.
const uint8_t* RecordAhead(const SequenceView& seq, size_t i) {
  if (i < seq.tiles.size()) return seq.tiles[i];
  if (seq.next == nullptr) return nullptr;
  i -= seq.tiles.size();
  return i < seq.next->tiles.size() ? seq.next->tiles[i] : nullptr;
}

// The view's fp16 rows (sink and tail, keys and values) as spans of pf.
void AddFp16Rows(const SequenceView& seq, size_t d, SpanPrefetcher& pf) {
  const size_t row_bytes = d * sizeof(uint16_t);
  for (const Fp16Run* run : {&seq.sink, &seq.tail}) {
    const size_t stride = run->RowStride(static_cast<int>(d)) * sizeof(uint16_t);
    pf.Add(run->keys, static_cast<size_t>(run->tokens), row_bytes, stride);
    pf.Add(run->values, static_cast<size_t>(run->tokens), row_bytes, stride);
  }
}

// Requests the fp16 rows of the view attended next, at once: they arrive while this call
// merges and the next one begins (its first records were fetched by RecordAhead).
void PrefetchFp16Rows(const SequenceView* next, size_t d) {
  if (next == nullptr) return;
  SpanPrefetcher pf;
  AddFp16Rows(*next, d, pf);
  pf.Drain();
}

CodecStatus AttendImpl(const Preset& preset, int head_dim, const float* queries, int heads,
                       const SequenceView& seq, float* out, float scale, float* lse, bool exact) {
  const DF df;
  const size_t N = hn::Lanes(df), d = static_cast<size_t>(head_dim);
  const size_t g = static_cast<size_t>(preset.tile_tokens);
  AttendScratch& s = AttendScratch::ForThread(static_cast<size_t>(heads), g, d);
  std::copy_n(queries, heads * d, s.q.get());
  if (preset.rotates()) FwhtRows(s.q.get(), static_cast<size_t>(heads), d);
  std::fill_n(s.acc_q.get(), heads * d, 0.0f);
  std::fill_n(s.acc_h.get(), heads * d, 0.0f);
  SoftmaxState fp16_state, tile_state;
  std::fill_n(fp16_state.max, heads, -HUGE_VALF);
  std::fill_n(tile_state.max, heads, -HUGE_VALF);
  std::fill_n(fp16_state.sum, heads, 0.0f);
  std::fill_n(tile_state.sum, heads, 0.0f);

  // The fp16 parts, then the first two records, fetched a fixed distance ahead of the fp16
  // kernels; what is left of the records is requested once the fp16 parts are done, so that
  // the first tile does not wait.
  SpanPrefetcher pf;
  AddFp16Rows(seq, d, pf);
  const size_t record_bytes = preset.quantizes() ? preset.Layout(head_dim).total : 0;
  for (size_t i = 0; i < std::min<size_t>(2, seq.tiles.size()) && record_bytes > 0; ++i) {
    pf.Add(seq.tiles[i], 1, record_bytes, 0);
  }
  for (size_t i = 0; i < kFp16LeadLines; ++i) pf.Step();
  if (seq.sink.tokens > 0) AttendFp16(d, heads, seq.sink, scale, s, fp16_state, pf);
  if (seq.tail.tokens > 0) AttendFp16(d, heads, seq.tail, scale, s, fp16_state, pf);
  pf.Drain();
  if (!preset.quantizes()) {
    SpanPrefetcher none;
    for (const uint8_t* tile : seq.tiles) {
      const auto* k = reinterpret_cast<const uint16_t*>(tile);
      AttendFp16(d, heads, Fp16Run{k, k + g * d, static_cast<int>(g)}, scale, s, fp16_state, none);
    }
  } else if (!seq.tiles.empty()) {
    PlanePermutation(g, preset.key_bits, s.tok_perm.get());
    PlanePermutation(d, preset.value_bits, s.ch_perm.get());
    const RecordLayout l = preset.Layout(head_dim);
    const TileDotsFn dots = SelectTileDots(preset.key_bits, preset.value_bits);
    bool fast = false;
#if KVARN_ATTEND_VNNI || KVARN_ATTEND_AVX2INT
    fast = !exact && FastPathApplies(preset, d);
    if (fast) {
      IntScratch& is = ThreadInstance<IntScratch>();
      // The fast tile is short enough that fetching one record ahead leaves its start
      // waiting: fetch two ahead (measured ~10% faster cold steps); the first two records
      // were requested with the fp16 parts (SpanPrefetcher).
      constexpr size_t kAhead = 2;
      for (size_t i = 0; i < seq.tiles.size(); ++i) {
        AttendTileFast(preset, d, heads, seq.tiles[i], RecordAhead(seq, i + kAhead), l, scale, s,
                       is, tile_state);
      }
    }
#else
    (void)exact;
#endif
    for (size_t i = 0; !fast && i < seq.tiles.size(); ++i) {
      AttendTile(preset, d, heads, seq.tiles[i], RecordAhead(seq, i + 1), l, scale, dots, s,
                 tile_state);
    }
    PrefetchFp16Rows(seq.next, d);
  }

  // Log-sum-exp merge of the two partial results, back to natural channel order.
  for (int h = 0; h < heads; ++h) {
    const float m = std::max(fp16_state.max[h], tile_state.max[h]);
    const float e1 = std::exp(fp16_state.max[h] - m), e2 = std::exp(tile_state.max[h] - m);
    const float total = fp16_state.sum[h] * e1 + tile_state.sum[h] * e2;
    const float inv = 1.0f / total;
    if (lse != nullptr) lse[h] = m + std::log(total);
    float* o = out + h * d;
    const float* ah = s.acc_h.get() + h * d;
    const float* aq = s.acc_q.get() + h * d;
    for (size_t c = 0; c < d; ++c) o[c] = ah[c] * e1;
    if (preset.quantizes() && !seq.tiles.empty()) {
      for (size_t c = 0; c < d; ++c) o[s.ch_perm.get()[c]] += aq[c] * e2;
    }
    for (size_t c = 0; c < d; c += N) hn::StoreU(hn::Mul(hn::LoadU(df, o + c), hn::Set(df, inv)), df, o + c);
  }
  if (preset.rotates()) FwhtRows(out, static_cast<size_t>(heads), d);
  return {};
}

}  // namespace

CodecStatus AttendEntry(const Preset& preset, int head_dim, const float* queries, int heads,
                        const SequenceView& seq, float* out, float scale, float* lse) {
  return AttendImpl(preset, head_dim, queries, heads, seq, out, scale, lse, /*exact=*/true);
}
CodecStatus AttendFastEntry(const Preset& preset, int head_dim, const float* queries, int heads,
                            const SequenceView& seq, float* out, float scale, float* lse) {
  return AttendImpl(preset, head_dim, queries, heads, seq, out, scale, lse, /*exact=*/false);
}

}  // namespace HWY_NAMESPACE
}  // namespace kvarn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvarn {
HWY_EXPORT(AttendEntry);
HWY_EXPORT(AttendFastEntry);

CodecStatus SimdAttend(const Preset& preset, int head_dim, const float* queries, int num_queries,
                       const SequenceView& seq, float* out, float softmax_scale, float* lse) {
  return HWY_DYNAMIC_DISPATCH(AttendEntry)(preset, head_dim, queries, num_queries, seq, out,
                                           softmax_scale, lse);
}
CodecStatus SimdAttendFast(const Preset& preset, int head_dim, const float* queries,
                           int num_queries, const SequenceView& seq, float* out,
                           float softmax_scale, float* lse) {
  return HWY_DYNAMIC_DISPATCH(AttendFastEntry)(preset, head_dim, queries, num_queries, seq, out,
                                               softmax_scale, lse);
}
}  // namespace kvarn
#endif
