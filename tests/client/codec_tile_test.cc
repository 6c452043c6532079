// `kvarnctl codec encode` / `decode`: records through files equal the codec's own.
#include "client/kvarnctl/codec_tile.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "client/kvarnctl/codec_command.h"
#include "client/kvarnctl/codec_io.h"
#include "kernels/codec.h"
#include "tests/client/kvarnctl_test_util.h"

namespace kvarn::ctl {
namespace {

using ::testing::HasSubstr;
using testing::Pattern;
using testing::RunCommand;
using testing::ScratchDir;

struct Tile {
  std::string dir, keys, values;
  std::vector<float> k, v;
};

Tile MakeTile(int g, int d, bool f16 = false) {
  Tile t;
  t.dir = ScratchDir();
  t.keys = t.dir + "/k.npy";
  t.values = t.dir + "/v.npy";
  t.k = Pattern(static_cast<size_t>(g) * d, 1, 3.0f);
  t.v = Pattern(static_cast<size_t>(g) * d, 2, 1.0f);
  for (int i = 0; i < g; ++i) t.k[static_cast<size_t>(i) * d + 5] += 20.0f;  // an outlier channel
  const std::vector<size_t> shape = {static_cast<size_t>(g), static_cast<size_t>(d)};
  if (f16) {
    testing::WriteF16(t.keys, shape, t.k);
    testing::WriteF16(t.values, shape, t.v);
    for (float& x : t.k) x = RoundToHalf(x);
    for (float& x : t.v) x = RoundToHalf(x);
  } else {
    testing::WriteF32(t.keys, shape, t.k);
    testing::WriteF32(t.values, shape, t.v);
  }
  return t;
}

struct RoundTripCase {
  const char* preset;
  int head_dim;
  bool f16;
  friend void PrintTo(const RoundTripCase& c, std::ostream* os) {
    *os << c.preset << " D=" << c.head_dim << (c.f16 ? " float16" : " float32");
  }
};

class EncodeDecodeRoundTrip : public ::testing::TestWithParam<RoundTripCase> {};

TEST_P(EncodeDecodeRoundTrip, FilesMatchTheCodecCalledDirectly) {
  const RoundTripCase c = GetParam();
  Preset preset;
  ASSERT_TRUE(ParsePreset(c.preset, &preset).ok());
  const int g = preset.tile_tokens, d = c.head_dim;
  const Tile t = MakeTile(g, d, c.f16);
  const std::string record_path = t.dir + "/r.bin";
  const auto enc = RunCommand(&RunCodecEncode, {"--preset", c.preset, "--keys", t.keys, "--values",
                                                t.values, "--out", record_path});
  ASSERT_EQ(enc.code, 0) << enc.err;
  EXPECT_THAT(enc.out, HasSubstr("head_dim " + std::to_string(d)));

  std::vector<uint8_t> direct(preset.RecordBytes(d));
  ASSERT_TRUE(Codec::Default().EncodeTile(preset, d, {t.k.data(), t.v.data()}, direct).ok());
  EXPECT_EQ(testing::ReadBytes(record_path), direct);

  const auto dec =
      RunCommand(&RunCodecDecode, {"--preset", c.preset, "--record", record_path, "--keys-out",
                                   t.dir + "/k2.npy", "--values-out", t.dir + "/v2.npy"});
  ASSERT_EQ(dec.code, 0) << dec.err;
  EXPECT_THAT(dec.out, HasSubstr("head_dim " + std::to_string(d) + " inferred"));
  std::vector<float> k_hat(direct.size()), v_hat;
  k_hat.assign(static_cast<size_t>(g) * d, 0);
  v_hat.assign(k_hat.size(), 0);
  ASSERT_TRUE(Codec::Default().DecodeTile(preset, d, direct, {k_hat.data(), v_hat.data()}).ok());
  std::vector<size_t> shape;
  EXPECT_EQ(testing::ReadF32(t.dir + "/k2.npy", &shape), k_hat);
  EXPECT_EQ(shape, (std::vector<size_t>{static_cast<size_t>(g), static_cast<size_t>(d)}));
  EXPECT_EQ(testing::ReadF32(t.dir + "/v2.npy"), v_hat);
}

INSTANTIATE_TEST_SUITE_P(Presets, EncodeDecodeRoundTrip,
                         ::testing::Values(RoundTripCase{"kvarn_k4v2_g128", 128, false},
                                           RoundTripCase{"kvarn_k2v2_g64", 64, false},
                                           RoundTripCase{"kvarn_k4v4_g128", 256, true},
                                           RoundTripCase{"kivi_k4v2_g128", 128, false},
                                           RoundTripCase{"hadamard_k2v4_g64", 512, false},
                                           RoundTripCase{"fp16", 64, true}),
                         [](const auto& info) {
                           return std::string(info.param.preset) + "_d" +
                                  std::to_string(info.param.head_dim) +
                                  (info.param.f16 ? "_f16" : "_f32");
                         });

TEST(CodecEncodeTest, HeadDimCheckReadsTheRecordBack) {
  const Tile t = MakeTile(128, 128);
  const auto r = RunCommand(&RunCodecEncode,
                            {"--preset", "kvarn_k4v2_g128", "--keys", t.keys, "--values", t.values,
                             "--out", t.dir + "/r.bin", "--head-dim-check", "--iterations", "4"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("13824 bytes (3.375 bits/element, 4.74x smaller than fp16)"));
  EXPECT_THAT(r.out, HasSubstr("check: decode infers head_dim 128 from the 13824-byte size"));
}

TEST(CodecEncodeTest, IterationsReachTheCodec) {
  const Tile t = MakeTile(128, 128);
  EncodeRequest req;
  req.keys_path = t.keys;
  req.values_path = t.values;
  req.out_path = t.dir + "/r.bin";
  req.iterations = 0;
  EncodeReport report;
  ASSERT_TRUE(EncodeFiles(req, &report).ok());
  Preset p;
  ASSERT_TRUE(ParsePreset("kvarn_k4v2_g128", &p).ok());
  std::vector<uint8_t> direct(p.RecordBytes(128));
  EncodeOptions options;
  options.iterations = 0;
  ASSERT_TRUE(Codec::Default().EncodeTile(p, 128, {t.k.data(), t.v.data()}, direct, options).ok());
  EXPECT_EQ(testing::ReadBytes(req.out_path), direct);
}

TEST(CodecEncodeTest, WrongTileShapeNamesFileShapeAndPreset) {
  const std::string dir = ScratchDir();
  testing::WriteF32(dir + "/k.npy", {100, 128}, Pattern(100 * 128, 1));
  testing::WriteF32(dir + "/v.npy", {128, 128}, Pattern(128 * 128, 2));
  const auto r =
      RunCommand(&RunCodecEncode, {"--preset", "kvarn_k4v2_g128", "--keys", dir + "/k.npy",
                                   "--values", dir + "/v.npy", "--out", dir + "/r.bin"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err,
              HasSubstr(dir + "/k.npy has shape (100, 128); kvarn_k4v2_g128 needs (128, D)"));
}

TEST(CodecEncodeTest, UnsupportedHeadDimRankAndMismatchAreRejected) {
  const std::string dir = ScratchDir();
  testing::WriteF32(dir + "/d96.npy", {128, 96}, Pattern(128 * 96, 1));
  testing::WriteF32(dir + "/r3.npy", {1, 128, 128}, Pattern(128 * 128, 1));
  testing::WriteF32(dir + "/d64.npy", {128, 64}, Pattern(128 * 64, 1));
  testing::WriteF32(dir + "/d128.npy", {128, 128}, Pattern(128 * 128, 1));
  const auto encode = [&](const std::string& k, const std::string& v) {
    return RunCommand(&RunCodecEncode, {"--preset", "kvarn_k4v2_g128", "--keys", dir + "/" + k,
                                        "--values", dir + "/" + v, "--out", dir + "/r.bin"});
  };
  auto r = encode("d96.npy", "d96.npy");
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("d96.npy has shape (128, 96); kvarn_k4v2_g128 needs (128, D)"));
  EXPECT_THAT(r.err, HasSubstr("D in 64, 128, 256 or 512"));
  r = encode("r3.npy", "r3.npy");
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("r3.npy has shape (1, 128, 128); kvarn_k4v2_g128 needs (128, D)"));
  r = encode("d64.npy", "d128.npy");
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("d64.npy has head_dim 64 but " + dir + "/d128.npy has 128"));
}

TEST(CodecEncodeTest, NonFiniteAndOutOfRangeInputsAreNamed) {
  const std::string dir = ScratchDir();
  std::vector<float> k = Pattern(128 * 128, 1);
  k[3 * 128 + 7] = NAN;
  testing::WriteF32(dir + "/nan.npy", {128, 128}, k);
  k[3 * 128 + 7] = 1e6f;
  testing::WriteF32(dir + "/big.npy", {128, 128}, k);
  testing::WriteF32(dir + "/v.npy", {128, 128}, Pattern(128 * 128, 2));
  auto r = RunCommand(&RunCodecEncode, {"--preset", "kvarn_k4v2_g128", "--keys", dir + "/nan.npy",
                                        "--values", dir + "/v.npy", "--out", dir + "/r.bin"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("nan.npy: element [3, 7] is NaN; inputs must be finite"));
  r = RunCommand(&RunCodecEncode, {"--preset", "kvarn_k4v2_g128", "--keys", dir + "/big.npy",
                                   "--values", dir + "/v.npy", "--out", dir + "/r.bin"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("big.npy: element [3, 7] = 1e+06 is beyond the fp16 range"));
}

TEST(CodecEncodeTest, UnknownPresetAndMissingFilesAreUsageErrors) {
  const Tile t = MakeTile(128, 128);
  auto r = RunCommand(&RunCodecEncode, {"--preset", "kvarn_k3v2_g128", "--keys", t.keys, "--values",
                                        t.values, "--out", t.dir + "/r.bin"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("unknown preset 'kvarn_k3v2_g128'"));
  r = RunCommand(&RunCodecEncode, {"--preset", "kvarn_k4v2_g128", "--keys", t.dir + "/none.npy",
                                   "--values", t.values, "--out", t.dir + "/r.bin"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("none.npy: cannot open"));
  r = RunCommand(&RunCodecEncode,
                 {"--keys", t.keys, "--values", t.values, "--out", t.dir + "/r.bin"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("missing required flag --preset"));
}

TEST(CodecEncodeTest, UnwritableOutputIsAFailureNotAUsageError) {
  const Tile t = MakeTile(128, 128);
  const auto r =
      RunCommand(&RunCodecEncode, {"--preset", "kvarn_k4v2_g128", "--keys", t.keys, "--values",
                                   t.values, "--out", t.dir + "/no/such/r.bin"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("r.bin: cannot create"));
}

TEST(InferHeadDimTest, EveryPresetAndHeadDimIsUnambiguous) {
  for (const std::string& name : AllPresetNames()) {
    Preset p;
    ASSERT_TRUE(ParsePreset(name, &p).ok());
    for (int d : {64, 128, 256, 512}) {
      int inferred = 0;
      ASSERT_TRUE(InferHeadDim(p, p.RecordBytes(d), &inferred).ok()) << name << " " << d;
      EXPECT_EQ(inferred, d) << name;
    }
  }
}

TEST(CodecDecodeTest, WrongRecordSizeListsTheValidSizes) {
  const std::string dir = ScratchDir();
  const std::vector<uint8_t> bytes(13825, 0);
  ASSERT_TRUE(WriteFileBytes(dir + "/r.bin", bytes.data(), bytes.size()).ok());
  auto r =
      RunCommand(&RunCodecDecode, {"--preset", "kvarn_k4v2_g128", "--record", dir + "/r.bin",
                                   "--keys-out", dir + "/k.npy", "--values-out", dir + "/v.npy"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("the record is 13825 bytes, which is no kvarn_k4v2_g128 record: "
                               "its records are 7296 (D=64), 13824 (D=128), 26880 (D=256), "
                               "52992 (D=512) bytes; check --preset"));
  r = RunCommand(&RunCodecDecode,
                 {"--preset", "kvarn_k4v2_g128", "--record", dir + "/r.bin", "--keys-out",
                  dir + "/k.npy", "--values-out", dir + "/v.npy", "--head-dim", "128"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("r.bin is 13825 bytes; a kvarn_k4v2_g128 record with head_dim 128 "
                               "is 13824 bytes"));
  r = RunCommand(&RunCodecDecode,
                 {"--preset", "kvarn_k4v2_g128", "--record", dir + "/r.bin", "--keys-out",
                  dir + "/k.npy", "--values-out", dir + "/v.npy", "--head-dim", "96"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--head-dim: head_dim 96 is not supported"));
}

TEST(CodecDecodeTest, ExplicitHeadDimIsUsedAndCorruptRecordsReachTheUser) {
  const Tile t = MakeTile(128, 64);
  const std::string record = t.dir + "/r.bin";
  ASSERT_EQ(RunCommand(&RunCodecEncode, {"--preset", "kvarn_k4v2_g128", "--keys", t.keys,
                                         "--values", t.values, "--out", record})
                .code,
            0);
  auto r = RunCommand(&RunCodecDecode,
                      {"--preset", "kvarn_k4v2_g128", "--record", record, "--keys-out",
                       t.dir + "/k.npy", "--values-out", t.dir + "/v.npy", "--head-dim", "64"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("head_dim 64 given"));
  // Overwrite a_K[0] with an fp16 Inf: the codec's own check names the field.
  std::vector<uint8_t> bytes = testing::ReadBytes(record);
  Preset p;
  ASSERT_TRUE(ParsePreset("kvarn_k4v2_g128", &p).ok());
  const size_t off = p.Layout(64).k_a;
  bytes[off] = 0x00;
  bytes[off + 1] = 0x7C;
  ASSERT_TRUE(WriteFileBytes(record, bytes.data(), bytes.size()).ok());
  r = RunCommand(&RunCodecDecode, {"--preset", "kvarn_k4v2_g128", "--record", record, "--keys-out",
                                   t.dir + "/k.npy", "--values-out", t.dir + "/v.npy"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("r.bin: codec: corrupt record: a_K[0] is not finite"));
}

}  // namespace
}  // namespace kvarn::ctl
