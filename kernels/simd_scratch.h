// Thread-local working memory of the SIMD codec, grown on demand and reused, so encode,
// decode and attention never allocate on their hot paths.
#ifndef KVARN_KERNELS_SIMD_SCRATCH_H_
#define KVARN_KERNELS_SIMD_SCRATCH_H_

#include <cstddef>
#include <cstdint>

#include "hwy/aligned_allocator.h"

namespace kvarn {

template <typename T>
class ScratchArray {
 public:
  T* get() const { return data_.get(); }
  void Reserve(size_t n) {
    if (n > capacity_) {
      data_ = hwy::AllocateAligned<T>(n);
      capacity_ = n;
    }
  }

 private:
  hwy::AlignedFreeUniquePtr<T[]> data_;
  size_t capacity_ = 0;
};

struct BalanceScratch {
  // Per row (r) and per column (c) of the balanced matrix: log-scales, scales exp(l),
  // their reciprocals in double, stds in double, and the best-so-far log-scales.
  ScratchArray<float> lr, lc, er, ec, fr, fc, best_lr, best_lc;
  ScratchArray<double> rr, rc, sr, sc;
  void Reserve(size_t rows, size_t cols) {
    for (ScratchArray<float>* a : {&lr, &er, &fr, &best_lr}) a->Reserve(rows);
    for (ScratchArray<float>* a : {&lc, &ec, &fc, &best_lc}) a->Reserve(cols);
    rr.Reserve(rows);
    sr.Reserve(rows);
    rc.Reserve(cols);
    sc.Reserve(cols);
  }
};

struct EncodeScratch {
  ScratchArray<float> k, v, b;           // [G][D] tiles in the storage frame, balanced rows
  ScratchArray<uint8_t> codes, codes_t;  // [G][D] codes and their transpose
  ScratchArray<uint8_t> record;          // the record under construction
  ScratchArray<float> tok_scale, tok_inv, ch_scale, ch_inv, step, lo;
  BalanceScratch balance;

  static EncodeScratch& ForThread(size_t g, size_t d) {
    thread_local EncodeScratch s;
    const size_t n = g * d, wide = g > d ? g : d;
    for (ScratchArray<float>* a : {&s.k, &s.v, &s.b}) a->Reserve(n);
    s.codes.Reserve(n);
    s.codes_t.Reserve(n);
    s.record.Reserve(4 * n);
    for (ScratchArray<float>* a : {&s.tok_scale, &s.tok_inv, &s.ch_scale, &s.ch_inv, &s.step, &s.lo}) {
      a->Reserve(wide);
    }
    s.balance.Reserve(g, d);
    return s;
  }
};

struct DecodeScratch {
  ScratchArray<uint8_t> codes, codes_t;  // [D][G] unpacked key codes and their transpose
  ScratchArray<float> tile;              // [G][D] fp32, when the output needs unrotating
  ScratchArray<float> a, b, s;           // widened fp16 fields

  static DecodeScratch& ForThread(size_t g, size_t d) {
    thread_local DecodeScratch s;
    s.codes.Reserve(g * d);
    s.codes_t.Reserve(g * d);
    s.tile.Reserve(g * d);
    const size_t wide = g > d ? g : d;
    for (ScratchArray<float>* x : {&s.a, &s.b, &s.s}) x->Reserve(wide);
    return s;
  }
};

struct AttendScratch {
  ScratchArray<float> q;          // [H][D] queries, storage frame
  ScratchArray<float> w;          // [H][D] q * a_K
  ScratchArray<float> scores;     // [H][G] plane order, then p * a_V
  ScratchArray<float> tile_acc;   // [H][D] one tile's value sums, channel-plane order
  ScratchArray<float> acc_q;      // [H][D] quantized tiles' accumulator, channel-plane order
  ScratchArray<float> acc_h;      // [H][D] fp16 parts' accumulator, natural order
  ScratchArray<float> a_k, b_k, r_k, a_v, b_v, c_v;  // widened fields, r_k/a_v/b_v token-plane order
  ScratchArray<int32_t> tok_perm, ch_perm;           // plane position -> element

  static AttendScratch& ForThread(size_t heads, size_t g, size_t d) {
    thread_local AttendScratch s;
    for (ScratchArray<float>* x : {&s.q, &s.w, &s.tile_acc, &s.acc_q, &s.acc_h}) x->Reserve(heads * d);
    s.scores.Reserve(heads * g);
    for (ScratchArray<float>* x : {&s.a_k, &s.b_k, &s.c_v}) x->Reserve(d);
    for (ScratchArray<float>* x : {&s.r_k, &s.a_v, &s.b_v}) x->Reserve(g);
    s.tok_perm.Reserve(g);
    s.ch_perm.Reserve(d);
    return s;
  }
};

}  // namespace kvarn

#endif  // KVARN_KERNELS_SIMD_SCRATCH_H_
