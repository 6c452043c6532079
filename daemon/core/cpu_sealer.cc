#include "daemon/core/cpu_sealer.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/codec_status.h"
#include "kernels/fp16.h"
#include "kernels/store_tokens.h"

namespace kvarn {

CpuSealer::CpuSealer(const Preset& preset, const BlockLayout& layout, int seal_threads)
    : preset_(preset), layout_(layout), pool_(std::make_unique<ParallelFor>(seal_threads)) {}

absl::Status CpuSealer::CheckTokens(const uint8_t* slot, int first, int count) {
  // Keys and values of every (layer, head) are 2 * slots equal runs of the slot, tile_elems
  // apart: one scan covers the token range in all of them.
  const size_t d = static_cast<size_t>(layout_.head_dim), len = static_cast<size_t>(count) * d;
  const size_t chunks = 2 * layout_.slots();
  const auto* base = reinterpret_cast<const uint16_t*>(slot) + static_cast<size_t>(first) * d;
  const size_t bad = FindNonFiniteHalfStrided(base, layout_.tile_elems(), chunks, len);
  if (bad == chunks * len) return absl::OkStatus();
  const size_t chunk = bad / len, i = bad % len, s = chunk / 2;
  return absl::InvalidArgumentError(absl::StrCat(chunk % 2 == 0 ? "keys" : "values", " of token ",
                                                 first + static_cast<int>(i / d), " (layer ", s / layout_.num_kv_heads,
                                                 ", kv-head ", s % layout_.num_kv_heads, ", channel ", i % d,
                                                 ") hold NaN or Inf"));
}

absl::Status CpuSealer::SealQuantized(const uint8_t* slot, uint8_t* block) {
  std::mutex mu;
  absl::Status first_error;
  const Codec& codec = Codec::Default();
  pool_->Run(layout_.slots(), [&](size_t i) {
    const int l = static_cast<int>(i / layout_.num_kv_heads), h = static_cast<int>(i % layout_.num_kv_heads);
    TileIn in{slot + layout_.Fp16KeysOffset(l, h), slot + layout_.Fp16ValuesOffset(l, h), DType::kF16,
              Frame::kStorage};
    const CodecStatus s = codec.EncodeTile(preset_, layout_.head_dim, in,
                                           {block + layout_.RecordOffset(l, h), layout_.record_bytes});
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(mu);
      if (first_error.ok()) {
        first_error = absl::Status(FromCodec(s).code(), absl::StrCat("layer ", l, ", kv-head ", h, ": ", s.message()));
      }
    }
  });
  return first_error;
}

absl::Status CpuSealer::SealSink(const uint8_t* slot, uint8_t* block) {
  std::memcpy(block, slot, layout_.fp16_slot_bytes() * layout_.slots());
  return CheckTokens(block, 0, layout_.tile_tokens);
}

absl::Status CpuSealer::CopyTail(const uint8_t* src, uint8_t* dst, int tokens) {
  const size_t bytes = static_cast<size_t>(tokens) * layout_.head_dim * sizeof(uint16_t);
  for (int l = 0; l < layout_.num_layers; ++l) {
    for (int h = 0; h < layout_.num_kv_heads; ++h) {
      std::memcpy(dst + layout_.Fp16KeysOffset(l, h), src + layout_.Fp16KeysOffset(l, h), bytes);
      std::memcpy(dst + layout_.Fp16ValuesOffset(l, h), src + layout_.Fp16ValuesOffset(l, h), bytes);
    }
  }
  return absl::OkStatus();
}

absl::Status CpuSealer::ExportBlock(const uint8_t* block, bool fp16, uint8_t* out) {
  std::memcpy(out, block, fp16 ? layout_.fp16_block_bytes() : layout_.quant_block_bytes());
  return absl::OkStatus();
}

absl::Status CpuSealer::ImportBlock(const uint8_t* in, bool fp16, uint8_t* block) {
  std::memcpy(block, in, fp16 ? layout_.fp16_block_bytes() : layout_.quant_block_bytes());
  return fp16 ? CheckTokens(block, 0, layout_.tile_tokens) : absl::OkStatus();
}

absl::Status CpuSealer::WriteTokens(uint8_t* slot, int first, int n, const void* keys,
                                    const void* values, DType dtype) {
  return FromCodec(Codec::Default().StoreTokens(preset_, layout_, slot, first, n, keys, values, dtype));
}

absl::Status CpuSealer::DecodeTile(const uint8_t* block, bool fp16, int layer, int head,
                                   float* keys, float* values) {
  if (!fp16) {
    return FromCodec(Codec::Default().DecodeTile(
        preset_, layout_.head_dim, {block + layout_.RecordOffset(layer, head), layout_.record_bytes},
        {keys, values, DType::kF32, Frame::kOriginal}));
  }
  return FromCodec(Codec::Default().DecodeFp16Tile(
      preset_, layout_.head_dim, reinterpret_cast<const uint16_t*>(block + layout_.Fp16KeysOffset(layer, head)),
      reinterpret_cast<const uint16_t*>(block + layout_.Fp16ValuesOffset(layer, head)), layout_.tile_tokens,
      {keys, values, DType::kF32, Frame::kOriginal}));
}

double CpuSealer::SampleError(const uint8_t* slot, const uint8_t* block, int layer, int head) {
  const size_t n = layout_.tile_elems();
  std::vector<float> k(n), v(n);
  const CodecStatus s = Codec::Default().DecodeTile(
      preset_, layout_.head_dim, {block + layout_.RecordOffset(layer, head), layout_.record_bytes},
      {k.data(), v.data(), DType::kF32, Frame::kStorage});
  if (!s.ok()) return -1.0;
  const auto* ks = reinterpret_cast<const uint16_t*>(slot + layout_.Fp16KeysOffset(layer, head));
  const auto* vs = reinterpret_cast<const uint16_t*>(slot + layout_.Fp16ValuesOffset(layer, head));
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double ek = k[i] - HalfToFloat(ks[i]), ev = v[i] - HalfToFloat(vs[i]);
    num += ek * ek + ev * ev;
    den += static_cast<double>(HalfToFloat(ks[i])) * HalfToFloat(ks[i]) +
           static_cast<double>(HalfToFloat(vs[i])) * HalfToFloat(vs[i]);
  }
  return den > 0 ? std::sqrt(num / den) : 0.0;
}

}  // namespace kvarn
