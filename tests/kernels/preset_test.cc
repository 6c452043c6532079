// Preset grammar and record sizes: ParsePreset accepts exactly
// {kvarn|kivi|hadamard}_k{2|4}v{2|4}_g{64|128} and fp16, and every record has the size of the
// KVARN_SPEC.md §5 table.
#include "kernels/preset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/codec.h"
#include "tests/kernels/codec_test_util.h"

namespace kvarn {
namespace {

struct Expected {
  std::string name;
  Method method;
  int key_bits, value_bits, tile_tokens;
};

// The grammar, enumerated here rather than taken from AllPresetNames().
std::vector<Expected> GrammarPresets() {
  std::vector<Expected> out;
  const std::pair<const char*, Method> methods[] = {
      {"kvarn", Method::kKvarn}, {"kivi", Method::kKivi}, {"hadamard", Method::kHadamard}};
  for (const auto& [prefix, method] : methods) {
    for (int kb : {2, 4}) {
      for (int vb : {2, 4}) {
        for (int g : {64, 128}) {
          out.push_back({std::string(prefix) + "_k" + std::to_string(kb) + "v" +
                             std::to_string(vb) + "_g" + std::to_string(g),
                         method, kb, vb, g});
        }
      }
    }
  }
  out.push_back({"fp16", Method::kFp16, 16, 16, 128});
  return out;
}

// §5, field by field: K codes, a_K, b_K, r_K, V codes, c_V, a_V, b_V.
size_t SpecRecordBytes(int d, int g, int kbits, int vbits) {
  const size_t D = d, G = g;
  return D * G * kbits / 8 + 2 * D + 2 * D + 2 * G + G * D * vbits / 8 + 2 * D + 2 * G + 2 * G;
}

TEST(PresetGrammar, AllPresetNamesIsExactlyTheGrammar) {
  const std::vector<std::string> names = AllPresetNames();
  const std::set<std::string> unique(names.begin(), names.end());
  EXPECT_EQ(unique.size(), names.size()) << "duplicate names";
  std::set<std::string> want;
  for (const Expected& e : GrammarPresets()) want.insert(e.name);
  EXPECT_EQ(unique, want);
  EXPECT_EQ(names.size(), 25u);
}

TEST(PresetGrammar, ParsesEveryValidNameIntoItsFieldsAndBack) {
  for (const Expected& e : GrammarPresets()) {
    SCOPED_TRACE(e.name);
    Preset p;
    const CodecStatus s = ParsePreset(e.name, &p);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(p.method, e.method);
    EXPECT_EQ(p.key_bits, e.key_bits);
    EXPECT_EQ(p.value_bits, e.value_bits);
    EXPECT_EQ(p.tile_tokens, e.tile_tokens);
    EXPECT_EQ(p.Name(), e.name);
    EXPECT_EQ(p.rotates(), e.method == Method::kKvarn || e.method == Method::kHadamard);
    EXPECT_EQ(p.balances(), e.method == Method::kKvarn);
    EXPECT_EQ(p.quantizes(), e.method != Method::kFp16);
  }
}

TEST(PresetGrammar, DefaultPresetIsKvarnK4V2G128) {
  Preset p;
  ASSERT_TRUE(ParsePreset(kDefaultPresetName, &p).ok());
  EXPECT_EQ(p, (Preset{Method::kKvarn, 4, 2, 128}));
  EXPECT_EQ(Preset{}, p) << "a default-constructed Preset is the default preset";
}

TEST(PresetGrammar, RejectsNearMissesWithAMessageNamingTheGrammar) {
  using namespace std::string_view_literals;
  const std::string_view near_misses[] = {
      ""sv,
      "kvarn"sv,
      "kvarn_"sv,
      "kvarn_k4v2"sv,
      "kvarn_k4v2_"sv,
      "kvarn_k4v2_g"sv,
      "KVARN_k4v2_g128"sv,
      "Kvarn_k4v2_g128"sv,
      "kvarn_K4V2_G128"sv,
      "kvarn_k4v2_G128"sv,
      " kvarn_k4v2_g128"sv,
      "kvarn_k4v2_g128 "sv,
      "kvarn_k4v2_g128\n"sv,
      "kvarn_k4v2_g128\0"sv,
      "kvarn_k3v2_g128"sv,
      "kvarn_k4v3_g128"sv,
      "kvarn_k8v2_g128"sv,
      "kvarn_k4v8_g128"sv,
      "kvarn_k1v2_g128"sv,
      "kvarn_k0v2_g128"sv,
      "kvarn_k16v16_g128"sv,
      "kvarn_k44v2_g128"sv,
      "kvarn_k4v22_g128"sv,
      "kvarn_kv2_g128"sv,
      "kvarn_k4v_g128"sv,
      "kvarn_k4_v2_g128"sv,
      "kvarn_k4v2__g128"sv,
      "kvarn_k4v2g128"sv,
      "kvarnk4v2_g128"sv,
      "kvarn-k4v2-g128"sv,
      "kvarn_k4v2-g128"sv,
      "kvarn_v2k4_g128"sv,
      "kvarn_k4v2_g32"sv,
      "kvarn_k4v2_g256"sv,
      "kvarn_k4v2_g12"sv,
      "kvarn_k4v2_g1280"sv,
      "kvarn_k4v2_g0128"sv,
      "kvarn_k4v2_g064"sv,
      "kvarn_k4v2_g+64"sv,
      "kvarn_k4v2_g6"sv,
      "kvarn_k4v2_g128_"sv,
      "kvarn_k4v2_g128x"sv,
      "kvarn_k4v2_g128_g128"sv,
      "kvarn_k+4v2_g128"sv,
      "kvarn_k4v2_t128"sv,
      "kvarn_k4v2_128"sv,
      "kivi_k4v2_g100"sv,
      "kivi_k4v2"sv,
      "kivi_k4v2_g128 "sv,
      "kivi__k4v2_g128"sv,
      "hadamard_k4v2"sv,
      "hadamard_k2v2_g96"sv,
      "hadamar_k4v2_g128"sv,
      "hadamardd_k4v2_g128"sv,
      "quarot_k4v2_g128"sv,
      "kvarnn_k4v2_g128"sv,
      "kvar_k4v2_g128"sv,
      "fp16_k4v2_g128"sv,
      "fp16 "sv,
      " fp16"sv,
      "FP16"sv,
      "fp16\0"sv,
      "fp16_g128"sv,
      "fp16_g64"sv,
      "fp32"sv,
      "fp8"sv,
      "bf16"sv,
      "f16"sv,
      "fp"sv,
      "int4"sv,
      "default"sv,
  };
  for (std::string_view name : near_misses) {
    SCOPED_TRACE(::testing::PrintToString(std::string(name)));
    Preset out{Method::kHadamard, 2, 4, 64};
    const CodecStatus s = ParsePreset(name, &out);
    EXPECT_EQ(s.code(), CodecCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find("fp16"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("kvarn|kivi|hadamard"), std::string::npos) << s.message();
    if (!name.empty() && name.find('\0') == std::string_view::npos) {
      EXPECT_NE(s.message().find(std::string(name)), std::string::npos) << s.message();
    }
    EXPECT_EQ(out, (Preset{Method::kHadamard, 2, 4, 64})) << "output written on error";
  }
}

class RecordSizeTest : public ::testing::TestWithParam<int> {};

TEST_P(RecordSizeTest, EveryPresetMatchesTheSpecTable) {
  const int d = GetParam();
  for (const Expected& e : GrammarPresets()) {
    SCOPED_TRACE(e.name);
    const Preset p = test::MustParse(e.name);
    const size_t g = static_cast<size_t>(e.tile_tokens);
    if (e.method == Method::kFp16) {
      // Passthrough: keys then values, fp16 [G][D] each.
      EXPECT_EQ(p.RecordBytes(d), 2 * 2 * g * d);
      continue;
    }
    const size_t want = SpecRecordBytes(d, e.tile_tokens, e.key_bits, e.value_bits);
    EXPECT_EQ(p.RecordBytes(d), want);
    EXPECT_DOUBLE_EQ(p.BitsPerElement(d), 8.0 * want / (2.0 * g * d));
    // Fields back to back, in table order.
    const RecordLayout l = p.Layout(d);
    EXPECT_EQ(l.k_codes, 0u);
    EXPECT_EQ(l.k_a, static_cast<size_t>(d) * g * e.key_bits / 8);
    EXPECT_EQ(l.k_b, l.k_a + 2 * d);
    EXPECT_EQ(l.k_r, l.k_b + 2 * d);
    EXPECT_EQ(l.v_codes, l.k_r + 2 * g);
    EXPECT_EQ(l.v_c, l.v_codes + g * d * e.value_bits / 8);
    EXPECT_EQ(l.v_a, l.v_c + 2 * d);
    EXPECT_EQ(l.v_b, l.v_a + 2 * g);
    EXPECT_EQ(l.total, l.v_b + 2 * g);
    EXPECT_EQ(l.total, want);
  }
}

INSTANTIATE_TEST_SUITE_P(HeadDims, RecordSizeTest, ::testing::ValuesIn(test::kHeadDims),
                         [](const auto& info) {
                           return std::string("D").append(std::to_string(info.param));
                         });

TEST(RecordSize, MatchesTheNumbersStatedInTheSpec) {
  EXPECT_EQ(test::MustParse("kvarn_k4v2_g128").RecordBytes(128), 13824u);
  EXPECT_EQ(test::MustParse("kvarn_k4v4_g128").RecordBytes(128), 17920u);
  EXPECT_EQ(test::MustParse("kvarn_k2v2_g128").RecordBytes(128), 9728u);
  EXPECT_EQ(test::MustParse("kvarn_k4v2_g64").RecordBytes(128), 7296u);
  // "108 bytes per token per head against 512 for fp16: 4.74x smaller".
  const Preset def = test::MustParse("kvarn_k4v2_g128");
  EXPECT_EQ(def.RecordBytes(128) / 128, 108u);
  EXPECT_NEAR(static_cast<double>(test::MustParse("fp16").RecordBytes(128)) / def.RecordBytes(128),
              4.74, 0.005);
  // The record depends on the bits and tile, not on the method.
  for (const char* method : {"kivi", "hadamard"}) {
    EXPECT_EQ(test::MustParse(std::string(method) + "_k4v2_g128").RecordBytes(128), 13824u);
  }
}

}  // namespace
}  // namespace kvarn
