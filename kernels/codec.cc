#include <cmath>
#include <string>
#include <vector>

#include "kernels/codec.h"
#include "kernels/codec_internal.h"
#include "kernels/fp16.h"

namespace kvarn {
namespace {

CodecStatus CheckPresetAndDim(const Preset& preset, int head_dim) {
  KVARN_RETURN_IF_ERROR(CheckHeadDim(head_dim));
  Preset parsed;
  // Re-parse the name so a hand-built Preset with unsupported fields is rejected too.
  KVARN_RETURN_IF_ERROR(ParsePreset(preset.Name(), &parsed));
  if (!(parsed == preset)) return InvalidArgument("malformed preset " + preset.Name());
  return {};
}

CodecStatus CheckRun(const Fp16Run& run, int max_tokens, int head_dim, const char* what) {
  if (run.tokens < 0 || run.tokens > max_tokens) {
    return InvalidArgument(std::string(what) + " holds " + std::to_string(run.tokens) +
                           " tokens; allowed 0.." + std::to_string(max_tokens));
  }
  if (run.tokens > 0 && (run.keys == nullptr || run.values == nullptr)) {
    return InvalidArgument(std::string(what) + " has tokens but no data");
  }
  if (run.stride != 0 && run.stride < static_cast<size_t>(head_dim)) {
    return InvalidArgument(std::string(what) + "'s row stride " + std::to_string(run.stride) +
                           " is less than head_dim " + std::to_string(head_dim));
  }
  return {};
}

}  // namespace

std::string_view Codec::target() const { return kernels_->target(); }

const Codec& Codec::Reference() {
  static const Codec codec("reference", &ReferenceKernels());
  return codec;
}

CodecStatus Codec::EncodeTile(const Preset& preset, int head_dim, const TileIn& in,
                              std::span<uint8_t> record, const EncodeOptions& options) const {
  KVARN_RETURN_IF_ERROR(CheckPresetAndDim(preset, head_dim));
  if (in.keys == nullptr || in.values == nullptr) return InvalidArgument("tile has no data");
  const size_t want = preset.RecordBytes(head_dim);
  if (record.size() != want) {
    return InvalidArgument("record buffer is " + std::to_string(record.size()) + " bytes; " +
                           preset.Name() + " with head_dim " + std::to_string(head_dim) +
                           " needs " + std::to_string(want));
  }
  if (options.iterations < 0 || options.iterations > EncodeOptions::kMaxIterations) {
    return InvalidArgument("iterations must be in 0.." +
                           std::to_string(EncodeOptions::kMaxIterations));
  }
  return kernels_->encode(preset, head_dim, in, record.data(), options.iterations);
}

CodecStatus Codec::DecodeTile(const Preset& preset, int head_dim, std::span<const uint8_t> record,
                              const TileOut& out) const {
  KVARN_RETURN_IF_ERROR(CheckPresetAndDim(preset, head_dim));
  if (out.keys == nullptr || out.values == nullptr) return InvalidArgument("no output buffers");
  const size_t want = preset.RecordBytes(head_dim);
  if (record.size() != want) {
    return InvalidArgument("record is " + std::to_string(record.size()) + " bytes; " +
                           preset.Name() + " with head_dim " + std::to_string(head_dim) +
                           " has " + std::to_string(want));
  }
  return kernels_->decode(preset, head_dim, record.data(), out);
}

CodecStatus Codec::DecodeFp16Tile(const Preset& preset, int head_dim, const Fp16Run& run,
                                  const TileOut& out) const {
  KVARN_RETURN_IF_ERROR(CheckPresetAndDim(preset, head_dim));
  if (run.keys == nullptr || run.values == nullptr || out.keys == nullptr ||
      out.values == nullptr) {
    return InvalidArgument("no input or output buffers");
  }
  KVARN_RETURN_IF_ERROR(CheckRun(run, preset.tile_tokens, head_dim, "fp16 tile"));
  const size_t stride = run.RowStride(head_dim);
  std::vector<float> row(head_dim);
  for (int which = 0; which < 2; ++which) {
    const uint16_t* src = which == 0 ? run.keys : run.values;
    void* dst = which == 0 ? out.keys : out.values;
    for (size_t t = 0; t < static_cast<size_t>(run.tokens); ++t) {
      for (int c = 0; c < head_dim; ++c) row[c] = HalfToFloat(src[t * stride + c]);
      if (preset.rotates() && out.frame == Frame::kOriginal) FwhtInPlace(row.data(), head_dim);
      for (int c = 0; c < head_dim; ++c) {
        if (out.dtype == DType::kF32) {
          static_cast<float*>(dst)[t * head_dim + c] = row[c];
        } else {
          static_cast<uint16_t*>(dst)[t * head_dim + c] = FloatToHalf(row[c]);
        }
      }
    }
  }
  return {};
}

CodecStatus Codec::AttendDecode(const Preset& preset, int head_dim, const float* queries,
                                int num_queries, const SequenceView& seq, float* out,
                                float softmax_scale, float* lse,
                                AttendPrecision precision) const {
  KVARN_RETURN_IF_ERROR(CheckPresetAndDim(preset, head_dim));
  if (queries == nullptr || out == nullptr) return InvalidArgument("no query or output buffer");
  if (num_queries < 1 || num_queries > 64) {
    return InvalidArgument("num_queries " + std::to_string(num_queries) +
                           " is outside 1..64 query heads per kv-head");
  }
  if (!std::isfinite(softmax_scale) || softmax_scale < 0.0f) {
    return InvalidArgument("softmax_scale must be finite and >= 0");
  }
  const int g = preset.tile_tokens;
  KVARN_RETURN_IF_ERROR(CheckRun(seq.sink, g, head_dim, "sink"));
  KVARN_RETURN_IF_ERROR(CheckRun(seq.tail, g, head_dim, "tail"));
  for (const uint8_t* tile : seq.tiles) {
    if (tile == nullptr) return InvalidArgument("null tile in sequence");
  }
  if (seq.sink.tokens + seq.tail.tokens == 0 && seq.tiles.empty()) {
    return InvalidArgument("sequence has no tokens");
  }
  for (size_t i = 0; i < static_cast<size_t>(num_queries) * head_dim; ++i) {
    if (!std::isfinite(queries[i])) return InvalidArgument("query holds NaN or Inf");
  }
  if (softmax_scale == 0.0f) softmax_scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const auto attend = precision == AttendPrecision::kFast && kernels_->attend_fast != nullptr
                          ? kernels_->attend_fast
                          : kernels_->attend;
  return attend(preset, head_dim, queries, num_queries, seq, out, softmax_scale, lse);
}

}  // namespace kvarn
