// The power of two of the fast attention paths' softmax (simd_attend_int-inl.h,
// simd_attend_avx2-inl.h): 2^f for f in [-0.5, 0.5] as a degree-3 polynomial, fitted for
// relative error (measured < 7.5e-5 in float; the weights are rounded to 1/255 steps after
// it). Highest power first, for Horner's rule.
#ifndef KVARN_KERNELS_ATTEND_EXP2_H_
#define KVARN_KERNELS_ATTEND_EXP2_H_

namespace kvarn {

inline constexpr float kExp2Poly[4] = {5.517145246267319e-2f, 2.426106184720993e-1f,
                                       6.932609677314758e-1f, 9.999281167984009e-1f};

}  // namespace kvarn

#endif  // KVARN_KERNELS_ATTEND_EXP2_H_
