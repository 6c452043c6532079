// Bodies of the decode kernel (record -> K/V tile) and the store kernel (new tokens'
// original-frame K/V -> rotated fp16 in a tail block). Shared by kernels/cuda/decode_store.cu
// and the host block emulator. Same arithmetic as the CPU (kernels/reference.cc and
// FwhtInPlace + FloatToHalf), compiled with -fmad=false, so the outputs are bit-identical.
#ifndef KVARN_KERNELS_CUDA_DECODE_STORE_BODY_H_
#define KVARN_KERNELS_CUDA_DECODE_STORE_BODY_H_

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/block_layout.h"
#include "kernels/cuda/block_ops.h"
#include "kernels/cuda/kernel_types.h"
#include "kernels/fp16.h"
#include "kernels/kvarn_math.h"

namespace kvarn::cuda {

inline constexpr int kDecodeThreads = 256;
inline constexpr int kStoreThreads = 128;

// Tokens decoded per pass through shared memory (a multiple of rows for the transform).
KVARN_HD inline int DecodeChunkTokens(int g, int d) {
  const int t = 4096 / d;
  return t < g ? t : g;
}

struct DecodePlan {
  size_t scales = 0, chunk = 0, smem_bytes = 0;
};

KVARN_HD inline DecodePlan PlanDecode(int g, int d) {
  const size_t w = static_cast<size_t>(g > d ? g : d);
  DecodePlan p;
  p.scales = 0;
  p.chunk = AlignUp16(3 * w * sizeof(float));
  p.smem_bytes =
      p.chunk + AlignUp16(static_cast<size_t>(DecodeChunkTokens(g, d)) * d * sizeof(float));
  return p;
}

struct DecodeParams {
  const uint8_t* src = nullptr;  // record of slot s at src + s * record_bytes
  size_t record_bytes = 0;
  RecordLayout rl;
  void* dst[2] = {nullptr,
                  nullptr};  // keys, values: slot s at dst[m] + s * slot_stride elements, [G][D]
  size_t slot_stride = 0;
  int dst_f16 = 0;
  int unrotate = 0;  // write the original frame (multiply by H)
  int g = 0, d = 0, kbits = 0, vbits = 0;
  int quantize = 0;  // 0: fp16 preset record
  int num_slots = 0;
  int32_t* status = nullptr;  // [num_slots] or null
  DecodePlan plan;
};

// Decodes work item 2 * slot + (0 keys | 1 values).
template <class Ctx>
KVARN_DEV void DecodeWork(const Ctx& ctx, const DecodeParams& p, int work, unsigned char* smem) {
  const int slot = work >> 1, m = work & 1;
  const bool is_k = m == 0;
  const int g = p.g, d = p.d, nt = ctx.nthreads(), tid = ctx.tid();
  const int w = g > d ? g : d;
  int dshift = 0;
  while ((1 << dshift) < d) ++dshift;
  const uint8_t* rec = p.src + static_cast<size_t>(slot) * p.record_bytes;
  float* a_s =
      reinterpret_cast<float*>(smem + p.plan.scales);  // per group (channel for K, token for V)
  float* b_s = a_s + w;
  float* s_s = b_s + w;  // the other axis's scale
  float* buf = reinterpret_cast<float*>(smem + p.plan.chunk);

  ctx.Sync();  // the previous work item is done with shared memory
  const int n_row = is_k ? d : g, n_col = is_k ? g : d;
  if (p.quantize) {
    const uint16_t* a_h = reinterpret_cast<const uint16_t*>(rec + (is_k ? p.rl.k_a : p.rl.v_a));
    const uint16_t* b_h = reinterpret_cast<const uint16_t*>(rec + (is_k ? p.rl.k_b : p.rl.v_b));
    const uint16_t* s_h = reinterpret_cast<const uint16_t*>(rec + (is_k ? p.rl.k_r : p.rl.v_c));
    int bad = 0;
    for (int i = tid; i < n_row; i += nt) {
      bad |= (a_h[i] & 0x7C00u) == 0x7C00u || (b_h[i] & 0x7C00u) == 0x7C00u;
      a_s[i] = HalfToFloat(a_h[i]);
      b_s[i] = HalfToFloat(b_h[i]);
    }
    for (int i = tid; i < n_col; i += nt) {
      bad |= (s_h[i] & 0x7C00u) == 0x7C00u;
      s_s[i] = HalfToFloat(s_h[i]);
    }
    if (ctx.SyncOr(bad)) {
      if (tid == 0 && p.status != nullptr) ctx.AtomicOr(&p.status[slot], kDecodeCorruptRecord);
      return;
    }
  }

  const int chunk = DecodeChunkTokens(g, d);
  const int n_chunk = chunk * d;
  const uint8_t* codes = rec + (is_k ? p.rl.k_codes : p.rl.v_codes);
  const int k_row = g * p.kbits / 8, v_row = d * p.vbits / 8;
  const uint16_t* f16 = reinterpret_cast<const uint16_t*>(rec) + static_cast<size_t>(m) * g * d;
  const size_t out_base = static_cast<size_t>(slot) * p.slot_stride;
  for (int tok0 = 0; tok0 < g; tok0 += chunk) {
    for (int e = tid; e < n_chunk; e += nt) {
      const int tok = tok0 + (e >> dshift), ch = e & (d - 1);
      float x;
      if (!p.quantize) {
        x = HalfToFloat(f16[(tok << dshift) + ch]);
      } else if (is_k) {
        x = DequantKey(UnpackCode(codes + static_cast<size_t>(ch) * k_row, tok, p.kbits), a_s[ch],
                       b_s[ch], s_s[tok]);
      } else {
        x = DequantValue(UnpackCode(codes + static_cast<size_t>(tok) * v_row, ch, p.vbits),
                         a_s[tok], b_s[tok], s_s[ch]);
      }
      buf[e] = x;
    }
    ctx.Sync();
    if (p.unrotate) FwhtRows(ctx, buf, chunk, d);
    const size_t o = out_base + (static_cast<size_t>(tok0) << dshift);
    if (p.dst_f16) {
      uint16_t* out = static_cast<uint16_t*>(p.dst[m]) + o;
      for (int e = tid; e < n_chunk; e += nt) out[e] = FloatToHalf(buf[e]);
    } else {
      float* out = static_cast<float*>(p.dst[m]) + o;
      for (int e = tid; e < n_chunk; e += nt) out[e] = buf[e];
    }
    ctx.Sync();
  }
}

struct StoreParams {
  // keys, values [num_tokens][src_layers][num_kv_heads][D]
  const void* src[2] = {nullptr, nullptr};
  int src_f16 = 0;
  int num_tokens = 0;
  int rotate = 0;
  BlockLayout layout;
  int layer = 0;       // the layer of a one-layer source, or -1: the source holds every layer
  int src_layers = 1;  // 1, or layout.num_layers when layer == -1
  int token_offset = 0;
  uint16_t* dst = nullptr;    // the fp16 block
  int32_t* status = nullptr;  // [num_tokens] or null
};

KVARN_HD inline size_t StoreSmemBytes(int d) {
  return AlignUp16(2 * static_cast<size_t>(d) * sizeof(float));
}

// Stores work item (token * src_layers + source layer) * num_kv_heads + head: one K and one V
// vector, rotated, as binary16.
template <class Ctx>
KVARN_DEV void StoreWork(const Ctx& ctx, const StoreParams& p, int work, unsigned char* smem) {
  const int heads = p.layout.num_kv_heads, d = p.layout.head_dim;
  const int per_token = p.src_layers * heads;
  const int token = work / per_token;
  const int layer_head = work - token * per_token;
  const int src_layer = layer_head / heads, head = layer_head - src_layer * heads;
  const int layer = p.layer >= 0 ? p.layer : src_layer;
  const int nt = ctx.nthreads(), tid = ctx.tid();
  float* buf = reinterpret_cast<float*>(smem);  // [2][D]: keys, values
  ctx.Sync();
  const size_t src = static_cast<size_t>(work) * d;
  int bad = 0;
  for (int e = tid; e < 2 * d; e += nt) {
    const int m = e >= d;
    const size_t i = src + static_cast<size_t>(e - m * d);
    const float x = p.src_f16 ? H2F(static_cast<const uint16_t*>(p.src[m])[i])
                              : static_cast<const float*>(p.src[m])[i];
    bad |= !(fabsf(x) <= 65504.0f);
    buf[e] = x;
  }
  if (ctx.SyncOr(bad)) {
    if (tid == 0 && p.status != nullptr) ctx.AtomicOr(&p.status[token], kStoreBadInput);
    return;
  }
  if (p.rotate) FwhtRows(ctx, buf, 2, d);
  int overflow = 0;
  for (int e = tid; e < 2 * d; e += nt) overflow |= (FloatToHalf(buf[e]) & 0x7C00u) == 0x7C00u;
  if (ctx.SyncOr(overflow)) {
    if (tid == 0 && p.status != nullptr) ctx.AtomicOr(&p.status[token], kStoreOverflow);
    return;
  }
  const size_t row = static_cast<size_t>(p.token_offset + token) * p.layout.fp16_token_elems();
  uint16_t* k = p.dst + p.layout.Fp16KeysOffset(layer, head) / sizeof(uint16_t) + row;
  uint16_t* v = p.dst + p.layout.Fp16ValuesOffset(layer, head) / sizeof(uint16_t) + row;
  for (int e = tid; e < d; e += nt) {
    k[e] = FloatToHalf(buf[e]);
    v[e] = FloatToHalf(buf[d + e]);
  }
}

}  // namespace kvarn::cuda

#endif  // KVARN_KERNELS_CUDA_DECODE_STORE_BODY_H_
