// The per-element arithmetic of KVarN (KVARN_SPEC.md §3-§5, §7), in one place for every
// implementation: the scalar reference, the SIMD codec and the CUDA kernels all call these,
// so the CPU tests exercise the exact expressions the GPU runs.
#ifndef KVARN_KERNELS_KVARN_MATH_H_
#define KVARN_KERNELS_KVARN_MATH_H_

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/hd.h"

namespace kvarn {

// §3 clamps.
inline constexpr float kStdMin = 1e-3f;
inline constexpr float kStdMax = 1e3f;
inline constexpr float kLogScaleMin = -0.3f;
inline constexpr float kLogScaleMax = 10.0f;
inline constexpr float kImbalanceFloor = 1e-8f;
// §4 smallest quantization step.
inline constexpr float kStepFloor = 1e-10f;
inline constexpr int kDefaultIterations = 8;

KVARN_HD inline float ClampF(float x, float lo, float hi) { return fminf(fmaxf(x, lo), hi); }

// exp and log of a float, rounded to float from the double-precision result (correctly
// rounded but for double rounding, which cannot occur where the double lies more than a
// double ulp from a float midpoint). Every implementation uses these (the SIMD codec a
// vector version that defers to them near midpoints), so the scales are the same bits on
// every target and on the GPU; docs/codec_arithmetic.md compares them with torch's.
KVARN_HD inline float ExpF(float x) { return static_cast<float>(exp(static_cast<double>(x))); }
KVARN_HD inline float LogF(float x) { return static_cast<float>(log(static_cast<double>(x))); }

// The std used to update a log-scale: clamped to [1e-3, 1e3] before its log is taken.
KVARN_HD inline float LogClampedStd(float std) { return LogF(ClampF(std, kStdMin, kStdMax)); }

// A log-scale after an update: clamped to [-0.3, 10].
KVARN_HD inline float ClampLogScale(float l) { return ClampF(l, kLogScaleMin, kLogScaleMax); }

// Bessel-corrected standard deviation from a count and the first two moments about a shift
// (s1 = sum(x - c), s2 = sum((x - c)^2)); the shift keeps the subtraction well conditioned.
KVARN_HD inline float StdFromShiftedMoments(double n, double s1, double s2) {
  const double var = (s2 - s1 * s1 / n) / (n - 1.0);
  return static_cast<float>(sqrt(var > 0.0 ? var : 0.0));
}

// The balancing std of n float values x[i * stride], in the one summation order every CPU
// implementation uses (docs/codec_arithmetic.md): shifted by x[0], in double, y = x - x[0],
// s1 += y and s2 = fma(y, y, s2) in `partials` interleaved accumulators (element i into
// accumulator i % partials, in order of i), folded pairwise (acc[j] += acc[j + w] for
// w = partials/2 .. 1). Sums over the channels of a token use kChannelPartials (one vector
// of floats on the widest target), sums over the tokens of a channel one accumulator.
inline constexpr int kChannelPartials = 16;
KVARN_HD inline void FoldPartials(double* acc, int partials) {
  for (int w = partials / 2; w >= 1; w /= 2) {
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
  }
}
KVARN_HD inline float BalanceStd(const float* x, int n, int stride, int partials) {
  double s1[kChannelPartials] = {}, s2[kChannelPartials] = {};
  const double h = static_cast<double>(x[0]);
  for (int i = 0; i < n; ++i) {
    const double y = static_cast<double>(x[static_cast<long>(i) * stride]) - h;
    s1[i % partials] += y;
    s2[i % partials] = fma(y, y, s2[i % partials]);
  }
  FoldPartials(s1, partials);
  FoldPartials(s2, partials);
  return StdFromShiftedMoments(static_cast<double>(n), s1[0], s2[0]);
}

// One axis's share of Imb(X): max(std) / max(min(std), 1e-8).
KVARN_HD inline float AxisImbalance(float max_std, float min_std) {
  return max_std / fmaxf(min_std, kImbalanceFloor);
}

// §4: the quantization step of a row with range [lo, hi].
KVARN_HD inline float QuantStep(float lo, float hi, int bits) {
  const float qmax = static_cast<float>((1 << bits) - 1);
  return fmaxf((hi - lo) / qmax, kStepFloor);
}

// §4: asymmetric round-to-nearest, ties to even (rintf in the default rounding mode).
KVARN_HD inline uint8_t QuantizeCode(float x, float lo, float step, int bits) {
  const float qmax = static_cast<float>((1 << bits) - 1);
  const float q = rintf((x - lo) / step);
  return static_cast<uint8_t>(ClampF(q, 0.0f, qmax));
}

// §4 dequantization identities (rotated frame, fp16 scales already widened to float).
KVARN_HD inline float DequantKey(float code, float a_k, float b_k, float r_k) {
  return (code * a_k + b_k) * r_k;
}
KVARN_HD inline float DequantValue(float code, float a_v, float b_v, float c_v) {
  return (code * a_v + b_v) * c_v;
}

// §5 packing: element i of a row of codes lives in byte i / p at bit (i % p) * bits,
// p = 8 / bits codes per byte.
KVARN_HD inline uint8_t UnpackCode(const uint8_t* row, int i, int bits) {
  const int per_byte = 8 / bits;
  const int shift = (i % per_byte) * bits;
  return static_cast<uint8_t>((row[i / per_byte] >> shift) & ((1 << bits) - 1));
}
KVARN_HD inline void PackCode(uint8_t* row, int i, int bits, uint8_t code) {
  const int per_byte = 8 / bits;
  const int shift = (i % per_byte) * bits;
  row[i / per_byte] = static_cast<uint8_t>(row[i / per_byte] | (code << shift));
}

// §5 record layout of one tile of one (layer, kv-head): byte offsets of each field.
struct RecordLayout {
  size_t k_codes = 0;  // [D][G*kbits/8], channel-major
  size_t k_a = 0;      // fp16 [D]
  size_t k_b = 0;      // fp16 [D]
  size_t k_r = 0;      // fp16 [G]
  size_t v_codes = 0;  // [G][D*vbits/8], token-major
  size_t v_c = 0;      // fp16 [D]
  size_t v_a = 0;      // fp16 [G]
  size_t v_b = 0;      // fp16 [G]
  size_t total = 0;
};

KVARN_HD inline RecordLayout ComputeRecordLayout(int head_dim, int tile_tokens, int key_bits,
                                                 int value_bits) {
  const size_t d = static_cast<size_t>(head_dim);
  const size_t g = static_cast<size_t>(tile_tokens);
  RecordLayout l;
  l.k_codes = 0;
  l.k_a = l.k_codes + d * g * static_cast<size_t>(key_bits) / 8;
  l.k_b = l.k_a + 2 * d;
  l.k_r = l.k_b + 2 * d;
  l.v_codes = l.k_r + 2 * g;
  l.v_c = l.v_codes + g * d * static_cast<size_t>(value_bits) / 8;
  l.v_a = l.v_c + 2 * d;
  l.v_b = l.v_a + 2 * g;
  l.total = l.v_b + 2 * g;
  return l;
}

}  // namespace kvarn

#endif  // KVARN_KERNELS_KVARN_MATH_H_
