// Helpers shared by the codec's property and bad-input tests: the two implementations as a
// test parameter, deterministic random tiles, an fp64 Hadamard transform and attention that
// do not go through the codec, and record field access.
#ifndef KVARN_TESTS_KERNELS_CODEC_TEST_UTIL_H_
#define KVARN_TESTS_KERNELS_CODEC_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/codec.h"
#include "kernels/fp16.h"
#include "kernels/kvarn_math.h"
#include "kernels/preset.h"
#include "tests/common/golden.h"

namespace kvarn::test {

inline constexpr int kHeadDims[] = {64, 128, 256, 512};

// Both CPU implementations, for ::testing::Values / Combine.
inline auto Implementations() { return ::testing::Values(&Codec::Reference(), &Codec::Simd()); }

inline std::string CodecName(const Codec* codec) {
  return codec->name() == "reference" ? "Reference" : "Simd";
}

// Test-name generators for TestWithParam<const Codec*> and <tuple<const Codec*, string>>.
struct CodecParamName {
  std::string operator()(const ::testing::TestParamInfo<const Codec*>& info) const {
    return CodecName(info.param);
  }
};
struct CodecPresetParamName {
  std::string operator()(
      const ::testing::TestParamInfo<std::tuple<const Codec*, std::string>>& info) const {
    return CodecName(std::get<0>(info.param)) + "_" + std::get<1>(info.param);
  }
};

inline Preset MustParse(const std::string& name) {
  Preset p;
  const CodecStatus s = ParsePreset(name, &p);
  EXPECT_TRUE(s.ok()) << name << ": " << s.ToString();
  return p;
}

// The names of AllPresetNames() whose preset satisfies `pred`.
template <typename Pred>
std::vector<std::string> PresetNamesWhere(Pred pred) {
  std::vector<std::string> names;
  for (const std::string& n : AllPresetNames()) {
    if (pred(MustParse(n))) names.push_back(n);
  }
  return names;
}

inline std::vector<std::string> QuantizedPresetNames() {
  return PresetNamesWhere([](const Preset& p) { return p.quantizes(); });
}

// The fp16 slot layout of StoreTokens' tests: 3 layers x 2 kv-heads of head_dim d.
inline BlockLayout SmallStoreLayout(const Preset& p, int d) { return MakeBlockLayout(p, 3, 2, d); }

// n samples of N(mean, stddev), reproducible from `seed`.
inline std::vector<float> Gaussian(size_t n, uint32_t seed, float stddev = 1.0f,
                                   float mean = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(mean, stddev);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

inline std::vector<uint16_t> ToHalf(const std::vector<float>& x) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = FloatToHalf(x[i]);
  return h;
}

inline std::vector<float> FromHalf(const std::vector<uint16_t>& h) {
  std::vector<float> x(h.size());
  for (size_t i = 0; i < h.size(); ++i) x[i] = HalfToFloat(h[i]);
  return x;
}

// Normalized Walsh-Hadamard transform in fp64, written independently of the codec's.
inline void FwhtDouble(double* x, int n) {
  for (int h = 1; h < n; h *= 2) {
    for (int i = 0; i < n; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        const double a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
  const double norm = 1.0 / std::sqrt(static_cast<double>(n));
  for (int i = 0; i < n; ++i) x[i] *= norm;
}

template <typename A, typename B>
double RelL2(const A* approx, const B* exact, size_t n) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double e = static_cast<double>(approx[i]) - static_cast<double>(exact[i]);
    num += e * e;
    den += static_cast<double>(exact[i]) * static_cast<double>(exact[i]);
  }
  return std::sqrt(num / (den > 0.0 ? den : 1e-300));
}

// Encodes one [G][D] f32 tile, expecting success.
inline std::vector<uint8_t> EncodeOrDie(const Codec& codec, const Preset& preset, int d,
                                        const std::vector<float>& k, const std::vector<float>& v,
                                        int iterations = kDefaultIterations,
                                        Frame frame = Frame::kOriginal) {
  std::vector<uint8_t> record(preset.RecordBytes(d));
  TileIn in{k.data(), v.data(), DType::kF32, frame};
  EncodeOptions opt;
  opt.iterations = iterations;
  const CodecStatus s = codec.EncodeTile(preset, d, in, record, opt);
  EXPECT_TRUE(s.ok()) << preset.Name() << " D=" << d << ": " << s.ToString();
  return record;
}

// Decodes one record into f32 [G][D] keys and values in `frame`, expecting success.
inline void DecodeOrDie(const Codec& codec, const Preset& preset, int d,
                        const std::vector<uint8_t>& record, Frame frame, std::vector<float>* k,
                        std::vector<float>* v) {
  const size_t n = static_cast<size_t>(preset.tile_tokens) * d;
  k->assign(n, 0.0f);
  v->assign(n, 0.0f);
  const CodecStatus s =
      codec.DecodeTile(preset, d, record, TileOut{k->data(), v->data(), DType::kF32, frame});
  EXPECT_TRUE(s.ok()) << preset.Name() << " D=" << d << ": " << s.ToString();
}

inline uint16_t HalfField(const std::vector<uint8_t>& record, size_t offset, int i) {
  uint16_t h;
  std::memcpy(&h, record.data() + offset + 2 * static_cast<size_t>(i), 2);
  return h;
}

// The six fp16 scale vectors of a quantized record: name, byte offset, element count.
struct ScaleField {
  const char* name;
  size_t offset;
  int count;
};
inline std::vector<ScaleField> ScaleFields(const Preset& p, int d) {
  const RecordLayout l = p.Layout(d);
  const int g = p.tile_tokens;
  return {{"a_K", l.k_a, d}, {"b_K", l.k_b, d}, {"r_K", l.k_r, g},
          {"c_V", l.v_c, d}, {"a_V", l.v_a, g}, {"b_V", l.v_b, g}};
}

// How closely two quantized records of the same preset agree.
struct RecordAgreement {
  double k_code_match = 0, v_code_match = 0;  // fraction of equal codes
  int max_scale_ulps = 0;                     // over all six fp16 vectors
  std::string worst_scale;                    // where max_scale_ulps occurs
};
inline RecordAgreement CompareRecords(const Preset& p, int d, const std::vector<uint8_t>& a,
                                      const std::vector<uint8_t>& b) {
  RecordAgreement r;
  const int g = p.tile_tokens;
  const RecordLayout l = p.Layout(d);
  size_t k_same = 0, v_same = 0;
  for (int c = 0; c < d; ++c) {
    const size_t k_row = l.k_codes + static_cast<size_t>(c) * (g * p.key_bits / 8);
    for (int t = 0; t < g; ++t) {
      k_same += UnpackCode(a.data() + k_row, t, p.key_bits) ==
                UnpackCode(b.data() + k_row, t, p.key_bits);
    }
  }
  for (int t = 0; t < g; ++t) {
    const size_t v_row = l.v_codes + static_cast<size_t>(t) * (d * p.value_bits / 8);
    for (int c = 0; c < d; ++c) {
      v_same += UnpackCode(a.data() + v_row, c, p.value_bits) ==
                UnpackCode(b.data() + v_row, c, p.value_bits);
    }
  }
  const double n = static_cast<double>(g) * d;
  r.k_code_match = k_same / n;
  r.v_code_match = v_same / n;
  for (const ScaleField& f : ScaleFields(p, d)) {
    for (int i = 0; i < f.count; ++i) {
      const uint16_t ha = HalfField(a, f.offset, i), hb = HalfField(b, f.offset, i);
      const int ulps = kvarn::testing::HalfUlpDistance(ha, hb);
      if (ulps > r.max_scale_ulps) {
        r.max_scale_ulps = ulps;
        r.worst_scale = std::string(f.name) + "[" + std::to_string(i) + "] " +
                        std::to_string(HalfToFloat(ha)) + " vs " + std::to_string(HalfToFloat(hb));
      }
    }
  }
  return r;
}

// The golden tolerances between implementations: codes equal on >= 99.9% of a tile's keys
// and of its values, fp16 scales within 2 ulps; fp16 records byte-identical.
inline ::testing::AssertionResult RecordsAgree(const Preset& p, int d,
                                               const std::vector<uint8_t>& a,
                                               const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "record sizes differ";
  if (!p.quantizes()) {
    size_t differ = 0, first = 0;
    for (size_t i = 0; i + 1 < a.size(); i += 2) {
      if ((a[i] != b[i] || a[i + 1] != b[i + 1]) && differ++ == 0) first = i / 2;
    }
    if (differ == 0) return ::testing::AssertionSuccess();
    const uint16_t ha = HalfField(a, 0, static_cast<int>(first));
    const uint16_t hb = HalfField(b, 0, static_cast<int>(first));
    char text[160];
    std::snprintf(text, sizeof(text), "half %zu is %.9g (0x%04x) vs %.9g (0x%04x)", first,
                  HalfToFloat(ha), ha, HalfToFloat(hb), hb);
    return ::testing::AssertionFailure() << "fp16 records differ in " << differ << " of "
                                         << a.size() / 2 << " halves; first: " << text;
  }
  const RecordAgreement r = CompareRecords(p, d, a, b);
  if (r.k_code_match < 0.999 || r.v_code_match < 0.999 || r.max_scale_ulps > 2) {
    return ::testing::AssertionFailure()
           << "key codes match " << 100 * r.k_code_match << "%, value codes "
           << 100 * r.v_code_match << "%, worst scale " << r.max_scale_ulps << " ulps ("
           << r.worst_scale << ")";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace kvarn::test

#endif  // KVARN_TESTS_KERNELS_CODEC_TEST_UTIL_H_
