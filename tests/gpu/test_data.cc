#include "tests/gpu/test_data.h"

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/kvarn_math.h"
#include "tests/common/golden.h"

namespace kvarn::cuda::testing {

const char* TileKindName(int kind) {
  static const char* const kNames[kTileKinds] = {"gaussian", "outlier_channels", "heavy_tail",
                                                 "token_outliers", "tiny_constant"};
  return kNames[kind % kTileKinds];
}

void FillTile(std::mt19937_64& rng, int kind, int g, int d, float* out) {
  std::normal_distribution<float> n01(0.0f, 1.0f);
  for (int t = 0; t < g; ++t) {
    for (int c = 0; c < d; ++c) {
      float x = n01(rng);
      switch (kind % kTileKinds) {
        case 0:
          break;
        case 1:  // a few channels 20x larger, with a bias
          if (c % 16 == 3) x = 20.0f * x + 5.0f;
          break;
        case 2: {  // Student-t-like
          const float s = std::fabs(n01(rng));
          x = std::fmax(-300.0f, std::fmin(300.0f, 0.5f * x / std::fmax(s, 0.05f)));
          break;
        }
        case 3:  // every 17th token 8x
          if (t % 17 == 0) x *= 8.0f;
          break;
        case 4:  // tiny values (std clamps), one constant channel
          x = c == 5 ? 0.25f : 1e-3f * x;
          break;
      }
      out[static_cast<size_t>(t) * d + c] = x;
    }
  }
}

Preset MustParse(const std::string& name) {
  Preset p;
  const CodecStatus s = ParsePreset(name, &p);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    std::abort();
  }
  return p;
}

RecordDiff CompareRecords(const Preset& preset, int head_dim, const uint8_t* a, const uint8_t* b) {
  RecordDiff r;
  const size_t bytes = preset.RecordBytes(head_dim);
  r.identical = std::memcmp(a, b, bytes) == 0;
  if (!preset.quantizes() || r.identical) return r;
  const int g = preset.tile_tokens, d = head_dim;
  const RecordLayout l = preset.Layout(d);
  size_t k_eq = 0, v_eq = 0;
  const int k_row = g * preset.key_bits / 8, v_row = d * preset.value_bits / 8;
  for (int c = 0; c < d; ++c) {
    for (int t = 0; t < g; ++t) {
      k_eq += UnpackCode(a + l.k_codes + c * k_row, t, preset.key_bits) ==
              UnpackCode(b + l.k_codes + c * k_row, t, preset.key_bits);
      v_eq += UnpackCode(a + l.v_codes + t * v_row, c, preset.value_bits) ==
              UnpackCode(b + l.v_codes + t * v_row, c, preset.value_bits);
    }
  }
  const double n = static_cast<double>(g) * d;
  r.k_codes = static_cast<double>(k_eq) / n;
  r.v_codes = static_cast<double>(v_eq) / n;
  const struct {
    size_t off;
    int count;
  } fields[] = {{l.k_a, d}, {l.k_b, d}, {l.k_r, g}, {l.v_c, d}, {l.v_a, g}, {l.v_b, g}};
  for (const auto& f : fields) {
    for (int i = 0; i < f.count; ++i) {
      uint16_t x, y;
      std::memcpy(&x, a + f.off + 2 * i, 2);
      std::memcpy(&y, b + f.off + 2 * i, 2);
      const int u = kvarn::testing::HalfUlpDistance(x, y);
      if (u > r.max_ulps) r.max_ulps = u;
    }
  }
  return r;
}

std::string Fmt(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  return buf;
}

}  // namespace kvarn::cuda::testing
