#include "kernels/store_tokens.h"

#include "kernels/codec_internal.h"

#include <cmath>
#include <string>
#include <vector>

#include "kernels/fp16.h"
#include "kernels/tile_io.h"

namespace kvarn {
namespace {

float ValueAt(const void* src, size_t i, DType dtype) {
  return dtype == DType::kF32 ? static_cast<const float*>(src)[i]
                              : HalfToFloat(static_cast<const uint16_t*>(src)[i]);
}

}  // namespace

CodecStatus CheckStoreShape(const Preset& preset, const BlockLayout& layout, int first, int n,
                            const void* keys, const void* values) {
  if (keys == nullptr || values == nullptr) return InvalidArgument("no K/V to store");
  if (layout.head_dim <= 0 || layout.num_layers <= 0 || layout.num_kv_heads <= 0 ||
      layout.tile_tokens != preset.tile_tokens) {
    return InvalidArgument("slot layout does not match the preset");
  }
  KVARN_RETURN_IF_ERROR(CheckHeadDim(layout.head_dim));
  if (n < 1 || first < 0 || first + n > layout.tile_tokens) {
    return InvalidArgument("tokens [" + std::to_string(first) + ", " + std::to_string(first + n) +
                           ") do not fit a " + std::to_string(layout.tile_tokens) + "-token slot");
  }
  return {};
}

CodecStatus CheckStoreTokens(const Preset& preset, const BlockLayout& layout, int first, int n,
                             const void* keys, const void* values, DType dtype) {
  KVARN_RETURN_IF_ERROR(CheckStoreShape(preset, layout, first, n, keys, values));
  const size_t d = static_cast<size_t>(layout.head_dim);
  const size_t per_token = layout.slots() * d;
  const size_t total = static_cast<size_t>(n) * per_token;
  for (int which = 0; which < 2; ++which) {
    const void* src = which == 0 ? keys : values;
    for (size_t i = 0; i < total; ++i) {
      const float x = ValueAt(src, i, dtype);
      if (!(std::fabs(x) <= kFp16Max)) {
        const size_t slot = (i % per_token) / d;
        return InvalidArgument(std::string(which == 0 ? "keys" : "values") + " of token " +
                               std::to_string(i / per_token) + " (layer " +
                               std::to_string(slot / layout.num_kv_heads) + ", kv-head " +
                               std::to_string(slot % layout.num_kv_heads) + ", channel " +
                               std::to_string(i % d) + ") are " +
                               (std::isnan(x) ? "NaN" : std::isinf(x) ? "Inf" : "beyond the fp16 range"));
      }
    }
  }
  if (!preset.rotates()) return {};
  // Rotation preserves a row's L2 norm and no element exceeds it, so only a row whose norm
  // is beyond the fp16 range can overflow once rotated: rotate those to be sure.
  std::vector<float> row(d);
  for (int which = 0; which < 2; ++which) {
    const void* src = which == 0 ? keys : values;
    for (size_t r = 0; r < total / d; ++r) {
      double norm2 = 0;
      for (size_t c = 0; c < d; ++c) norm2 += static_cast<double>(ValueAt(src, r * d + c, dtype)) * ValueAt(src, r * d + c, dtype);
      if (norm2 <= static_cast<double>(kFp16Max) * kFp16Max) continue;
      for (size_t c = 0; c < d; ++c) row[c] = ValueAt(src, r * d + c, dtype);
      FwhtInPlace(row.data(), static_cast<int>(d));
      for (size_t c = 0; c < d; ++c) {
        if (FloatToHalf(row[c]) == 0x7C00 || FloatToHalf(row[c]) == 0xFC00) {
          const size_t slot = r % layout.slots();
          return InvalidArgument(std::string(which == 0 ? "keys" : "values") + " of token " +
                                 std::to_string(r / layout.slots()) + " (layer " +
                                 std::to_string(slot / layout.num_kv_heads) + ", kv-head " +
                                 std::to_string(slot % layout.num_kv_heads) +
                                 ") overflow fp16 once rotated");
        }
      }
    }
  }
  return {};
}

CodecStatus ReferenceStoreTokens(const Preset& preset, const BlockLayout& layout, uint8_t* slot,
                                 int first, int n, const void* keys, const void* values, DType dtype) {
  KVARN_RETURN_IF_ERROR(CheckStoreTokens(preset, layout, first, n, keys, values, dtype));
  const size_t d = static_cast<size_t>(layout.head_dim);
  std::vector<float> row(d);
  for (int t = 0; t < n; ++t) {
    for (int l = 0; l < layout.num_layers; ++l) {
      for (int h = 0; h < layout.num_kv_heads; ++h) {
        const size_t src = (static_cast<size_t>(t) * layout.slots() + layout.slot(l, h)) * d;
        for (int which = 0; which < 2; ++which) {
          for (size_t c = 0; c < d; ++c) row[c] = ValueAt(which == 0 ? keys : values, src + c, dtype);
          if (preset.rotates()) FwhtInPlace(row.data(), static_cast<int>(d));
          const size_t off = which == 0 ? layout.Fp16KeysOffset(l, h) : layout.Fp16ValuesOffset(l, h);
          auto* dst = reinterpret_cast<uint16_t*>(
              slot + off + static_cast<size_t>(first + t) * layout.fp16_token_bytes());
          for (size_t c = 0; c < d; ++c) dst[c] = FloatToHalf(row[c]);
        }
      }
    }
  }
  return {};
}

CodecStatus Codec::StoreTokens(const Preset& preset, const BlockLayout& layout, uint8_t* slot,
                               int first, int n, const void* keys, const void* values,
                               DType dtype) const {
  if (slot == nullptr) return InvalidArgument("no slot to store into");
  KVARN_RETURN_IF_ERROR(CheckStoreShape(preset, layout, first, n, keys, values));
  return kernels_->store(preset, layout, slot, first, n, keys, values, dtype);
}

}  // namespace kvarn
