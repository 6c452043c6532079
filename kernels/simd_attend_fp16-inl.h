// The fp16 parts of decode attention (the sink and the tail, and the tiles of presets that
// do not quantize): scores and value sums in fp32 over fp16 keys and values in the storage
// frame, folded into their own online-softmax state, which simd_attend.cc merges with the
// quantized tiles' state at the end of the call. Also SpanPrefetcher, which fetches them (and
// the first records) ahead of the kernels, and the softmax state both parts keep.
//
// Included by simd_attend.cc only, after its fp-contract setting (every fused multiply-add
// here is written out as MulAdd).
//
// Include guard in Highway's per-target form: this header is re-included once per target.
#if defined(KVARN_KERNELS_SIMD_ATTEND_FP16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVARN_KERNELS_SIMD_ATTEND_FP16_INL_H_
#undef KVARN_KERNELS_SIMD_ATTEND_FP16_INL_H_
#else
#define KVARN_KERNELS_SIMD_ATTEND_FP16_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "kernels/codec.h"
#include "kernels/simd-inl.h"
#include "kernels/simd_scratch.h"

HWY_BEFORE_NAMESPACE();
namespace kvarn {
namespace HWY_NAMESPACE {

constexpr int kMaxHeadBlock = 4;  // query heads whose accumulators share the registers

// An online softmax per query head: the running maximum of the scores (nats) and the sum of
// exp(score - max) so far.
struct SoftmaxState {
  float max[64];
  float sum[64];
};

// Fetches the fp16 parts array by array (sink keys, sink values, tail keys, tail values) and
// then the first quantized records, a line per 64 bytes the fp16 kernels read, from a fixed
// lead on. The keys are read row by row, so the fetch runs the lead ahead of them; the values
// are read in passes of 4N channels over all rows, and the first pass counts whole rows, so
// that the fetch runs ahead of it and the later passes find the rows in L2. What is left of
// the records when the fp16 parts are done is requested at once (Drain). The fp16 parts are
// small arrays that each start cold; at 4K tokens they are a fifth of a step's bytes
// (docs/benchmarks.md, "The fp16 parts": the cold 4K step about 5% shorter with this and
// SumsOf4). Into L2 (T1) like Prefetcher.
class SpanPrefetcher {
 public:
  static constexpr int kMaxSpans = 6;
  // `rows` rows of `row_bytes`, `stride` bytes apart (a pool block's fp16 rows are a token
  // apart; a record is one row).
  void Add(const void* p, size_t rows, size_t row_bytes, size_t stride) {
    if (p == nullptr || rows == 0 || row_bytes == 0 || n_ == kMaxSpans) return;
    spans_[n_++] = {static_cast<const uint8_t*>(p), rows, row_bytes, stride};
  }
  // One cache line per call: the row's next, the next row's first, the next span's first.
  HWY_INLINE void Step() {
    if (cur_ >= n_) return;
    const Span& s = spans_[cur_];
    __builtin_prefetch(s.begin + row_ * s.stride + off_, /*rw=*/0, /*locality=*/2);  // prefetcht1
    off_ += 64;
    if (off_ >= s.row_bytes) {
      off_ = 0;
      if (++row_ == s.rows) {
        row_ = 0;
        ++cur_;
      }
    }
  }
  // One line per 64 bytes the kernels have read.
  HWY_INLINE void Consumed(size_t bytes) {
    for (read_ += bytes; read_ >= 64; read_ -= 64) Step();
  }
  // Fetches what is left of every span at once.
  void Drain() {
    while (cur_ < n_) Step();
  }

 private:
  struct Span {
    const uint8_t* begin;
    size_t rows, row_bytes, stride;
  };
  Span spans_[kMaxSpans] = {};
  int n_ = 0, cur_ = 0;
  size_t row_ = 0, off_ = 0;  // the next line: row and byte offset in the current span
  size_t read_ = 0;           // bytes read since the last Step
};

// How far SpanPrefetcher runs ahead of the fp16 kernels, in cache lines.
constexpr size_t kFp16LeadLines = 32;

// sums[j] = the sum of the lanes of v[j], for j < 4: the four reductions share their shuffles
// (two rounds of interleaves leave every 128-bit block holding a part of each sum).
HWY_INLINE void SumsOf4(const VF* HWY_RESTRICT v, float* HWY_RESTRICT sums) {
#if HWY_TARGET == HWY_SCALAR
  for (int j = 0; j < 4; ++j) sums[j] = ReduceSum(v[j]);
#else
  const DF df;
  const hn::Repartition<uint64_t, DF> d64;
  const hn::Full128<float> d4;
  // Per block: [v0 + v0', v1 + v1', ...] pairs, then [s0, s1, s2, s3] partial sums.
  const VF ab = hn::Add(hn::InterleaveLower(df, v[0], v[1]), hn::InterleaveUpper(df, v[0], v[1]));
  const VF cd = hn::Add(hn::InterleaveLower(df, v[2], v[3]), hn::InterleaveUpper(df, v[2], v[3]));
  const auto ab64 = hn::BitCast(d64, ab), cd64 = hn::BitCast(d64, cd);
  const VF blocks = hn::Add(hn::BitCast(df, hn::InterleaveLower(d64, ab64, cd64)),
                            hn::BitCast(df, hn::InterleaveUpper(d64, ab64, cd64)));
  HWY_ALIGN float buf[hn::MaxLanes(df)];
  hn::Store(blocks, df, buf);
  auto acc = hn::Load(d4, buf);
  for (size_t i = 4; i < hn::Lanes(df); i += 4) acc = hn::Add(acc, hn::Load(d4, buf + i));
  hn::StoreU(acc, d4, sums);
#endif
}

// scores[h][t] = scale * q[h] . k[t] for H heads, two tokens at a time (each query vector
// loaded once for both); each key vector is widened once. Key rows are `stride` apart.
template <int H>
void Fp16Scores(size_t d, const float* HWY_RESTRICT q, const uint16_t* HWY_RESTRICT keys,
                size_t stride, size_t tokens, float scale, float* HWY_RESTRICT scores,
                SpanPrefetcher& pf) {
  static_assert(H <= 4, "SumsOf4 reduces four heads");
  const DF df;
  const size_t N = hn::Lanes(df);
  constexpr int kTokens = 2;
  float sums[4];
  for (size_t t = 0; t < tokens; t += kTokens) {
    const int nt = t + 1 < tokens ? kTokens : 1;
    const uint16_t* k = keys + t * stride;
    pf.Consumed(nt * d * sizeof(uint16_t));
    VF acc[kTokens][4];
    for (int i = 0; i < kTokens; ++i) {
      for (int h = 0; h < 4; ++h) acc[i][h] = hn::Zero(df);
    }
    if (nt == kTokens) {
      for (size_t c = 0; c < d; c += N) {
        const VF k0 = LoadHalf(k + c), k1 = LoadHalf(k + stride + c);
        for (int h = 0; h < H; ++h) {
          const VF qv = hn::LoadU(df, q + h * d + c);
          acc[0][h] = hn::MulAdd(qv, k0, acc[0][h]);
          acc[1][h] = hn::MulAdd(qv, k1, acc[1][h]);
        }
      }
    } else {
      for (size_t c = 0; c < d; c += N) {
        const VF k0 = LoadHalf(k + c);
        for (int h = 0; h < H; ++h) {
          acc[0][h] = hn::MulAdd(hn::LoadU(df, q + h * d + c), k0, acc[0][h]);
        }
      }
    }
    for (int i = 0; i < nt; ++i) {
      SumsOf4(acc[i], sums);
      for (int h = 0; h < H; ++h) scores[h * tokens + t + i] = sums[h] * scale;
    }
  }
}

// acc[h][c] += sum_t p[h][t] v[t][c] for H heads, a register block of H x 4 vectors of
// channels at a time (d / N is a multiple of 4 for every head_dim and target). Value rows are
// `stride` apart.
template <int H>
void Fp16Values(size_t d, const uint16_t* HWY_RESTRICT values, size_t stride, size_t tokens,
                const float* HWY_RESTRICT p, size_t p_stride, float* HWY_RESTRICT acc_h,
                SpanPrefetcher& pf) {
  const DF df;
  const size_t N = hn::Lanes(df);
  constexpr size_t kVecs = 4;
  for (size_t c0 = 0; c0 < d; c0 += kVecs * N) {
    VF acc[H][kVecs];
    for (int h = 0; h < H; ++h) {
      for (size_t j = 0; j < kVecs; ++j) acc[h][j] = hn::LoadU(df, acc_h + h * d + c0 + j * N);
    }
    for (size_t t = 0; t < tokens; ++t) {
      const uint16_t* v = values + t * stride + c0;
      // The first pass fetches whole rows, ahead of it; the later passes find them in L2.
      if (c0 == 0) pf.Consumed(d * sizeof(uint16_t));
      VF vv[kVecs];
      for (size_t j = 0; j < kVecs; ++j) vv[j] = LoadHalf(v + j * N);
      for (int h = 0; h < H; ++h) {
        const VF pv = hn::Set(df, p[h * p_stride + t]);
        for (size_t j = 0; j < kVecs; ++j) acc[h][j] = hn::MulAdd(pv, vv[j], acc[h][j]);
      }
    }
    for (int h = 0; h < H; ++h) {
      for (size_t j = 0; j < kVecs; ++j) hn::StoreU(acc[h][j], df, acc_h + h * d + c0 + j * N);
    }
  }
}

// Calls f(std::integral_constant<int, n>()) for a head block of n = 1..kMaxHeadBlock heads.
template <class F>
HWY_INLINE void WithHeadBlock(int n, F&& f) {
  switch (n) {
    case 1:
      f(std::integral_constant<int, 1>());
      break;
    case 2:
      f(std::integral_constant<int, 2>());
      break;
    case 3:
      f(std::integral_constant<int, 3>());
      break;
    default:
      f(std::integral_constant<int, 4>());
      break;
  }
}

// Folds fp16 tokens (storage frame) into the fp16 softmax state and its natural-order
// accumulator.
inline void AttendFp16(size_t d, int heads, const Fp16Run& run, float scale, AttendScratch& s,
                       SoftmaxState& st, SpanPrefetcher& pf) {
  const DF df;
  const uint16_t* keys = run.keys;
  const uint16_t* values = run.values;
  const size_t N = hn::Lanes(df), tokens = static_cast<size_t>(run.tokens), g = tokens;
  const size_t stride = run.RowStride(static_cast<int>(d));
  float* HWY_RESTRICT scores = s.scores.get();  // [H][tokens]
  const float* HWY_RESTRICT queries = s.q.get();
  float* HWY_RESTRICT acc_h = s.acc_h.get();
  SpanPrefetcher idle;  // later head blocks read again what the first one fetched
  for (int h0 = 0; h0 < heads; h0 += kMaxHeadBlock) {
    SpanPrefetcher& pf_h = h0 == 0 ? pf : idle;
    const float* q_h = queries + h0 * d;
    float* sc_h = scores + h0 * g;
    WithHeadBlock(std::min(kMaxHeadBlock, heads - h0), [&](auto h) {
      Fp16Scores<decltype(h)::value>(d, q_h, keys, stride, tokens, scale, sc_h, pf_h);
    });
  }
  for (int h = 0; h < heads; ++h) {
    float* HWY_RESTRICT sc = scores + h * g;
    VF mx = hn::Set(df, st.max[h]);
    size_t i = 0;
    for (; i + N <= tokens; i += N) mx = hn::Max(mx, hn::LoadU(df, sc + i));
    float m_new = ReduceMax(mx);
    for (; i < tokens; ++i) m_new = std::max(m_new, sc[i]);
    const float rescale = std::exp(st.max[h] - m_new);
    st.max[h] = m_new;
    const VF mv = hn::Set(df, m_new);
    VF psum = hn::Zero(df);
    size_t t = 0;
    for (; t + N <= tokens; t += N) {
      const VF pr = hn::Exp(df, hn::Sub(hn::LoadU(df, sc + t), mv));
      hn::StoreU(pr, df, sc + t);
      psum = hn::Add(psum, pr);
    }
    float sum = ReduceSum(psum);
    for (; t < tokens; ++t) sum += (sc[t] = std::exp(sc[t] - m_new));
    st.sum[h] = st.sum[h] * rescale + sum;
    float* acc = acc_h + h * d;
    const VF rs = hn::Set(df, rescale);
    for (size_t c = 0; c < d; c += N) hn::StoreU(hn::Mul(hn::LoadU(df, acc + c), rs), df, acc + c);
  }
  for (int h0 = 0; h0 < heads; h0 += kMaxHeadBlock) {
    float* acc = acc_h + h0 * d;
    const float* p = scores + h0 * g;
    SpanPrefetcher& pf_h = h0 == 0 ? pf : idle;
    WithHeadBlock(std::min(kMaxHeadBlock, heads - h0), [&](auto h) {
      Fp16Values<decltype(h)::value>(d, values, stride, tokens, p, g, acc, pf_h);
    });
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kvarn
HWY_AFTER_NAMESPACE();

#endif  // KVARN_KERNELS_SIMD_ATTEND_FP16_INL_H_
