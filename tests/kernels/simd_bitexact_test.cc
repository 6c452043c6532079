// The SIMD encoder produces the scalar reference's records byte for byte, on every SIMD target
// this build generates and this CPU runs (forced in turn, as simd_targets_test does): on the
// golden cases, on the torch-made vectors of tests/golden/offsets (constant-offset channels,
// values near the fp16 limits) and on random tiles of several distributions, for every
// quantized preset the tiles fit. docs/codec_arithmetic.md says why they can be equal.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "hwy/targets.h"
#include "kernels/codec.h"
#include "kernels/kvarn_math.h"
#include "tests/common/golden.h"
#include "tests/kernels/codec_test_util.h"

namespace kvarn {
namespace {

using test::MustParse;

// Where two records first differ, by field, or "" when they are equal.
std::string FirstDifference(const Preset& p, int d, const std::vector<uint8_t>& a,
                            const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return "sizes differ";
  size_t i = 0;
  while (i < a.size() && a[i] == b[i]) ++i;
  if (i == a.size()) return "";
  std::string where = "byte " + std::to_string(i);
  if (p.quantizes()) {
    const RecordLayout l = p.Layout(d);
    const struct {
      const char* name;
      size_t begin, end;
    } fields[] = {{"K codes", l.k_codes, l.k_a}, {"a_K", l.k_a, l.k_b}, {"b_K", l.k_b, l.k_r},
                  {"r_K", l.k_r, l.v_codes},     {"V codes", l.v_codes, l.v_c},
                  {"c_V", l.v_c, l.v_a},         {"a_V", l.v_a, l.v_b}, {"b_V", l.v_b, l.total}};
    for (const auto& f : fields) {
      if (i >= f.begin && i < f.end) {
        where += " (" + std::string(f.name) + " byte " + std::to_string(i - f.begin) + ")";
        if (f.begin >= l.k_a && f.begin != l.v_codes) {
          const int e = static_cast<int>((i - f.begin) / 2);
          char text[96];
          std::snprintf(text, sizeof(text), " element %d: %.9g vs %.9g", e,
                        HalfToFloat(test::HalfField(a, f.begin, e)),
                        HalfToFloat(test::HalfField(b, f.begin, e)));
          where += text;
        }
      }
    }
  }
  size_t differ = 0;
  for (size_t j = 0; j < a.size(); ++j) differ += a[j] != b[j];
  return where + ", " + std::to_string(differ) + " bytes differ";
}

::testing::AssertionResult SameRecord(const Preset& p, int d, const std::vector<float>& k,
                                      const std::vector<float>& v, Frame frame = Frame::kOriginal) {
  const std::vector<uint8_t> want =
      test::EncodeOrDie(Codec::Reference(), p, d, k, v, kDefaultIterations, frame);
  const std::vector<uint8_t> got =
      test::EncodeOrDie(Codec::Simd(), p, d, k, v, kDefaultIterations, frame);
  const std::string diff = FirstDifference(p, d, got, want);
  if (diff.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "SIMD (" << Codec::Simd().target()
                                       << ") record differs from the reference at " << diff;
}

// Random tiles of several shapes of data, [G][D] f32, exactly representable in fp16.
enum class Shape { kGaussian, kHeavyTail, kChannelOffset, kTokenScales, kNearFp16Max, kSparse };
const Shape kShapes[] = {Shape::kGaussian,    Shape::kHeavyTail,   Shape::kChannelOffset,
                         Shape::kTokenScales, Shape::kNearFp16Max, Shape::kSparse};

std::vector<float> RandomTile(Shape shape, int g, int d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::student_t_distribution<float> heavy(2.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(g) * d);
  std::vector<float> offset(d), scale(g);
  for (float& o : offset) o = (unit(rng) < 0.25f ? 1.0f : 0.0f) * 300.0f * (unit(rng) - 0.5f);
  for (float& s : scale) s = std::exp(3.0f * (unit(rng) - 0.5f));
  for (int t = 0; t < g; ++t) {
    for (int c = 0; c < d; ++c) {
      float v = 0;
      switch (shape) {
        case Shape::kGaussian: v = normal(rng); break;
        case Shape::kHeavyTail: v = std::fmax(-6e4f, std::fmin(6e4f, heavy(rng))); break;
        case Shape::kChannelOffset: v = offset[c] + 0.5f * normal(rng); break;
        case Shape::kTokenScales: v = scale[t] * normal(rng); break;
        case Shape::kNearFp16Max: v = (unit(rng) < 0.5f ? -1.0f : 1.0f) * (4000.0f + 2000.0f * unit(rng)); break;
        case Shape::kSparse: v = unit(rng) < 0.05f ? 10.0f * normal(rng) : 0.0f; break;
      }
      x[static_cast<size_t>(t) * d + c] = RoundToHalf(v);
    }
  }
  return x;
}

class SimdBitExactTest : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override { hwy::SetSupportedTargetsForTest(GetParam()); }
  void TearDown() override { hwy::SetSupportedTargetsForTest(0); }
};

TEST_P(SimdBitExactTest, GoldenCasesEveryQuantizedPreset) {
  const std::vector<testing::GoldenCase> cases = testing::LoadGoldenCases(testing::GoldenDir());
  for (const testing::GoldenCase& c : cases) {
    for (const std::string& name : test::QuantizedPresetNames()) {
      const Preset p = MustParse(name);
      if (p.tile_tokens != c.tokens) continue;
      SCOPED_TRACE(c.name + " " + name);
      EXPECT_TRUE(SameRecord(p, c.head_dim, c.k, c.v));
    }
  }
}

TEST_P(SimdBitExactTest, OffsetAndFp16LimitVectors) {
  const std::string dir = testing::GoldenDir() + "/offsets";
  for (const testing::GoldenCase& c : testing::LoadGoldenCases(dir)) {
    for (const char* name : {"kvarn_k4v2_g128", "kvarn_k2v2_g128", "kvarn_k4v4_g128"}) {
      SCOPED_TRACE(c.name + " " + name);
      EXPECT_TRUE(SameRecord(MustParse(name), c.head_dim, c.k, c.v));
    }
  }
}

TEST_P(SimdBitExactTest, RandomTilesOfSeveralShapes) {
  // The default preset on every shape and head_dim; the other kvarn presets on fewer tiles.
  int tiles = 0, identical = 0;
  for (const char* name : {"kvarn_k4v2_g128", "kvarn_k2v4_g64", "kvarn_k2v2_g128"}) {
    const Preset p = MustParse(name);
    const bool main = std::string(name) == "kvarn_k4v2_g128";
    for (int d : test::kHeadDims) {
      for (Shape shape : kShapes) {
        for (uint32_t i = 0; i < (main && d == 128 ? 6u : 1u); ++i) {
          const uint32_t seed = 1000 * static_cast<uint32_t>(shape) + 10 * d + i;
          SCOPED_TRACE(::testing::Message() << name << " D=" << d << " shape " << static_cast<int>(shape)
                                            << " seed " << seed);
          const std::vector<float> k = RandomTile(shape, p.tile_tokens, d, seed);
          const std::vector<float> v = RandomTile(shape, p.tile_tokens, d, seed + 7);
          const ::testing::AssertionResult same = SameRecord(p, d, k, v);
          EXPECT_TRUE(same);
          ++tiles;
          identical += static_cast<bool>(same);
        }
      }
    }
  }
  std::printf("%d of %d random tiles bit-identical on %s\n", identical, tiles,
              std::string(Codec::Simd().target()).c_str());
}

TEST_P(SimdBitExactTest, StorageFrameAndUnbalancedPresets) {
  for (const char* name : {"kvarn_k4v2_g128", "hadamard_k2v2_g128", "kivi_k4v4_g64"}) {
    const Preset p = MustParse(name);
    for (uint32_t i = 0; i < 4; ++i) {
      SCOPED_TRACE(::testing::Message() << name << " tile " << i);
      const std::vector<float> k = RandomTile(kShapes[i], p.tile_tokens, 128, 77 + i);
      const std::vector<float> v = RandomTile(kShapes[i + 1], p.tile_tokens, 128, 88 + i);
      EXPECT_TRUE(SameRecord(p, 128, k, v, Frame::kStorage));
    }
  }
}

// f32 tiles with tiny and subnormal values (where the SIMD encoder's exact division would not
// hold, so it hands the tile to the reference) and with values that are not fp16-exact.
TEST_P(SimdBitExactTest, TinyAndNonHalfF32Inputs) {
  const Preset p = MustParse("kvarn_k4v2_g128");
  const size_t n = static_cast<size_t>(p.tile_tokens) * 128;
  std::vector<float> k = test::Gaussian(n, 5), v = test::Gaussian(n, 6, 3.0f);
  EXPECT_TRUE(SameRecord(p, 128, k, v));  // not fp16-exact
  for (float scale : {1e-30f, 1e-38f, 1e-42f}) {
    SCOPED_TRACE(scale);
    std::vector<float> kt = k, vt = v;
    for (size_t i = 0; i < n; i += 7) kt[i] *= scale;
    for (float& x : vt) x *= scale;
    EXPECT_TRUE(SameRecord(p, 128, kt, vt));
  }
}

INSTANTIATE_TEST_SUITE_P(CompiledAndSupported, SimdBitExactTest,
                         ::testing::ValuesIn(hwy::SupportedAndGeneratedTargets()),
                         [](const auto& info) { return std::string(hwy::TargetName(info.param)); });

}  // namespace
}  // namespace kvarn
