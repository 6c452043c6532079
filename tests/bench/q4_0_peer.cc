#include "tests/bench/q4_0_peer.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/fp16.h"

namespace kvarn::bench {
namespace {

const float* HalfTable() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t h = 0; h < 65536; ++h) t[h] = HalfToFloat(static_cast<uint16_t>(h));
    return t;
  }();
  return table.data();
}

}  // namespace

void QuantizeQ4_0(const uint16_t* x, size_t n, BlockQ4_0* out) {
  const float* widen = HalfTable();
  float v[kQ4_0BlockValues];
  for (size_t b = 0; b < n / kQ4_0BlockValues; ++b) {
    const uint16_t* in = x + b * kQ4_0BlockValues;
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < kQ4_0BlockValues; ++j) {
      v[j] = widen[in[j]];
      if (std::fabs(v[j]) > amax) {
        amax = std::fabs(v[j]);
        max = v[j];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out[b].d = FloatToHalf(d);
    for (int j = 0; j < kQ4_0BlockValues / 2; ++j) {
      const int lo = std::min(15, static_cast<int>(static_cast<int8_t>(v[j] * id + 8.5f)));
      const int hi = std::min(15, static_cast<int>(static_cast<int8_t>(v[j + 16] * id + 8.5f)));
      out[b].qs[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

float DequantizeQ4_0(const BlockQ4_0* blocks, size_t i) {
  const BlockQ4_0& b = blocks[i / kQ4_0BlockValues];
  const size_t j = i % kQ4_0BlockValues;
  const int q = j < 16 ? (b.qs[j] & 0x0F) : (b.qs[j - 16] >> 4);
  return static_cast<float>(q - 8) * HalfToFloat(b.d);
}

}  // namespace kvarn::bench
