// Body of the encode kernel (KVARN_SPEC.md §2-§5): one K or V tile of one (layer, kv-head)
// per thread block. Shared by kernels/cuda/encode.cu and the host block emulator.
//
// Numerics follow kernels/reference.cc operation for operation, so the records are the
// same bits as the CPU's:
//  - the tile sits in shared memory as fp32 [G][D] token-major, rotated in place by the
//    reference's butterflies;
//  - the scaled tile is cur = t / exp(Lc) / exp(Lr), two IEEE float divisions in that order,
//    with exp(L) rounded to float (kept in shared memory, or recomputed where it does not fit);
//  - every std is a Bessel std accumulated in double over the float cur values and rounded
//    to float once, as the CPU's (kvarn_math.h BalanceStd). The CPU fixes one summation
//    order (shifted sums); here the sums are two-pass and in a parallel order, which changes
//    the float result only when the double lies within ~1e-15 of a float rounding boundary;
//  - log-scales, imbalance, best-so-far selection (ties accepted) and RTN are the same float
//    operations, and exp and log the CPU's too (kvarn_math.h ExpF, LogF: double, rounded);
//  - the quantized tile is B = T / Sc* / Sr* in that order, step = (hi - lo) / qmax,
//    a = Sr* step, b = Sr* lo (docs/codec_arithmetic.md).
// The translation unit is compiled with -fmad=false so that no a*b+c is fused.
//
// The spec's matrices are K as [D][G] (rows = channels) and V as [G][D] (rows = tokens);
// here both stay token-major, and the spec's "columns" (updated first) are tokens for K and
// channels for V. Reductions over tokens (per channel) and over channels (per token) each
// have one thread mapping with conflict-free shared-memory access.
#ifndef KVARN_KERNELS_CUDA_ENCODE_BODY_H_
#define KVARN_KERNELS_CUDA_ENCODE_BODY_H_

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/block_ops.h"
#include "kernels/cuda/kernel_types.h"
#include "kernels/fp16.h"
#include "kernels/kvarn_math.h"

namespace kvarn::cuda {

inline constexpr int kEncodeThreads = 512;

// Where the parts of one block's shared memory live (byte offsets).
struct EncodePlan {
  int tile_in_smem = 1;  // else the tile lives in a global scratch slab per resident block
  int materialize = 1;   // keep the scaled tile `cur` in shared memory
  size_t tile = 0, cur = 0, fvec = 0, dvec = 0, part = 0;
  size_t smem_bytes = 0;
};

// Lays out shared memory for a G x D tile and `threads` threads within `max_smem` bytes.
KVARN_HD inline EncodePlan PlanEncode(int g, int d, int threads, size_t max_smem) {
  const size_t n = static_cast<size_t>(g) * static_cast<size_t>(d);
  const size_t w = static_cast<size_t>(g > d ? g : d);
  const size_t fvec =
      AlignUp16(sizeof(float) * (4 * static_cast<size_t>(g) + 4 * static_cast<size_t>(d) + 2 * w));
  const size_t dvec = AlignUp16(sizeof(double) * static_cast<size_t>(g + d));
  const size_t part_elems = static_cast<size_t>(g) * 33 > static_cast<size_t>(2 * threads)
                                ? static_cast<size_t>(g) * 33
                                : static_cast<size_t>(2 * threads);
  const size_t part = AlignUp16(sizeof(double) * part_elems);
  const size_t aux = fvec + dvec + part;
  EncodePlan p;
  const size_t tile = AlignUp16(sizeof(float) * n);
  p.tile_in_smem = aux + tile <= max_smem;
  p.materialize = aux + 2 * tile <= max_smem;
  size_t off = 0;
  p.fvec = off;
  off += fvec;
  p.dvec = off;
  off += dvec;
  p.part = off;
  off += part;
  p.tile = off;
  if (p.tile_in_smem) off += tile;
  p.cur = off;
  if (p.materialize) off += tile;
  p.smem_bytes = off;
  return p;
}

struct EncodeParams {
  // Tile of slot s: src[0] (keys) and src[1] (values) + s * slot_stride elements, G rows of
  // D, row t at t * row_stride.
  const void* src[2] = {nullptr, nullptr};
  size_t slot_stride = 0, row_stride = 0;
  int src_f16 = 0;         // elements are binary16 (else fp32)
  int rotate = 0;          // multiply every token vector by H on load (original-frame input)
  uint8_t* dst = nullptr;  // record of slot s at dst + s * record_bytes
  size_t record_bytes = 0;
  RecordLayout rl;
  int g = 0, d = 0, kbits = 0, vbits = 0;
  int balance = 0;   // KVarN dual-axis balancing
  int quantize = 0;  // 0: the fp16 preset's passthrough record
  int iterations = 0;
  int num_slots = 0;
  int32_t* status = nullptr;  // [num_slots] or null
  EncodePlan plan;
};

namespace encode_detail {

struct MinMax {
  float lo, hi;
};

// Reduces f(tok, ch) over the tokens of every channel; finish(ch, acc) consumes the result.
// `part` holds at least nthreads accumulators. Ends with a barrier.
template <class Acc, class Ctx, class F, class Op, class Fin>
KVARN_DEV void ReducePerChannel(const Ctx& ctx, int g, int d, Acc* part, Acc init, F f, Op op,
                                Fin finish) {
  const int nt = ctx.nthreads(), tid = ctx.tid();
  if (d >= nt) {
    for (int ch = tid; ch < d; ch += nt) {
      Acc s = init;
      for (int tok = 0; tok < g; ++tok) s = op(s, f(tok, ch));
      finish(ch, s);
    }
  } else {
    const int per = nt / d;  // threads per channel; consecutive threads take consecutive channels
    const int ch = tid % d, sub = tid / d;
    Acc s = init;
    for (int tok = sub; tok < g; tok += per) s = op(s, f(tok, ch));
    part[sub * d + ch] = s;
    ctx.Sync();
    if (tid < d) {
      Acc t = init;
      for (int k = 0; k < per; ++k) t = op(t, part[k * d + tid]);
      finish(tid, t);
    }
  }
  ctx.Sync();
}

// Reduces f(tok, ch) over the channels of every token: 32 threads per token, each taking
// every 32nd channel, then one thread per token folds the 32 partials. `part` holds
// G * 33 accumulators. Ends with a barrier.
template <class Acc, class Ctx, class F, class Op, class Fin>
KVARN_DEV void ReducePerToken(const Ctx& ctx, int g, int d, Acc* part, Acc init, F f, Op op,
                              Fin finish) {
  const int nt = ctx.nthreads(), tid = ctx.tid();
  for (int pi = tid; pi < g * 32; pi += nt) {
    const int tok = pi >> 5, j = pi & 31;
    Acc s = init;
    for (int ch = j; ch < d; ch += 32) s = op(s, f(tok, ch));
    part[tok * 33 + j] = s;
  }
  ctx.Sync();
  for (int tok = tid; tok < g; tok += nt) {
    Acc s = init;
    for (int j = 0; j < 32; ++j) s = op(s, part[tok * 33 + j]);
    finish(tok, s);
  }
  ctx.Sync();
}

// The reference's Std(): two passes, double accumulation, rounded to float. per_token picks
// the axis: std over the D channels of each token, else over the G tokens of each channel.
template <class Ctx, class Cur>
KVARN_DEV void AxisStds(const Ctx& ctx, bool per_token, int g, int d, double* part, double* mean,
                        float* out, Cur cur) {
  const auto add = [](double a, double b) { return a + b; };
  const auto value = [&](int tok, int ch) { return static_cast<double>(cur(tok, ch)); };
  if (per_token) {
    const auto dev = [&](int tok, int ch) {
      const double x = static_cast<double>(cur(tok, ch)) - mean[tok];
      return x * x;
    };
    ReducePerToken<double>(ctx, g, d, part, 0.0, value, add,
                           [&](int tok, double s) { mean[tok] = s / d; });
    ReducePerToken<double>(ctx, g, d, part, 0.0, dev, add, [&](int tok, double s) {
      out[tok] = static_cast<float>(sqrt(s / (d - 1)));
    });
  } else {
    const auto dev = [&](int tok, int ch) {
      const double x = static_cast<double>(cur(tok, ch)) - mean[ch];
      return x * x;
    };
    ReducePerChannel<double>(ctx, g, d, part, 0.0, value, add,
                             [&](int ch, double s) { mean[ch] = s / g; });
    ReducePerChannel<double>(ctx, g, d, part, 0.0, dev, add, [&](int ch, double s) {
      out[ch] = static_cast<float>(sqrt(s / (g - 1)));
    });
  }
}

// Imb (KVARN_SPEC.md §3) of float stds; every thread returns the same value. `red` holds
// 4 * nthreads floats. Ends with a barrier.
template <class Ctx>
KVARN_DEV float Imbalance(const Ctx& ctx, const float* col, int ncol, const float* row, int nrow,
                          float* red) {
  const int nt = ctx.nthreads(), tid = ctx.tid();
  float cmax = col[0], cmin = col[0], rmax = row[0], rmin = row[0];
  for (int i = tid; i < ncol; i += nt) cmax = fmaxf(cmax, col[i]), cmin = fminf(cmin, col[i]);
  for (int i = tid; i < nrow; i += nt) rmax = fmaxf(rmax, row[i]), rmin = fminf(rmin, row[i]);
  red[tid] = cmax;
  red[nt + tid] = cmin;
  red[2 * nt + tid] = rmax;
  red[3 * nt + tid] = rmin;
  ctx.Sync();
  for (int s = nt / 2; s > 0; s >>= 1) {
    if (tid < s) {
      red[tid] = fmaxf(red[tid], red[tid + s]);
      red[nt + tid] = fminf(red[nt + tid], red[nt + tid + s]);
      red[2 * nt + tid] = fmaxf(red[2 * nt + tid], red[2 * nt + tid + s]);
      red[3 * nt + tid] = fminf(red[3 * nt + tid], red[3 * nt + tid + s]);
    }
    ctx.Sync();
  }
  const float imb = AxisImbalance(red[0], red[nt]) + AxisImbalance(red[2 * nt], red[3 * nt]);
  ctx.Sync();
  return imb;
}

KVARN_DEV void PutHalf(uint8_t* base, size_t offset, int i, uint16_t h) {
  reinterpret_cast<uint16_t*>(base + offset)[i] = h;
}

KVARN_DEV bool HalfIsFinite(uint16_t h) { return (h & 0x7C00u) != 0x7C00u; }

}  // namespace encode_detail

// Encodes work item `work` = 2 * slot + (0 keys | 1 values). `tile_scratch` is this block's
// G*D floats of global memory when the plan keeps the tile out of shared memory.
template <class Ctx>
KVARN_DEV void EncodeWork(const Ctx& ctx, const EncodeParams& p, int work, unsigned char* smem,
                          float* tile_scratch) {
  using encode_detail::MinMax;
  const int slot = work >> 1;
  const int m = work & 1;
  const bool is_k = m == 0;
  const int g = p.g, d = p.d, nt = ctx.nthreads(), tid = ctx.tid();
  const int n = g * d;
  int dshift = 0;
  while ((1 << dshift) < d) ++dshift;

  float* tile = p.plan.tile_in_smem ? reinterpret_cast<float*>(smem + p.plan.tile) : tile_scratch;
  float* curbuf = reinterpret_cast<float*>(smem + p.plan.cur);
  float* fv = reinterpret_cast<float*>(smem + p.plan.fvec);
  float* e_tok = fv;
  float* l_tok = e_tok + g;
  float* std_tok = l_tok + g;
  float* best_tok = std_tok + g;
  float* e_ch = best_tok + g;
  float* l_ch = e_ch + d;
  float* std_ch = l_ch + d;
  float* best_ch = std_ch + d;
  float* lo_s = best_ch + d;
  float* step_s = lo_s + (g > d ? g : d);
  double* mean_tok = reinterpret_cast<double*>(smem + p.plan.dvec);
  double* mean_ch = mean_tok + g;
  double* part = reinterpret_cast<double*>(smem + p.plan.part);

  ctx.Sync();  // the previous work item of this block is done with shared memory

  // Load, with the reference's value check (before rotation).
  {
    const size_t base = static_cast<size_t>(slot) * p.slot_stride;
    int bad = 0;
    for (int e = tid; e < n; e += nt) {
      const size_t at =
          base + static_cast<size_t>(e >> dshift) * p.row_stride + static_cast<size_t>(e & (d - 1));
      const float x = p.src_f16 ? H2F(static_cast<const uint16_t*>(p.src[m])[at])
                                : static_cast<const float*>(p.src[m])[at];
      bad |= !(fabsf(x) <= 65504.0f);
      tile[e] = x;
    }
    if (ctx.SyncOr(bad)) {
      if (tid == 0 && p.status != nullptr)
        ctx.AtomicOr(&p.status[slot], is_k ? kStatusBadKeys : kStatusBadValues);
      return;
    }
  }
  if (p.rotate) FwhtRows(ctx, tile, g, d);

  uint8_t* rec = p.dst + static_cast<size_t>(slot) * p.record_bytes;
  if (!p.quantize) {  // fp16 preset: keys then values, binary16 [G][D]
    uint16_t* out = reinterpret_cast<uint16_t*>(rec) + static_cast<size_t>(m) * n;
    for (int e = tid; e < n; e += nt) out[e] = FloatToHalf(tile[e]);
    return;
  }

  // The spec's first-updated ("column") axis: tokens for K, channels for V.
  const bool tok_first = is_k;
  const int n_col = is_k ? g : d, n_row = is_k ? d : g;
  float* l_col = is_k ? l_tok : l_ch;
  float* e_col = is_k ? e_tok : e_ch;
  float* std_col = is_k ? std_tok : std_ch;
  float* best_col = is_k ? best_tok : best_ch;
  float* l_row = is_k ? l_ch : l_tok;
  float* e_row = is_k ? e_ch : e_tok;
  float* std_row = is_k ? std_ch : std_tok;
  float* best_row = is_k ? best_ch : best_tok;

  for (int i = tid; i < g; i += nt) e_tok[i] = 1.0f, l_tok[i] = 0.0f, best_tok[i] = 1.0f;
  for (int i = tid; i < d; i += nt) e_ch[i] = 1.0f, l_ch[i] = 0.0f, best_ch[i] = 1.0f;
  ctx.Sync();

  if (p.balance) {
    const bool mat = p.plan.materialize != 0;
    // cur = t / exp(Lc) / exp(Lr): column scale first, as in the reference's Rescale().
    const auto scaled = [&](int tok, int ch) {
      const float x = tile[(tok << dshift) + ch];
      return tok_first ? (x / e_tok[tok]) / e_ch[ch] : (x / e_ch[ch]) / e_tok[tok];
    };
    const auto cur = [&](int tok, int ch) {
      return mat ? curbuf[(tok << dshift) + ch] : scaled(tok, ch);
    };
    const auto materialize = [&]() {
      if (!mat) return;
      for (int e = tid; e < n; e += nt) curbuf[e] = scaled(e >> dshift, e & (d - 1));
      ctx.Sync();
    };
    const auto both_stds = [&]() {
      encode_detail::AxisStds(ctx, /*per_token=*/true, g, d, part, mean_tok, std_tok, cur);
      encode_detail::AxisStds(ctx, /*per_token=*/false, g, d, part, mean_ch, std_ch, cur);
    };
    float* red = reinterpret_cast<float*>(part);

    materialize();
    both_stds();
    float best = encode_detail::Imbalance(ctx, std_col, n_col, std_row, n_row, red);
    for (int it = 0; it < p.iterations; ++it) {
      for (int i = tid; i < n_col; i += nt) {
        l_col[i] = ClampLogScale(l_col[i] + LogF(ClampF(std_col[i], kStdMin, kStdMax)));
        e_col[i] = ExpF(l_col[i]);
      }
      ctx.Sync();
      materialize();
      encode_detail::AxisStds(ctx, /*per_token=*/!is_k, g, d, part, is_k ? mean_ch : mean_tok,
                              std_row, cur);
      for (int i = tid; i < n_row; i += nt) {
        l_row[i] = ClampLogScale(l_row[i] + LogF(ClampF(std_row[i], kStdMin, kStdMax)));
        e_row[i] = ExpF(l_row[i]);
      }
      ctx.Sync();
      materialize();
      both_stds();
      const float imb = encode_detail::Imbalance(ctx, std_col, n_col, std_row, n_row, red);
      if (imb <= best) {  // same decision in every thread
        best = imb;
        for (int i = tid; i < n_col; i += nt) best_col[i] = e_col[i];
        for (int i = tid; i < n_row; i += nt) best_row[i] = e_row[i];
      }
    }
    ctx.Sync();
  }

  // §4: B = T / Sc* / Sr*, RTN per row of the spec's matrix (channels for K, tokens for V).
  const auto balanced = [&](int tok, int ch) {
    const float x = tile[(tok << dshift) + ch];
    return tok_first ? (x / best_tok[tok]) / best_ch[ch] : (x / best_ch[ch]) / best_tok[tok];
  };
  const int bits = is_k ? p.kbits : p.vbits;
  {
    MinMax* mm = reinterpret_cast<MinMax*>(part);
    const MinMax init{INFINITY, -INFINITY};
    const auto value = [&](int tok, int ch) {
      const float x = balanced(tok, ch);
      return MinMax{x, x};
    };
    const auto fold = [](MinMax a, MinMax b) {
      return MinMax{fminf(a.lo, b.lo), fmaxf(a.hi, b.hi)};
    };
    const auto finish = [&](int i, MinMax r) {
      lo_s[i] = r.lo;
      step_s[i] = QuantStep(r.lo, r.hi, bits);
    };
    if (is_k) {
      encode_detail::ReducePerChannel<MinMax>(ctx, g, d, mm, init, value, fold, finish);
    } else {
      encode_detail::ReducePerToken<MinMax>(ctx, g, d, mm, init, value, fold, finish);
    }
  }

  int range_bad = 0;
  {
    const size_t a_off = is_k ? p.rl.k_a : p.rl.v_a;
    const size_t b_off = is_k ? p.rl.k_b : p.rl.v_b;
    const size_t s_off = is_k ? p.rl.k_r : p.rl.v_c;
    for (int i = tid; i < n_row; i += nt) {
      const uint16_t a = FloatToHalf(best_row[i] * step_s[i]);
      const uint16_t b = FloatToHalf(best_row[i] * lo_s[i]);
      range_bad |= !encode_detail::HalfIsFinite(a) || !encode_detail::HalfIsFinite(b);
      encode_detail::PutHalf(rec, a_off, i, a);
      encode_detail::PutHalf(rec, b_off, i, b);
    }
    for (int i = tid; i < n_col; i += nt) {
      const uint16_t s = FloatToHalf(best_col[i]);
      range_bad |= !encode_detail::HalfIsFinite(s);
      encode_detail::PutHalf(rec, s_off, i, s);
    }
  }

  // §5 packing: code i of a row in byte i / per at bit (i % per) * bits.
  const int per = 8 / bits;
  if (is_k) {  // channel-major [D][G/per]; consecutive threads take consecutive channels
    const int row_bytes = g / per;
    uint8_t* codes = rec + p.rl.k_codes;
    for (int bi = tid; bi < d * row_bytes; bi += nt) {
      const int ch = bi & (d - 1), k = bi >> dshift;
      unsigned byte = 0;
      for (int j = 0; j < per; ++j) {
        const int tok = k * per + j;
        byte |= static_cast<unsigned>(QuantizeCode(balanced(tok, ch), lo_s[ch], step_s[ch], bits))
                << (j * bits);
      }
      codes[static_cast<size_t>(ch) * row_bytes + k] = static_cast<uint8_t>(byte);
    }
  } else {  // token-major [G][D/per]
    const int row_bytes = d / per;
    uint8_t* codes = rec + p.rl.v_codes;
    for (int bi = tid; bi < g * row_bytes; bi += nt) {
      const int tok = bi / row_bytes, k = bi - tok * row_bytes;
      unsigned byte = 0;
      for (int j = 0; j < per; ++j) {
        const int ch = k * per + j;
        byte |= static_cast<unsigned>(QuantizeCode(balanced(tok, ch), lo_s[tok], step_s[tok], bits))
                << (j * bits);
      }
      codes[bi] = static_cast<uint8_t>(byte);
    }
  }
  if (ctx.SyncOr(range_bad) && tid == 0 && p.status != nullptr) {
    ctx.AtomicOr(&p.status[slot], is_k ? kStatusKeyScaleRange : kStatusValueScaleRange);
  }
}

}  // namespace kvarn::cuda

#endif  // KVARN_KERNELS_CUDA_ENCODE_BODY_H_
