#include "kernels/cuda/params.h"

#include <cmath>
#include <cstdint>
#include <string>

namespace kvarn::cuda {
namespace {

bool IsDType(DType t) { return t == DType::kF32 || t == DType::kF16; }

// The kernels access elements at their natural alignment and records with 16-byte vectors.
bool Aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

size_t ElemBytes(DType t) { return t == DType::kF32 ? 4 : 2; }

// The checks every block kernel makes of its element buffers and its pool block: all present,
// a known dtype, elements aligned to their size, the block to 16 bytes. `what` names them.
CodecStatus CheckBuffers(const void* keys, const void* values, DType dtype, const void* block,
                         const char* what) {
  if (keys == nullptr || values == nullptr || block == nullptr) {
    return InvalidArgument(std::string(what) + " needs keys, values and a block");
  }
  if (!IsDType(dtype)) return InvalidArgument("unknown dtype");
  if (!Aligned(keys, ElemBytes(dtype)) || !Aligned(values, ElemBytes(dtype)) || !Aligned(block, 16)) {
    return InvalidArgument(std::string("misaligned ") + what + " buffers (blocks need 16-byte alignment)");
  }
  return {};
}

int HeadChunkFor(int group) {
  int hc = 1;
  while (hc < group && hc < kMaxHeadChunk) hc *= 2;
  return hc;
}

}  // namespace

CodecStatus CheckLayout(const Preset& preset, const BlockLayout& layout) {
  Preset parsed;
  KVARN_RETURN_IF_ERROR(ParsePreset(preset.Name(), &parsed));
  if (!(parsed == preset)) return InvalidArgument("malformed preset " + preset.Name());
  KVARN_RETURN_IF_ERROR(CheckHeadDim(layout.head_dim));
  if (layout.num_layers < 1 || layout.num_kv_heads < 1) {
    return InvalidArgument("layout needs at least one layer and one kv-head");
  }
  if (layout.tile_tokens != preset.tile_tokens) {
    return InvalidArgument("layout has " + std::to_string(layout.tile_tokens) + "-token tiles; " +
                           preset.Name() + " has " + std::to_string(preset.tile_tokens));
  }
  if (layout.record_bytes != preset.RecordBytes(layout.head_dim)) {
    return InvalidArgument("layout record_bytes " + std::to_string(layout.record_bytes) +
                           " != " + std::to_string(preset.RecordBytes(layout.head_dim)) + " of " +
                           preset.Name());
  }
  return {};
}

CodecStatus BuildEncode(const Preset& preset, const BlockLayout& layout, const TileSource& in,
                        uint8_t* quant_block, int32_t* status, int iterations,
                        const DeviceLimits& limits, EncodeLaunch* out) {
  KVARN_RETURN_IF_ERROR(CheckLayout(preset, layout));
  KVARN_RETURN_IF_ERROR(CheckBuffers(in.keys, in.values, in.dtype, quant_block, "encode"));
  const size_t n = layout.tile_elems(), d = static_cast<size_t>(layout.head_dim);
  const size_t row_stride = in.row_stride != 0 ? in.row_stride : d;
  if (row_stride < d) return InvalidArgument("row_stride is smaller than head_dim");
  // Contiguous tiles follow each other; interleaved tiles (a token-major block) lie side by
  // side within each row_stride.
  const bool overlap = row_stride == d ? in.slot_stride < n
                                       : in.slot_stride < d || layout.slots() * in.slot_stride > row_stride;
  if (overlap) return InvalidArgument("slot_stride and row_stride make the slots' tiles overlap");
  if (iterations < 0 || iterations > EncodeOptions::kMaxIterations) {
    return InvalidArgument("iterations must be in 0.." +
                           std::to_string(EncodeOptions::kMaxIterations));
  }
  EncodeParams& p = out->params;
  p = EncodeParams{};
  p.src[0] = in.keys;
  p.src[1] = in.values;
  p.slot_stride = in.slot_stride;
  p.row_stride = row_stride;
  p.src_f16 = in.dtype == DType::kF16;
  p.rotate = preset.rotates() && in.frame == Frame::kOriginal;
  p.dst = quant_block;
  p.record_bytes = layout.record_bytes;
  p.g = layout.tile_tokens;
  p.d = layout.head_dim;
  p.quantize = preset.quantizes();
  if (p.quantize) {
    p.rl = preset.Layout(layout.head_dim);
    p.kbits = preset.key_bits;
    p.vbits = preset.value_bits;
  }
  p.balance = preset.balances();
  p.iterations = iterations;
  p.num_slots = static_cast<int>(layout.slots());
  p.status = status;
  p.plan = PlanEncode(p.g, p.d, kEncodeThreads, limits.max_smem_per_block);
  if (p.plan.smem_bytes > limits.max_smem_per_block) {
    return CodecStatus(CodecCode::kFailedPrecondition, "device shared memory too small for encode");
  }
  const int work = 2 * p.num_slots;
  out->grid = work;
  out->scratch_bytes = 0;
  if (!p.plan.tile_in_smem) {  // persistent blocks, one global tile each
    const int resident = 2 * (limits.num_sms > 0 ? limits.num_sms : 1);
    out->grid = work < resident ? work : resident;
    out->scratch_bytes = static_cast<size_t>(out->grid) * n * sizeof(float);
  }
  return {};
}

CodecStatus BuildDecode(const Preset& preset, const BlockLayout& layout, const uint8_t* quant_block,
                        const TileSink& out_tiles, int32_t* status, DecodeLaunch* out) {
  KVARN_RETURN_IF_ERROR(CheckLayout(preset, layout));
  KVARN_RETURN_IF_ERROR(CheckBuffers(out_tiles.keys, out_tiles.values, out_tiles.dtype, quant_block, "decode"));
  if (out_tiles.slot_stride < layout.tile_elems())
    return InvalidArgument("slot_stride is smaller than one tile");
  DecodeParams& p = out->params;
  p = DecodeParams{};
  p.src = quant_block;
  p.record_bytes = layout.record_bytes;
  p.dst[0] = out_tiles.keys;
  p.dst[1] = out_tiles.values;
  p.slot_stride = out_tiles.slot_stride;
  p.dst_f16 = out_tiles.dtype == DType::kF16;
  p.unrotate = preset.rotates() && out_tiles.frame == Frame::kOriginal;
  p.g = layout.tile_tokens;
  p.d = layout.head_dim;
  p.quantize = preset.quantizes();
  if (p.quantize) {
    p.rl = preset.Layout(layout.head_dim);
    p.kbits = preset.key_bits;
    p.vbits = preset.value_bits;
  }
  p.num_slots = static_cast<int>(layout.slots());
  p.status = status;
  p.plan = PlanDecode(p.g, p.d);
  out->grid = 2 * p.num_slots;
  return {};
}

CodecStatus BuildStore(const Preset& preset, const BlockLayout& layout, const TokenSource& in,
                       int num_tokens, int layer, int token_offset, uint16_t* fp16_block,
                       int32_t* status, StoreLaunch* out) {
  KVARN_RETURN_IF_ERROR(CheckLayout(preset, layout));
  KVARN_RETURN_IF_ERROR(CheckBuffers(in.keys, in.values, in.dtype, fp16_block, "store"));
  if (layer < kAllLayers || layer >= layout.num_layers)
    return InvalidArgument("layer out of range");
  if (num_tokens < 1 || token_offset < 0 || token_offset + num_tokens > layout.tile_tokens) {
    return InvalidArgument("tokens [" + std::to_string(token_offset) + ", " +
                           std::to_string(token_offset + num_tokens) + ") do not fit a " +
                           std::to_string(layout.tile_tokens) + "-token block");
  }
  StoreParams& p = out->params;
  p = StoreParams{};
  p.src[0] = in.keys;
  p.src[1] = in.values;
  p.src_f16 = in.dtype == DType::kF16;
  p.num_tokens = num_tokens;
  p.rotate = preset.rotates();
  p.layout = layout;
  p.layer = layer;
  p.src_layers = layer == kAllLayers ? layout.num_layers : 1;
  p.token_offset = token_offset;
  p.dst = fp16_block;
  p.status = status;
  out->grid = num_tokens * p.src_layers * layout.num_kv_heads;
  out->smem_bytes = StoreSmemBytes(layout.head_dim);
  return {};
}

size_t AttendWorkspaceBytes(const BlockLayout& layout, int num_seqs, int num_q_heads,
                            int num_splits) {
  if (num_splits <= 1) return 0;
  return static_cast<size_t>(num_seqs) * static_cast<size_t>(num_q_heads) *
         static_cast<size_t>(num_splits) * (static_cast<size_t>(layout.head_dim) + 2) *
         sizeof(float);
}

CodecStatus BuildAttend(const Preset& preset, const BlockLayout& layout, const AttendArgs& a,
                        const DeviceLimits& limits, AttendLaunch* out) {
  KVARN_RETURN_IF_ERROR(CheckLayout(preset, layout));
  if (a.seqs == nullptr || a.queries == nullptr || a.out == nullptr) {
    return InvalidArgument("attention needs sequences, queries and an output buffer");
  }
  if (a.num_seqs < 1 || a.num_seqs > 65535) return InvalidArgument("num_seqs must be in 1..65535");
  if (a.layer < 0 || a.layer >= layout.num_layers) return InvalidArgument("layer out of range");
  if (a.num_q_heads < layout.num_kv_heads || a.num_q_heads % layout.num_kv_heads != 0) {
    return InvalidArgument("num_q_heads " + std::to_string(a.num_q_heads) +
                           " is not a multiple of " + std::to_string(layout.num_kv_heads) +
                           " kv-heads");
  }
  if (a.num_quant_blocks > 0 && (a.quant_pool == nullptr || a.tile_ids == nullptr)) {
    return InvalidArgument("quantized blocks without a pool or tile ids");
  }
  if (a.num_fp16_blocks > 0 && a.fp16_pool == nullptr)
    return InvalidArgument("fp16 blocks without a pool");
  if (a.num_quant_blocks < 0 || a.num_fp16_blocks < 0)
    return InvalidArgument("negative block count");
  if (!Aligned(a.quant_pool, 16) || !Aligned(a.fp16_pool, 16) || !Aligned(a.queries, 4) ||
      !Aligned(a.out, 4) || !Aligned(a.lse, 4) || !Aligned(a.seqs, 4) || !Aligned(a.tile_ids, 4) ||
      !Aligned(a.workspace, 4)) {
    return InvalidArgument("misaligned attention buffers (pools need 16-byte alignment)");
  }
  if (a.num_splits < 1 || a.num_splits > kMaxAttendSplits) {
    return InvalidArgument("num_splits must be in 1.." + std::to_string(kMaxAttendSplits));
  }
  if (!std::isfinite(a.softmax_scale) || a.softmax_scale < 0.0f) {
    return InvalidArgument("softmax_scale must be finite and >= 0");
  }
  const size_t need = AttendWorkspaceBytes(layout, a.num_seqs, a.num_q_heads, a.num_splits);
  if (need > 0 && (a.workspace == nullptr || a.workspace_bytes < need)) {
    return InvalidArgument("split-K needs a workspace of " + std::to_string(need) + " bytes");
  }
  const int group = a.num_q_heads / layout.num_kv_heads;
  const int g = layout.tile_tokens, d = layout.head_dim;
  int hc = HeadChunkFor(group);
  while (hc > 1 && PlanAttend(hc, g, d, layout.record_bytes, kAttendThreads).smem_bytes >
                       limits.max_smem_per_block) {
    hc /= 2;
  }
  const AttendPlan plan = PlanAttend(hc, g, d, layout.record_bytes, kAttendThreads);
  if (plan.smem_bytes > limits.max_smem_per_block) {
    return CodecStatus(CodecCode::kFailedPrecondition,
                       "device shared memory too small for attention");
  }
  const int chunks = (group + hc - 1) / hc;
  if (static_cast<int64_t>(layout.num_kv_heads) * chunks > 65535)
    return InvalidArgument("too many kv-heads");

  AttendParams& p = out->params;
  p = AttendParams{};
  p.quant_pool = a.quant_pool;
  p.quant_block_bytes = layout.quant_block_bytes();
  p.num_quant_blocks = a.num_quant_blocks;
  p.fp16_pool = reinterpret_cast<const uint8_t*>(a.fp16_pool);
  p.fp16_block_bytes = layout.fp16_block_bytes();
  p.num_fp16_blocks = a.num_fp16_blocks;
  p.seqs = a.seqs;
  p.tile_ids = a.tile_ids;
  p.num_seqs = a.num_seqs;
  p.layout = layout;
  p.layer = a.layer;
  p.group = group;
  p.chunks = chunks;
  p.quantized = preset.quantizes();
  if (p.quantized) {
    p.rl = preset.Layout(d);
    p.kbits = preset.key_bits;
    p.vbits = preset.value_bits;
  }
  p.rotates = preset.rotates();
  p.queries = a.queries;
  p.out = a.out;
  p.lse = a.lse;
  p.scale = a.softmax_scale == 0.0f ? 1.0f / std::sqrt(static_cast<float>(d)) : a.softmax_scale;
  p.num_splits = a.num_splits;
  p.partials = static_cast<float*>(a.workspace);
  p.status = a.status;
  p.plan = plan;
  out->head_chunk = hc;
  out->grid_x = a.num_splits;
  out->grid_y = layout.num_kv_heads * chunks;
  out->grid_z = a.num_seqs;
  out->combine = CombineParams{};
  out->combine_rows = 0;
  if (a.num_splits > 1) {
    out->combine.partials = p.partials;
    out->combine.out = a.out;
    out->combine.lse = a.lse;
    out->combine.num_splits = a.num_splits;
    out->combine.d = d;
    out->combine.rotates = p.rotates;
    out->combine_rows = a.num_seqs * a.num_q_heads;
  }
  return {};
}

int SuggestAttendSplits(const DeviceLimits& limits, const BlockLayout& layout, int num_seqs,
                        int num_q_heads, int max_tiles_per_seq) {
  if (num_seqs < 1 || layout.num_kv_heads < 1 || num_q_heads < layout.num_kv_heads) return 1;
  const int group = num_q_heads / layout.num_kv_heads;
  const int64_t blocks = static_cast<int64_t>(num_seqs) * layout.num_kv_heads *
                         ((group + HeadChunkFor(group) - 1) / HeadChunkFor(group));
  const int64_t want = 2 * static_cast<int64_t>(limits.num_sms > 0 ? limits.num_sms : 1);
  if (blocks >= want) return 1;
  int64_t splits = (want + blocks - 1) / blocks;
  const int64_t units = max_tiles_per_seq + 2;  // tiles, sink, tail
  if (splits > units / 2) splits = units / 2;
  if (splits > kMaxAttendSplits) splits = kMaxAttendSplits;
  return splits < 1 ? 1 : static_cast<int>(splits);
}

}  // namespace kvarn::cuda
