#include "tests/bench/dense_attention.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tests/bench/dense_attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format off
#include "hwy/aligned_allocator.h"
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"
// clang-format on

#include <algorithm>
#include <cmath>
#include <cstdint>

HWY_BEFORE_NAMESPACE();
namespace kvarn::bench {
namespace HWY_NAMESPACE {
namespace {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

constexpr size_t kBlock = 64;  // tokens per online-softmax step; its V rows stay in L1

// N floats from fp32 or fp16 (binary16 bits) storage.
HWY_INLINE VF LoadRow(const float* p) { return hn::LoadU(DF(), p); }
HWY_INLINE VF LoadRow(const uint16_t* p) {
  const hn::Rebind<hwy::float16_t, DF> dh;
  return hn::PromoteTo(DF(), hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
}

// H query heads over all tokens, K/V elements of type T (float, or fp16 bits widened as they
// are loaded). acc is [H][d] scratch.
template <int H, typename T>
void Attend(const float* HWY_RESTRICT q, const T* HWY_RESTRICT k, const T* HWY_RESTRICT v,
            size_t tokens, size_t d, float scale, float* HWY_RESTRICT acc,
            float* HWY_RESTRICT out) {
  const DF df;
  const size_t N = hn::Lanes(df);
  HWY_ALIGN float p[H][kBlock];
  float max[H], sum[H];
  for (int h = 0; h < H; ++h) max[h] = -HUGE_VALF, sum[h] = 0.0f;
  std::fill_n(acc, H * d, 0.0f);
  for (size_t t0 = 0; t0 < tokens; t0 += kBlock) {
    const size_t n = std::min(kBlock, tokens - t0);
    // Scores: each K row once for all H heads.
    for (size_t t = 0; t < n; ++t) {
      const T* HWY_RESTRICT row = k + (t0 + t) * d;
      VF dot[H];
      for (int h = 0; h < H; ++h) dot[h] = hn::Zero(df);
      for (size_t c = 0; c < d; c += N) {
        const VF kv = LoadRow(row + c);
        for (int h = 0; h < H; ++h) dot[h] = hn::MulAdd(hn::LoadU(df, q + h * d + c), kv, dot[h]);
      }
      for (int h = 0; h < H; ++h) p[h][t] = hn::GetLane(hn::SumOfLanes(df, dot[h])) * scale;
    }
    // Online softmax: p <- exp(s - max), earlier terms rescaled.
    for (int h = 0; h < H; ++h) {
      const float m = std::max(max[h], *std::max_element(p[h], p[h] + n));
      const float rescale = std::exp(max[h] - m);
      max[h] = m;
      const VF mv = hn::Set(df, m);
      VF s = hn::Zero(df);
      size_t t = 0;
      for (; t + N <= n; t += N) {
        const VF e = hn::Exp(df, hn::Sub(hn::Load(df, p[h] + t), mv));
        hn::Store(e, df, p[h] + t);
        s = hn::Add(s, e);
      }
      float tail = 0.0f;
      for (; t < n; ++t) tail += (p[h][t] = std::exp(p[h][t] - m));
      sum[h] = sum[h] * rescale + hn::GetLane(hn::SumOfLanes(df, s)) + tail;
      const VF rv = hn::Set(df, rescale);
      for (size_t c = 0; c < d; c += N)
        hn::Store(hn::Mul(hn::Load(df, acc + h * d + c), rv), df, acc + h * d + c);
    }
    // Values: two vectors of channels for all H heads in registers while the block's rows
    // stream past (the block, kBlock x d floats, is read from memory once and then from L1).
    for (size_t c = 0; c < d; c += 2 * N) {
      VF a0[H], a1[H];
      for (int h = 0; h < H; ++h) {
        a0[h] = hn::Load(df, acc + h * d + c);
        a1[h] = hn::Load(df, acc + h * d + c + N);
      }
      for (size_t t = 0; t < n; ++t) {
        const T* HWY_RESTRICT row = v + (t0 + t) * d + c;
        const VF v0 = LoadRow(row), v1 = LoadRow(row + N);
        for (int h = 0; h < H; ++h) {
          const VF pv = hn::Set(df, p[h][t]);
          a0[h] = hn::MulAdd(pv, v0, a0[h]);
          a1[h] = hn::MulAdd(pv, v1, a1[h]);
        }
      }
      for (int h = 0; h < H; ++h) {
        hn::Store(a0[h], df, acc + h * d + c);
        hn::Store(a1[h], df, acc + h * d + c + N);
      }
    }
  }
  for (int h = 0; h < H; ++h) {
    const VF inv = hn::Set(df, 1.0f / sum[h]);
    for (size_t c = 0; c < d; c += N)
      hn::StoreU(hn::Mul(hn::Load(df, acc + h * d + c), inv), df, out + h * d + c);
  }
}

template <typename T>
void AttendHeads(const float* queries, int heads, const T* keys, const T* values, size_t tokens,
                 int head_dim, float scale, float* out) {
  const size_t d = static_cast<size_t>(head_dim);
  const hwy::AlignedFreeUniquePtr<float[]> buffer = hwy::AllocateAligned<float>(8 * d);
  float* acc = buffer.get();
  switch (heads) {
    case 1:
      Attend<1>(queries, keys, values, tokens, d, scale, acc, out);
      break;
    case 2:
      Attend<2>(queries, keys, values, tokens, d, scale, acc, out);
      break;
    case 3:
      Attend<3>(queries, keys, values, tokens, d, scale, acc, out);
      break;
    case 4:
      Attend<4>(queries, keys, values, tokens, d, scale, acc, out);
      break;
    case 5:
      Attend<5>(queries, keys, values, tokens, d, scale, acc, out);
      break;
    case 6:
      Attend<6>(queries, keys, values, tokens, d, scale, acc, out);
      break;
    case 7:
      Attend<7>(queries, keys, values, tokens, d, scale, acc, out);
      break;
    default:
      Attend<8>(queries, keys, values, tokens, d, scale, acc, out);
      break;
  }
}

}  // namespace

void DenseAttentionImpl(const float* queries, int heads, const float* keys, const float* values,
                        size_t tokens, int head_dim, float scale, float* out) {
  AttendHeads(queries, heads, keys, values, tokens, head_dim, scale, out);
}
void DenseAttentionF16Impl(const float* queries, int heads, const uint16_t* keys,
                           const uint16_t* values, size_t tokens, int head_dim, float scale,
                           float* out) {
  AttendHeads(queries, heads, keys, values, tokens, head_dim, scale, out);
}

}  // namespace HWY_NAMESPACE
}  // namespace kvarn::bench
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvarn::bench {
HWY_EXPORT(DenseAttentionImpl);
HWY_EXPORT(DenseAttentionF16Impl);

void DenseAttention(const float* queries, int heads, const float* keys, const float* values,
                    size_t tokens, int head_dim, float scale, float* out) {
  HWY_DYNAMIC_DISPATCH(DenseAttentionImpl)
  (queries, heads, keys, values, tokens, head_dim, scale, out);
}
void DenseAttentionF16(const float* queries, int heads, const uint16_t* keys,
                       const uint16_t* values, size_t tokens, int head_dim, float scale,
                       float* out) {
  HWY_DYNAMIC_DISPATCH(DenseAttentionF16Impl)
  (queries, heads, keys, values, tokens, head_dim, scale, out);
}
}  // namespace kvarn::bench
#endif
