#include "daemon/core/quant_error.h"

#include <cmath>
#include <vector>

#include "kernels/codec.h"

namespace kvarn {

double RelativeL2(const float* keys, const float* values, const float* src_keys, const float* src_values,
                  size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double ek = static_cast<double>(keys[i]) - src_keys[i];
    const double ev = static_cast<double>(values[i]) - src_values[i];
    num += ek * ek + ev * ev;
    den += static_cast<double>(src_keys[i]) * src_keys[i] + static_cast<double>(src_values[i]) * src_values[i];
  }
  return den > 0 ? std::sqrt(num / den) : 0.0;
}

std::array<BaselineError, 2> QuantBaselines(const Preset& preset, int head_dim, const float* keys,
                                            const float* values) {
  const size_t n = static_cast<size_t>(preset.tile_tokens) * static_cast<size_t>(head_dim);
  std::array<BaselineError, 2> out{{{"hadamard", -1.0}, {"kivi", -1.0}}};
  const Method methods[2] = {Method::kHadamard, Method::kKivi};
  std::vector<float> k(n), v(n);
  std::vector<uint8_t> record;
  const Codec& codec = Codec::Default();
  for (int m = 0; m < 2; ++m) {
    Preset base = preset;
    base.method = methods[m];
    record.assign(base.RecordBytes(head_dim), 0);
    if (!codec.EncodeTile(base, head_dim, {keys, values, DType::kF32, Frame::kOriginal}, record).ok()) continue;
    if (!codec.DecodeTile(base, head_dim, record, {k.data(), v.data(), DType::kF32, Frame::kOriginal}).ok()) continue;
    out[m].relative_l2 = RelativeL2(k.data(), v.data(), keys, values, n);
  }
  return out;
}

}  // namespace kvarn
