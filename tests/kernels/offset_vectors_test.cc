// Conformance on tests/golden/offsets: the torch-made vectors (tests/golden/make_offset_tiles.py)
// for constant-offset channels, values near the fp16 limits and random tiles, which the
// authors' golden set lacks. Both CPU implementations, with the golden tolerances; the
// figures printed are the exact agreement (codes, and fp16 ulps of every scale).
#include <gtest/gtest.h>

#include <cstdio>
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

std::string Dir() { return testing::GoldenDir() + "/offsets"; }

class OffsetVectorsTest : public ::testing::TestWithParam<const Codec*> {};

TEST_P(OffsetVectorsTest, EveryCaseWithinGoldenTolerances) {
  const Codec& codec = *GetParam();
  const std::vector<GoldenCase> cases = testing::LoadGoldenCases(Dir());
  ASSERT_GE(cases.size(), 4u);
  for (const GoldenCase& c : cases) {
    for (const auto& p : c.presets) {
      SCOPED_TRACE(p.prefix);
      Preset preset;
      ASSERT_TRUE(ParsePreset(p.preset_name, &preset).ok());
      const CodecOutput out = RunCodec(codec, c, preset);
      const testing::Conformance r = testing::CheckConformance(Dir(), c, p, out);
      for (const std::string& f : r.failures) ADD_FAILURE() << f;
      std::printf("%-10s %-32s codes K %.4f%% V %.4f%%  max scale ulps %d  errK %.5f (torch %.5f)  errV %.5f (torch %.5f)\n",
                  std::string(codec.name()).c_str(), p.prefix.c_str(), 100 * r.k_code_match,
                  100 * r.v_code_match, r.max_scale_ulps, r.k_err, p.k_rel_l2_error, r.v_err,
                  p.v_rel_l2_error);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Implementations, OffsetVectorsTest,
                         ::testing::Values(&Codec::Reference(), &Codec::Simd()),
                         [](const auto& info) { return std::string(info.param->name()); });

}  // namespace
}  // namespace kvarn
