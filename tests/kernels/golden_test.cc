// Conformance with the authors' reference: every case and preset of the golden manifest,
// with its tolerances, for both CPU implementations.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/codec.h"
#include "tests/common/golden.h"
#include "tests/kernels/golden_codec.h"

namespace kvarn {
namespace {

using testing::CodecOutput;
using testing::GoldenCase;
using testing::RunCodec;

const std::vector<GoldenCase>& Cases() {
  static const std::vector<GoldenCase> cases = testing::LoadGoldenCases(testing::GoldenDir());
  return cases;
}

struct Param {
  const Codec* codec;
  std::string name;
};

class GoldenTest : public ::testing::TestWithParam<Param> {};

TEST_P(GoldenTest, EveryCaseAndPresetWithinManifestTolerances) {
  const Codec& codec = *GetParam().codec;
  int checked = 0;
  for (const GoldenCase& c : Cases()) {
    for (const auto& p : c.presets) {
      SCOPED_TRACE(p.prefix);
      Preset preset;
      ASSERT_TRUE(ParsePreset(p.preset_name, &preset).ok());
      EXPECT_EQ(preset.RecordBytes(c.head_dim), p.record_bytes);
      const CodecOutput out = RunCodec(codec, c, preset);
      const testing::Conformance r = testing::CheckConformance(testing::GoldenDir(), c, p, out);
      for (const std::string& f : r.failures) ADD_FAILURE() << f;
      std::printf("%-10s %-28s codes K %.4f%% V %.4f%%  scale ulps %d  errK %.5f (ref %.5f)  errV %.5f (ref %.5f)  attn %.5f (ref %.5f)\n",
                  codec.name().data(), p.prefix.c_str(), 100 * r.k_code_match, 100 * r.v_code_match,
                  r.max_scale_ulps, r.k_err, p.k_rel_l2_error, r.v_err, p.v_rel_l2_error,
                  r.attn_err, p.attn_rel_l2_error);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 21);
}

// The rotation agrees with the reference's x · H on every case.
TEST(GoldenRotation, FwhtMatchesReferenceFrame) {
  for (const GoldenCase& c : Cases()) {
    std::vector<float> row(c.head_dim);
    for (int t = 0; t < c.tokens; ++t) {
      for (int d = 0; d < c.head_dim; ++d) row[d] = c.k[static_cast<size_t>(t) * c.head_dim + d];
      FwhtInPlace(row.data(), c.head_dim);
      for (int d = 0; d < c.head_dim; ++d) {
        const float want = c.k_rot[static_cast<size_t>(t) * c.head_dim + d];
        ASSERT_NEAR(row[d], want, 1e-5f * (1.0f + std::fabs(want))) << c.name << " t=" << t << " d=" << d;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Implementations, GoldenTest,
                         ::testing::Values(Param{&Codec::Reference(), "Reference"},
                                           Param{&Codec::Simd(), "Simd"}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace kvarn
