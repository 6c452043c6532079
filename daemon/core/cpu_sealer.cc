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
  // The tokens' rows are one run of the slot (token-major): one scan covers them.
  const size_t per_token = layout_.fp16_token_elems();
  const size_t len = static_cast<size_t>(count) * per_token;
  const auto* base =
      reinterpret_cast<const uint16_t*>(slot) + static_cast<size_t>(first) * per_token;
  const size_t bad = FindNonFiniteHalf(base, len);
  return bad == len ? absl::OkStatus() : NonFiniteTokenError(layout_, first, bad);
}

namespace {

// The [G][D] keys then values of one (layer, head) of an fp16 block, whose rows are a token
// apart, gathered into `out` (2 * tile_elems values): the codec's tile input.
void GatherTile(const BlockLayout& layout, const uint8_t* block, int layer, int head,
                uint16_t* out) {
  const size_t row = static_cast<size_t>(layout.head_dim) * sizeof(uint16_t);
  for (int which = 0; which < 2; ++which) {
    const uint8_t* src = block + (which == 0 ? layout.Fp16KeysOffset(layer, head)
                                             : layout.Fp16ValuesOffset(layer, head));
    auto* dst = reinterpret_cast<uint8_t*>(out + which * layout.tile_elems());
    for (int t = 0; t < layout.tile_tokens; ++t) {
      std::memcpy(dst + static_cast<size_t>(t) * row,
                  src + static_cast<size_t>(t) * layout.fp16_token_bytes(), row);
    }
  }
}

}  // namespace

absl::Status CpuSealer::SealQuantized(const uint8_t* slot, uint8_t* block) {
  std::mutex mu;
  absl::Status first_error;
  const Codec& codec = Codec::Default();
  pool_->Run(layout_.slots(), [&](size_t i) {
    const int l = static_cast<int>(i / layout_.num_kv_heads), h = static_cast<int>(i % layout_.num_kv_heads);
    thread_local std::vector<uint16_t> tile;
    tile.resize(2 * layout_.tile_elems());
    GatherTile(layout_, slot, l, h, tile.data());
    TileIn in{tile.data(), tile.data() + layout_.tile_elems(), DType::kF16, Frame::kStorage};
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
  std::memcpy(block, slot, layout_.fp16_block_bytes());
  return CheckTokens(block, 0, layout_.tile_tokens);
}

absl::Status CpuSealer::CopyTail(const uint8_t* src, uint8_t* dst, int tokens) {
  std::memcpy(dst, src, static_cast<size_t>(tokens) * layout_.fp16_token_bytes());  // token-major
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
  const Fp16Run run{
      reinterpret_cast<const uint16_t*>(block + layout_.Fp16KeysOffset(layer, head)),
      reinterpret_cast<const uint16_t*>(block + layout_.Fp16ValuesOffset(layer, head)),
      layout_.tile_tokens, layout_.fp16_token_elems()};
  return FromCodec(Codec::Default().DecodeFp16Tile(preset_, layout_.head_dim, run,
                                                   {keys, values, DType::kF32, Frame::kOriginal}));
}

double CpuSealer::SampleError(const uint8_t* slot, const uint8_t* block, int layer, int head) {
  const size_t n = layout_.tile_elems();
  std::vector<float> k(n), v(n);
  const CodecStatus s = Codec::Default().DecodeTile(
      preset_, layout_.head_dim, {block + layout_.RecordOffset(layer, head), layout_.record_bytes},
      {k.data(), v.data(), DType::kF32, Frame::kStorage});
  if (!s.ok()) return -1.0;
  std::vector<uint16_t> tile(2 * n);
  GatherTile(layout_, slot, layer, head, tile.data());
  const uint16_t* ks = tile.data();
  const uint16_t* vs = ks + n;
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
