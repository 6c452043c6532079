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
  ScratchArray<float> u;    // T / exp(Lc) of the current iteration, [G][D]
  // Per token and per channel: log-scale, exp(l), RN(1 / exp(l)), std.
  ScratchArray<float> l_tok, e_tok, r_tok, std_tok, l_ch, e_ch, r_ch, std_ch;
  ScratchArray<float> tmp;        // per token or per channel
  ScratchArray<double> s1, s2, hrow;  // per token: folded shifted sums, shift
  ScratchArray<double> state;         // per token: 2 x kChannelPartials partial sums
  void Reserve(size_t g, size_t d) {
    for (ScratchArray<double>* a : {&s1, &s2, &hrow}) a->Reserve(g);
    state.Reserve(g * 32);
    u.Reserve(g * d);
    for (ScratchArray<float>* a : {&l_tok, &e_tok, &r_tok, &std_tok}) a->Reserve(g);
    for (ScratchArray<float>* a : {&l_ch, &e_ch, &r_ch, &std_ch}) a->Reserve(d);
    tmp.Reserve(g > d ? g : d);
  }
};

// The calling thread's instance of T, behind a call that is not inlined. A thread_local
// used directly in an inlined kernel is looked up again at each use: in -fPIC code that is a
// call to __tls_get_addr with the live vector registers saved around it, and it was inside
// the attention's score loop. Through this the kernels hold a plain reference.
template <class T>
[[gnu::noinline]] T& ThreadInstance() {
  thread_local T instance;
  return instance;
}

struct EncodeScratch {
  ScratchArray<float> k, v;     // [G][D] tiles in the storage frame
  ScratchArray<float> b;        // balanced values: a key column strip [G][N] or a value row [D]
  ScratchArray<uint8_t> codes;  // packed key codes token-major [G/p][D], or one value row
  ScratchArray<uint8_t> record;          // the record under construction
  ScratchArray<float> tok_scale, tok_inv, ch_scale, ch_inv, step, lo;
  BalanceScratch balance;

  static EncodeScratch& ForThread(size_t g, size_t d) {
    EncodeScratch& s = ThreadInstance<EncodeScratch>();
    const size_t n = g * d, wide = g > d ? g : d;
    for (ScratchArray<float>* a : {&s.k, &s.v, &s.b}) a->Reserve(n);
    s.codes.Reserve(n);
    s.record.Reserve(4 * n);
    for (ScratchArray<float>* a : {&s.tok_scale, &s.tok_inv, &s.ch_scale, &s.ch_inv, &s.step, &s.lo}) {
      a->Reserve(wide);
    }
    s.balance.Reserve(g, d);
    return s;
  }
};

struct DecodeScratch {
  ScratchArray<uint8_t> codes;    // one row of unpacked value codes
  ScratchArray<uint8_t> codes_t;  // packed key codes, transposed to token-major [G/p][D]
  ScratchArray<float> rows;       // a few decoded rows, when the output needs unrotating
  ScratchArray<float> a, b, s;    // widened fp16 fields

  static DecodeScratch& ForThread(size_t g, size_t d) {
    DecodeScratch& s = ThreadInstance<DecodeScratch>();
    s.codes.Reserve(d);
    s.codes_t.Reserve(g * d / 2);
    s.rows.Reserve(4 * d);  // RowSink::kRows
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
    AttendScratch& s = ThreadInstance<AttendScratch>();
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
