// `kvarnctl codec synth`: deterministic synthetic K/V with the advertised features.
#include "client/kvarnctl/codec_synth.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "client/kvarnctl/codec_command.h"
#include "tests/client/kvarnctl_test_util.h"

namespace kvarn::ctl {
namespace {

using ::testing::HasSubstr;
using testing::RunCommand;
using testing::ScratchDir;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

TEST(CodecSynthTest, WritesTheRequestedShapesAndCreatesTheDirectory) {
  const std::string dir = ScratchDir() + "/a/b";
  const auto r = RunCommand(&RunCodecSynth, {"--out-dir", dir, "--tokens", "300", "--heads", "3",
                                             "--head-dim", "64", "--seed", "5"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("SYNTHETIC"));
  EXPECT_THAT(r.out, HasSubstr("not from a model"));
  std::vector<size_t> shape;
  EXPECT_EQ(testing::ReadF32(dir + "/k.npy", &shape).size(), 3u * 300 * 64);
  EXPECT_EQ(shape, (std::vector<size_t>{3, 300, 64}));
  testing::ReadF32(dir + "/v.npy", &shape);
  EXPECT_EQ(shape, (std::vector<size_t>{3, 300, 64}));
  testing::ReadF32(dir + "/q.npy", &shape);
  EXPECT_EQ(shape, (std::vector<size_t>{3, 4, 64}));
}

TEST(CodecSynthTest, DefaultsAreT2048H4D128) {
  const std::string dir = ScratchDir();
  ASSERT_EQ(RunCommand(&RunCodecSynth, {"--out-dir", dir}).code, 0);
  std::vector<size_t> shape;
  testing::ReadF32(dir + "/k.npy", &shape);
  EXPECT_EQ(shape, (std::vector<size_t>{4, 2048, 128}));
}

TEST(CodecSynthTest, DeterministicForASeed) {
  const std::string dir = ScratchDir();
  for (const char* sub : {"/a", "/b", "/c"}) {
    const std::string seed = std::string(sub) == "/c" ? "2" : "1";
    ASSERT_EQ(
        RunCommand(&RunCodecSynth, {"--out-dir", dir + sub, "--tokens", "200", "--seed", seed})
            .code,
        0);
  }
  for (const char* f : {"/k.npy", "/v.npy", "/q.npy"}) {
    EXPECT_EQ(testing::ReadBytes(dir + "/a" + f), testing::ReadBytes(dir + "/b" + f)) << f;
    EXPECT_NE(testing::ReadBytes(dir + "/a" + f), testing::ReadBytes(dir + "/c" + f)) << f;
  }
  // Heads differ from one another.
  const SynthData d = MakeSynthetic(SynthOptions{});
  EXPECT_FALSE(
      std::equal(d.keys.begin(), d.keys.begin() + 2048 * 128, d.keys.begin() + 2048 * 128));
}

TEST(CodecSynthTest, HasOutlierChannelsASinkRopeAndHeavyTails) {
  SynthOptions o;
  o.heads = 1;
  const SynthData d = MakeSynthetic(o);
  const int t_count = d.tokens, dim = d.head_dim, half = dim / 2;
  // Outlier channels: a few channel pairs hold far more energy than the median pair.
  std::vector<double> pair_energy(half, 0.0);
  std::vector<double> norms;
  for (int t = 1; t < t_count; ++t) {
    double n = 0;
    for (int c = 0; c < dim; ++c) {
      const double x = d.keys[static_cast<size_t>(t) * dim + c];
      pair_energy[c % half] += x * x;
      n += x * x;
    }
    norms.push_back(std::sqrt(n));
  }
  const double median_pair = Median(pair_energy);
  const int outliers = static_cast<int>(std::count_if(
      pair_energy.begin(), pair_energy.end(), [&](double e) { return e > 10 * median_pair; }));
  EXPECT_GE(outliers, 2);
  EXPECT_LE(outliers, 6);
  // RoPE: the strongest pair's offset turns by theta_i = 10000^(-2i/D) per token, so the
  // mean turn over a lag of L tokens, angle(sum z_{t+L} conj(z_t)), is L theta_i.
  const int strongest = static_cast<int>(std::max_element(pair_energy.begin(), pair_energy.end()) -
                                         pair_energy.begin());
  double re = 0, im = 0;
  constexpr int kLag = 64;
  for (int t = 1; t + kLag < t_count; ++t) {
    const double a0 = d.keys[static_cast<size_t>(t) * dim + strongest];
    const double b0 = d.keys[static_cast<size_t>(t) * dim + strongest + half];
    const double a1 = d.keys[static_cast<size_t>(t + kLag) * dim + strongest];
    const double b1 = d.keys[static_cast<size_t>(t + kLag) * dim + strongest + half];
    re += a1 * a0 + b1 * b0;
    im += b1 * a0 - a1 * b0;
  }
  const double theta = std::pow(10000.0, -2.0 * strongest / dim);
  EXPECT_NEAR(std::atan2(im, re), kLag * theta, 0.1 * kLag * theta);
  // The sink: token 0's key is several times a typical key's norm.
  double sink = 0;
  for (int c = 0; c < dim; ++c) sink += d.keys[c] * static_cast<double>(d.keys[c]);
  EXPECT_GT(std::sqrt(sink), 2.0 * Median(norms));
  // Heavy-tailed values: excess kurtosis well above a Gaussian's 0.
  double m2 = 0, m4 = 0;
  const size_t n = d.values.size() - dim;
  for (size_t i = dim; i < d.values.size(); ++i) {
    const double x = d.values[i];
    m2 += x * x;
    m4 += x * x * x * x;
  }
  m2 /= n;
  m4 /= n;
  EXPECT_GT(m4 / (m2 * m2) - 3.0, 1.0);
  // Attention is neither uniform nor one-hot, and the sink takes a real share.
  const AttentionShape shape = DescribeAttention(MakeSynthetic(SynthOptions{}));
  EXPECT_GT(shape.sink_mass, 0.1);
  EXPECT_LT(shape.sink_mass, 0.8);
  EXPECT_GT(shape.effective_tokens, 20);
  EXPECT_LT(shape.effective_tokens, 1500);
}

TEST(CodecSynthTest, BadOptionsAreUsageErrors) {
  const std::string dir = ScratchDir();
  auto r = RunCommand(&RunCodecSynth, {"--out-dir", dir, "--head-dim", "96"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--head-dim: head_dim 96 is not supported"));
  r = RunCommand(&RunCodecSynth, {"--out-dir", dir, "--tokens", "0"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--tokens: 0 is out of range 1..1048576"));
  r = RunCommand(&RunCodecSynth, {"--tokens", "10"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("missing required flag --out-dir"));
  r = RunCommand(&RunCodecSynth, {"--out-dir", dir, "--heads", "two"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--heads: 'two' is not an integer"));
  // A file where the directory should be: the work fails (exit 1), not the usage.
  testing::WriteF32(dir + "/file", {1}, {0.0f});
  r = RunCommand(&RunCodecSynth, {"--out-dir", dir + "/file", "--tokens", "10"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("file: "));
}

}  // namespace
}  // namespace kvarn::ctl
