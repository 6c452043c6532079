// Body of fused decode attention (KVARN_SPEC.md §7) over block tables, and of the split-K
// combine. Shared by kernels/cuda/attend.cu and the host block emulator.
//
// One thread block serves one (sequence, kv-head, head chunk, split): up to HC query heads of
// the kv-head's group (all of them whenever the group fits, so each tile is read once per
// kv-head), and a contiguous range of the sequence's units (sink, tiles..., tail). Per
// quantized tile: the record is copied to shared memory once; scores are folded from the
// codes (w = q·a_K, β = Σ q·b_K, s = r_K·(Σ_d w·qK + β)); an online-softmax update per head;
// values accumulate Σ_t p·a_V·qV and Σ_t p·b_V, scaled by c_V. fp16 parts are processed in
// chunks of tokens. Accumulators are fp32 in shared memory, in the rotated frame; the output
// is multiplied by H once at the end (in the combine kernel for split-K).
#ifndef KVARN_KERNELS_CUDA_ATTEND_BODY_H_
#define KVARN_KERNELS_CUDA_ATTEND_BODY_H_

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/block_layout.h"
#include "kernels/cuda/block_ops.h"
#include "kernels/cuda/kernel_types.h"
#include "kernels/kvarn_math.h"

namespace kvarn::cuda {

inline constexpr int kAttendThreads = 128;
inline constexpr int kCombineThreads = 128;
inline constexpr int kMaxHeadChunk = 16;

// Tokens of an fp16 part handled per pass.
KVARN_HD inline int AttendFp16ChunkTokens(int d) { return 2048 / d > 8 ? 2048 / d : 8; }

struct AttendPlan {
  int tc = 0;  // fp16 tokens per pass
  size_t q = 0, w = 0, acc = 0, sc = 0, pa = 0, spart = 0, scal = 0, small = 0, buf = 0;
  size_t smem_bytes = 0;
};

// Shared memory of one block serving `hc` query heads.
KVARN_HD inline AttendPlan PlanAttend(int hc, int g, int d, size_t record_bytes, int threads) {
  AttendPlan p;
  p.tc = AttendFp16ChunkTokens(d);
  const size_t f = sizeof(float);
  const size_t hd = static_cast<size_t>(hc) * d, hg = static_cast<size_t>(hc) * g;
  const size_t fp16_chunk =
      (static_cast<size_t>(d) * (p.tc + 1) + static_cast<size_t>(p.tc) * d) * f;
  size_t off = 0;
  const auto take = [&off](size_t bytes) {
    const size_t at = off;
    off += AlignUp16(bytes);
    return at;
  };
  p.q = take(hd * f);
  p.w = take(hd * f);  // [D][HC]: q·a_K for a tile, or q itself for an fp16 part
  p.acc = take(hd * f);
  p.sc = take(hg * f);
  p.pa = take(hg * f);  // [G][HC]: p·a_V (tiles) or p (fp16 parts)
  p.spart = take(static_cast<size_t>(threads) * hc * f);
  p.scal = take((3 * static_cast<size_t>(d) + 3 * static_cast<size_t>(g)) * f);
  p.small = take(5 * static_cast<size_t>(hc) * f);
  p.buf = take(record_bytes > fp16_chunk ? record_bytes : fp16_chunk);
  p.smem_bytes = off;
  return p;
}

struct AttendParams {
  const uint8_t* quant_pool = nullptr;  // quantized block b at quant_pool + b * quant_block_bytes
  size_t quant_block_bytes = 0;
  int64_t num_quant_blocks = 0;
  const uint8_t* fp16_pool = nullptr;  // fp16 block b at fp16_pool + b * fp16_block_bytes
  size_t fp16_block_bytes = 0;
  int64_t num_fp16_blocks = 0;
  const AttendSequence* seqs = nullptr;
  const int32_t* tile_ids = nullptr;
  int num_seqs = 0;
  BlockLayout layout;
  RecordLayout rl;
  int layer = 0;
  int group = 0;   // query heads per kv-head
  int chunks = 0;  // head chunks per kv-head (ceil(group / HC))
  int kbits = 0, vbits = 0;
  int quantized = 0;  // 0: the fp16 preset (records are fp16 K then V)
  int rotates = 0;
  const float* queries = nullptr;  // [num_seqs][Hq][D], original frame
  float* out = nullptr;            // [num_seqs][Hq][D], original frame
  float* lse = nullptr;            // [num_seqs][Hq] or null
  float scale = 0.0f;
  int num_splits = 1;
  float* partials = nullptr;  // [num_seqs][Hq][num_splits][D + 2]: max, sum, acc (split-K only)
  int32_t* status = nullptr;  // [num_seqs] or null
  AttendPlan plan;
};

namespace attend_detail {

// A code (< 2^23) as a float without an int-to-float conversion: 2^23 + c, minus 2^23.
KVARN_DEV float CodeToFloat(unsigned code) { return BitsToFloat(0x4B000000u | code) - 8388608.0f; }

// acc[h] += v[h] * x for the HC head-contiguous floats at v (16-byte aligned for HC >= 4,
// 8-byte for HC == 2): one vector load feeds several multiply-adds.
template <int HC>
KVARN_DEV void AxpyHeads(float (&acc)[HC], const float* v, float x) {
#if defined(__CUDA_ARCH__)
  if constexpr (HC >= 4) {
    for (int h = 0; h < HC; h += 4) {
      const float4 f = *reinterpret_cast<const float4*>(v + h);
      acc[h] += f.x * x;
      acc[h + 1] += f.y * x;
      acc[h + 2] += f.z * x;
      acc[h + 3] += f.w * x;
    }
  } else if constexpr (HC == 2) {
    const float2 f = *reinterpret_cast<const float2*>(v);
    acc[0] += f.x * x;
    acc[1] += f.y * x;
  } else {
    acc[0] += v[0] * x;
  }
#else
  for (int h = 0; h < HC; ++h) acc[h] += v[h] * x;
#endif
}

// Pointers into one block's shared memory.
template <int HC>
struct Smem {
  float *q, *w, *acc, *sc, *pa, *spart;
  float *ak, *bk, *cv, *rk, *av, *bv;
  float *mx, *sum, *resc, *beta, *bsum;
  unsigned char* buf;
  KVARN_DEV Smem(const AttendPlan& p, unsigned char* s, int g, int d) {
    q = reinterpret_cast<float*>(s + p.q);
    w = reinterpret_cast<float*>(s + p.w);
    acc = reinterpret_cast<float*>(s + p.acc);
    sc = reinterpret_cast<float*>(s + p.sc);
    pa = reinterpret_cast<float*>(s + p.pa);
    spart = reinterpret_cast<float*>(s + p.spart);
    ak = reinterpret_cast<float*>(s + p.scal);
    bk = ak + d;
    cv = bk + d;
    rk = cv + d;
    av = rk + g;
    bv = av + g;
    mx = reinterpret_cast<float*>(s + p.small);
    sum = mx + HC;
    resc = sum + HC;
    beta = resc + HC;
    bsum = beta + HC;
    buf = s + p.buf;
  }
};

// Online-softmax update of every head over `width` scores sc[h][0..width) (row stride g):
// sum and max are updated and resc holds the factor for earlier accumulators; pa[t][h] gets
// p = exp(s - max_new), times a_V[t] for quantized tiles (a_v/b_v given), which also get
// bsum = Σ p·b_V. One warp per head. Ends with a barrier.
template <int HC, class Ctx>
KVARN_DEV_FORCEINLINE void SoftmaxUpdate(const Ctx& ctx, const Smem<HC>& s, int g, int width,
                                         const float* a_v, const float* b_v) {
  const int lane = ctx.lane();
  for (int hb = 0; hb < HC; hb += ctx.nwarps()) {
    const int h = hb + ctx.warp();
    const bool active = h < HC;
    const float* row = s.sc + static_cast<size_t>(active ? h : 0) * g;
    float m_chunk = -INFINITY;
    if (active) {
      for (int t = lane; t < width; t += 32) m_chunk = fmaxf(m_chunk, row[t]);
    }
    m_chunk = WarpAllMax(ctx, m_chunk);
    const float m_old = active ? s.mx[h] : 0.0f;
    const float m_new = fmaxf(m_old, m_chunk);
    const float resc = expf(m_old - m_new);
    float psum = 0.0f, pbsum = 0.0f;
    if (active) {
      for (int t = lane; t < width; t += 32) {
        const float pv = expf(row[t] - m_new);
        psum += pv;
        if (a_v != nullptr) {
          s.pa[t * HC + h] = pv * a_v[t];
          pbsum += pv * b_v[t];
        } else {
          s.pa[t * HC + h] = pv;
        }
      }
    }
    psum = WarpAllSum(ctx, psum);
    pbsum = WarpAllSum(ctx, pbsum);
    ctx.SyncWarp();  // every lane has read mx[h] before lane 0 replaces it
    if (active && lane == 0) {
      s.mx[h] = m_new;
      s.sum[h] = s.sum[h] * resc + psum;
      s.resc[h] = resc;
      s.bsum[h] = pbsum;
    }
  }
  ctx.Sync();
}

// One quantized record (already validated id) at `rec` in global memory.
template <int HC, class Ctx>
KVARN_DEV_FORCEINLINE void QuantTile(const Ctx& ctx, const AttendParams& p, const Smem<HC>& s,
                                     const uint8_t* rec) {
  const int g = p.layout.tile_tokens, d = p.layout.head_dim;
  const int nt = ctx.nthreads(), tid = ctx.tid();
  CopyToShared(ctx, s.buf, rec, p.layout.record_bytes);
  ctx.Sync();
  const uint16_t* r16 = reinterpret_cast<const uint16_t*>(s.buf);
  for (int i = tid; i < d; i += nt) {
    s.ak[i] = H2F(r16[p.rl.k_a / 2 + i]);
    s.bk[i] = H2F(r16[p.rl.k_b / 2 + i]);
    s.cv[i] = H2F(r16[p.rl.v_c / 2 + i]);
  }
  for (int i = tid; i < g; i += nt) {
    s.rk[i] = H2F(r16[p.rl.k_r / 2 + i]);
    s.av[i] = H2F(r16[p.rl.v_a / 2 + i]);
    s.bv[i] = H2F(r16[p.rl.v_b / 2 + i]);
  }
  ctx.Sync();
  for (int e = tid; e < HC * d; e += nt) {  // w[c][h] = q[h][c]·a_K[c]
    const int c = e / HC, h = e - c * HC;
    s.w[e] = s.q[h * d + c] * s.ak[c];
  }
  for (int hb = 0; hb < HC; hb += ctx.nwarps()) {  // β[h] = Σ_d q[h][d]·b_K[d], one warp per head
    const int h = hb + ctx.warp();
    float part = 0.0f;
    if (h < HC) {
      for (int c = ctx.lane(); c < d; c += 32) part += s.q[h * d + c] * s.bk[c];
    }
    part = WarpAllSum(ctx, part);
    if (h < HC && ctx.lane() == 0) s.beta[h] = part;
  }
  ctx.Sync();

  // Scores: thread (token t, part) sums over its share of the channels for all HC heads.
  {
    const int parts = nt / g, t = tid % g, part = tid / g;
    const int len = d / parts, c0 = part * len;
    const int k_row = g * p.kbits / 8, per = 8 / p.kbits;
    const int shift = (t % per) * p.kbits;  // §5: token t of a channel row
    const unsigned mask = (1u << p.kbits) - 1u;
    const uint8_t* kc = s.buf + p.rl.k_codes + t / per;
    float a[HC];
    for (int h = 0; h < HC; ++h) a[h] = 0.0f;
    for (int c = c0; c < c0 + len; ++c) {
      AxpyHeads<HC>(a, s.w + c * HC, CodeToFloat((kc[c * k_row] >> shift) & mask));
    }
    for (int h = 0; h < HC; ++h) s.spart[(part * HC + h) * g + t] = a[h];
    ctx.Sync();
    for (int e = tid; e < HC * g; e += nt) {
      const int h = e / g, tt = e - h * g;
      float dot = 0.0f;
      for (int q = 0; q < parts; ++q) dot += s.spart[(q * HC + h) * g + tt];
      s.sc[e] = s.rk[tt] * (dot + s.beta[h]) * p.scale;
    }
    ctx.Sync();
  }
  SoftmaxUpdate(ctx, s, g, g, s.av, s.bv);

  // Values: thread per channel, Σ_t p·a_V·qV for all HC heads, then the accumulator update.
  {
    const int v_row = d * p.vbits / 8, per = 8 / p.vbits;
    const unsigned mask = (1u << p.vbits) - 1u;
    for (int c = tid; c < d; c += nt) {
      const int shift = (c % per) * p.vbits;  // §5: channel c of a token row
      const uint8_t* vc = s.buf + p.rl.v_codes + c / per;
      float v[HC];
      for (int h = 0; h < HC; ++h) v[h] = 0.0f;
      for (int t = 0; t < g; ++t)
        AxpyHeads<HC>(v, s.pa + t * HC, CodeToFloat((vc[t * v_row] >> shift) & mask));
      for (int h = 0; h < HC; ++h) {
        float& acc = s.acc[h * d + c];
        acc = acc * s.resc[h] + (v[h] + s.bsum[h]) * s.cv[c];
      }
    }
  }
  ctx.Sync();
}

// `tokens` fp16 tokens, keys and values binary16 in global memory, rows of D `stride`
// elements apart (a pool block's fp16_token_elems(); D for a record).
template <int HC, class Ctx>
KVARN_DEV_FORCEINLINE void Fp16Run(const Ctx& ctx, const AttendParams& p, const Smem<HC>& s,
                                   const uint16_t* keys, const uint16_t* values, int tokens,
                                   size_t stride) {
  const int g = p.layout.tile_tokens, d = p.layout.head_dim, tc = p.plan.tc;
  const int nt = ctx.nthreads(), tid = ctx.tid();
  int dshift = 0;
  while ((1 << dshift) < d) ++dshift;
  float* kt =
      reinterpret_cast<float*>(s.buf);  // [D][tc + 1], transposed so token reads are contiguous
  float* vs = kt + static_cast<size_t>(d) * (tc + 1);  // [tc][D]
  for (int e = tid; e < HC * d; e += nt) {             // w[c][h] = q[h][c]
    const int c = e / HC, h = e - c * HC;
    s.w[e] = s.q[h * d + c];
  }
  for (int t0 = 0; t0 < tokens; t0 += tc) {
    const int n = tokens - t0 < tc ? tokens - t0 : tc;
    for (int e = tid; e < tc * d; e += nt) {
      const int t = e >> dshift, c = e & (d - 1);
      const size_t i = static_cast<size_t>(t0 + t) * stride + c;
      kt[c * (tc + 1) + t] = t < n ? H2F(keys[i]) : 0.0f;
      vs[e] = t < n ? H2F(values[i]) : 0.0f;
    }
    ctx.Sync();
    {
      const int parts = nt / tc, t = tid % tc, part = tid / tc;
      const int len = d / parts, c0 = part * len;
      float a[HC];
      for (int h = 0; h < HC; ++h) a[h] = 0.0f;
      for (int c = c0; c < c0 + len; ++c) AxpyHeads<HC>(a, s.w + c * HC, kt[c * (tc + 1) + t]);
      for (int h = 0; h < HC; ++h) s.spart[(part * HC + h) * tc + t] = a[h];
      ctx.Sync();
      for (int e = tid; e < HC * tc; e += nt) {
        const int h = e / tc, tt = e - h * tc;
        float dot = 0.0f;
        for (int q = 0; q < parts; ++q) dot += s.spart[(q * HC + h) * tc + tt];
        s.sc[h * g + tt] = tt < n ? dot * p.scale : -INFINITY;
      }
      ctx.Sync();
    }
    SoftmaxUpdate<HC>(ctx, s, g, tc, nullptr, nullptr);
    for (int c = tid; c < d; c += nt) {
      float v[HC];
      for (int h = 0; h < HC; ++h) v[h] = 0.0f;
      for (int t = 0; t < n; ++t) AxpyHeads<HC>(v, s.pa + t * HC, vs[t * d + c]);
      for (int h = 0; h < HC; ++h) {
        float& acc = s.acc[h * d + c];
        acc = acc * s.resc[h] + v[h];
      }
    }
    ctx.Sync();
  }
}

}  // namespace attend_detail

// Serves query heads [chunk * HC, ...) of kv-head `kvh`'s group in sequence `seq`, over split
// `split` of its units.
template <int HC, class Ctx>
KVARN_DEV void AttendBlock(const Ctx& ctx, const AttendParams& p, int split, int kv_chunk, int seq,
                           unsigned char* smem) {
  using attend_detail::Smem;
  const int g = p.layout.tile_tokens, d = p.layout.head_dim;
  const int nt = ctx.nthreads(), tid = ctx.tid();
  const int kvh = kv_chunk / p.chunks, chunk = kv_chunk - kvh * p.chunks;
  const int hq = p.layout.num_kv_heads * p.group;
  const int h0 = kvh * p.group + chunk * HC;
  const int nh = p.group - chunk * HC < HC ? p.group - chunk * HC : HC;
  const Smem<HC> s(p.plan, smem, g, d);

  const AttendSequence seqd = p.seqs[seq];
  const bool has_sink = seqd.sink_tokens > 0, has_tail = seqd.tail_tokens > 0;
  const bool valid = seqd.sink_tokens >= 0 && seqd.sink_tokens <= g && seqd.tail_tokens >= 0 &&
                     seqd.tail_tokens <= g && seqd.num_tiles >= 0 && seqd.first_tile >= 0 &&
                     (has_sink || has_tail || seqd.num_tiles > 0);
  const int units =
      valid ? static_cast<int>(has_sink) + seqd.num_tiles + static_cast<int>(has_tail) : 0;
  if (!valid && split == 0 && kv_chunk == 0 && tid == 0 && p.status != nullptr) {
    ctx.AtomicOr(&p.status[seq], kAttendBadSequence);
  }
  const int u_begin = static_cast<int>(static_cast<int64_t>(units) * split / p.num_splits);
  const int u_end = static_cast<int>(static_cast<int64_t>(units) * (split + 1) / p.num_splits);

  for (int e = tid; e < HC * d; e += nt) {
    const int h = e / d, c = e - h * d;
    s.q[e] = h < nh ? p.queries[(static_cast<size_t>(seq) * hq + h0 + h) * d + c] : 0.0f;
    s.acc[e] = 0.0f;
  }
  for (int h = tid; h < HC; h += nt) s.mx[h] = -INFINITY, s.sum[h] = 0.0f;
  ctx.Sync();
  if (p.rotates) FwhtRows(ctx, s.q, HC, d);

  const size_t rec_off = p.layout.RecordOffset(p.layer, kvh);
  const size_t k_off = p.layout.Fp16KeysOffset(p.layer, kvh),
               v_off = p.layout.Fp16ValuesOffset(p.layer, kvh);
  const auto bad_id = [&]() {
    if (tid == 0 && p.status != nullptr) ctx.AtomicOr(&p.status[seq], kAttendBadBlockId);
  };
  for (int u = u_begin; u < u_end; ++u) {
    const bool is_sink = has_sink && u == 0, is_tail = has_tail && u == units - 1;
    if (is_sink || is_tail) {
      const int32_t id = is_sink ? seqd.sink_block : seqd.tail_block;
      if (id < 0 || id >= p.num_fp16_blocks) {
        bad_id();
        continue;
      }
      const uint8_t* blk = p.fp16_pool + static_cast<size_t>(id) * p.fp16_block_bytes;
      attend_detail::Fp16Run<HC>(ctx, p, s, reinterpret_cast<const uint16_t*>(blk + k_off),
                                 reinterpret_cast<const uint16_t*>(blk + v_off),
                                 is_sink ? seqd.sink_tokens : seqd.tail_tokens,
                                 p.layout.fp16_token_elems());
      continue;
    }
    const int32_t id = p.tile_ids[seqd.first_tile + u - static_cast<int>(has_sink)];
    if (id < 0 || id >= p.num_quant_blocks) {
      bad_id();
      continue;
    }
    const uint8_t* rec = p.quant_pool + static_cast<size_t>(id) * p.quant_block_bytes + rec_off;
    if (p.quantized) {
      attend_detail::QuantTile<HC>(ctx, p, s, rec);
    } else {
      const uint16_t* k = reinterpret_cast<const uint16_t*>(rec);
      attend_detail::Fp16Run<HC>(ctx, p, s, k, k + static_cast<size_t>(g) * d, g,
                                 static_cast<size_t>(d));
    }
  }

  if (p.num_splits > 1) {  // partial state; the combine kernel finishes
    const int row = d + 2;
    for (int e = tid; e < HC * row; e += nt) {
      const int h = e / row, j = e - h * row;
      if (h >= nh) continue;
      const float v = j == 0 ? s.mx[h] : j == 1 ? s.sum[h] : s.acc[h * d + j - 2];
      p.partials[((static_cast<size_t>(seq) * hq + h0 + h) * p.num_splits + split) * row + j] = v;
    }
    return;
  }
  for (int e = tid; e < HC * d; e += nt) {
    const float l = s.sum[e / d];
    s.w[e] = l > 0.0f ? s.acc[e] / l : 0.0f;
  }
  if (p.lse != nullptr) {
    for (int h = tid; h < nh; h += nt) {
      p.lse[static_cast<size_t>(seq) * hq + h0 + h] =
          s.sum[h] > 0.0f ? s.mx[h] + logf(s.sum[h]) : -INFINITY;
    }
  }
  ctx.Sync();
  if (p.rotates) FwhtRows(ctx, s.w, HC, d);
  for (int e = tid; e < nh * d; e += nt)
    p.out[(static_cast<size_t>(seq) * hq + h0) * d + e] = s.w[e];
}

struct CombineParams {
  const float* partials = nullptr;  // [rows][num_splits][D + 2]
  float* out = nullptr;             // [rows][D]
  float* lse = nullptr;             // [rows] or null
  int num_splits = 0;
  int d = 0;
  int rotates = 0;
};

KVARN_HD inline size_t CombineSmemBytes(int d) {
  return AlignUp16(static_cast<size_t>(d) * sizeof(float));
}

// Log-sum-exp merge of the split partials of output row `row` (= seq * Hq + query head).
template <class Ctx>
KVARN_DEV void CombineRow(const Ctx& ctx, const CombineParams& p, int row, unsigned char* smem) {
  const int d = p.d, ns = p.num_splits, stride = d + 2;
  const float* base = p.partials + static_cast<size_t>(row) * ns * stride;
  float* o = reinterpret_cast<float*>(smem);
  ctx.Sync();
  float m = -INFINITY;
  for (int k = 0; k < ns; ++k) {
    if (base[k * stride + 1] > 0.0f) m = fmaxf(m, base[k * stride]);
  }
  float l = 0.0f;
  for (int k = 0; k < ns; ++k) {
    const float lk = base[k * stride + 1];
    if (lk > 0.0f) l += lk * expf(base[k * stride] - m);
  }
  if (p.lse != nullptr && ctx.tid() == 0) p.lse[row] = l > 0.0f ? m + logf(l) : -INFINITY;
  for (int c = ctx.tid(); c < d; c += ctx.nthreads()) {
    float acc = 0.0f;
    for (int k = 0; k < ns; ++k) {
      if (base[k * stride + 1] > 0.0f) acc += base[k * stride + 2 + c] * expf(base[k * stride] - m);
    }
    o[c] = l > 0.0f ? acc / l : 0.0f;
  }
  ctx.Sync();
  if (p.rotates) FwhtRows(ctx, o, 1, d);
  for (int c = ctx.tid(); c < d; c += ctx.nthreads())
    p.out[static_cast<size_t>(row) * d + c] = o[c];
}

}  // namespace kvarn::cuda

#endif  // KVARN_KERNELS_CUDA_ATTEND_BODY_H_
