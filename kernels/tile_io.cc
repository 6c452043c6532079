#include "kernels/tile_io.h"

#include <cmath>
#include <string>

namespace kvarn {

CodecStatus LoadTileToStorage(const Preset& preset, int head_dim, const void* src, DType dtype,
                              Frame frame, float* dst, const char* what) {
  const int g = preset.tile_tokens;
  const size_t n = static_cast<size_t>(g) * head_dim;
  if (dtype == DType::kF32) {
    std::memcpy(dst, src, n * sizeof(float));
  } else {
    const auto* h = static_cast<const uint16_t*>(src);
    for (size_t i = 0; i < n; ++i) dst[i] = HalfToFloat(h[i]);
  }
  for (size_t i = 0; i < n; ++i) {
    if (!(std::fabs(dst[i]) <= kFp16Max)) {
      const int token = static_cast<int>(i / head_dim), channel = static_cast<int>(i % head_dim);
      return InvalidArgument(std::string(what) + " [token " + std::to_string(token) + ", channel " +
                             std::to_string(channel) + "] is " +
                             (std::isnan(dst[i]) ? "NaN" : std::isinf(dst[i]) ? "Inf" : "beyond the fp16 range"));
    }
  }
  if (preset.rotates() && frame == Frame::kOriginal) {
    for (int t = 0; t < g; ++t) FwhtInPlace(dst + static_cast<size_t>(t) * head_dim, head_dim);
  }
  return {};
}

void StoreTileFromStorage(const Preset& preset, int head_dim, float* src, void* dst, DType dtype,
                          Frame frame) {
  const int g = preset.tile_tokens;
  const size_t n = static_cast<size_t>(g) * head_dim;
  if (preset.rotates() && frame == Frame::kOriginal) {
    for (int t = 0; t < g; ++t) FwhtInPlace(src + static_cast<size_t>(t) * head_dim, head_dim);
  }
  if (dtype == DType::kF32) {
    std::memcpy(dst, src, n * sizeof(float));
  } else {
    auto* h = static_cast<uint16_t*>(dst);
    for (size_t i = 0; i < n; ++i) h[i] = FloatToHalf(src[i]);
  }
}

CodecStatus FpRangeError() {
  return InvalidArgument("tile magnitudes exceed what the record's fp16 scales can hold");
}

CodecStatus StoreFp16Record(const float* keys, const float* values, size_t n, uint8_t* record) {
  auto* out = reinterpret_cast<uint16_t*>(record);
  for (size_t i = 0; i < n; ++i) {
    // LoadTileToStorage has bounded the magnitudes, so nothing overflows here.
    const uint16_t k = FloatToHalf(keys[i]), v = FloatToHalf(values[i]);
    std::memcpy(out + i, &k, 2);
    std::memcpy(out + n + i, &v, 2);
  }
  return {};
}

void LoadFp16Record(const uint8_t* record, size_t n, float* keys, float* values) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t k, v;
    std::memcpy(&k, record + 2 * i, 2);
    std::memcpy(&v, record + 2 * (n + i), 2);
    keys[i] = HalfToFloat(k);
    values[i] = HalfToFloat(v);
  }
}

CodecStatus RecordView::CheckScales() const {
  const struct {
    size_t offset;
    int count;
    const char* name;
  } fields[] = {{layout_.k_a, d_, "a_K"}, {layout_.k_b, d_, "b_K"}, {layout_.k_r, g_, "r_K"},
                {layout_.v_c, d_, "c_V"}, {layout_.v_a, g_, "a_V"}, {layout_.v_b, g_, "b_V"}};
  for (const auto& f : fields) {
    for (int i = 0; i < f.count; ++i) {
      if ((HalfBits(f.offset, i) & 0x7C00u) == 0x7C00u) {
        return InvalidArgument(std::string("corrupt record: ") + f.name + "[" + std::to_string(i) +
                               "] is not finite");
      }
    }
  }
  return {};
}

}  // namespace kvarn
