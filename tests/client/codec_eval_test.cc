// `kvarnctl codec eval`: figures, sequence policy, output formats and input errors.
#include "client/kvarnctl/codec_eval.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <unistd.h>

#include <cmath>
#include <string>
#include <vector>

#include "client/kvarnctl/codec_command.h"
#include "client/kvarnctl/codec_synth.h"
#include "tests/client/kvarnctl_test_util.h"

namespace kvarn::ctl {
namespace {

using kvarn::testing::Json;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::ParseJsonLines;
using testing::Pattern;
using testing::RunCommand;
using testing::ScratchDir;

// Synthetic K/V written once for the suite.
class CodecEvalSynth : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // CTest runs each test as its own process, in parallel: one directory per process.
    dir_ = new std::string(::testing::TempDir() + "/kvarnctl_eval_synth." + std::to_string(getpid()));
    std::vector<std::string> files;
    ASSERT_TRUE(WriteSynthetic(*dir_, MakeSynthetic(SynthOptions{}), &files).ok());
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  static std::string File(const char* name) { return *dir_ + "/" + name; }

  static std::vector<Json> EvalJson(std::vector<std::string> extra) {
    std::vector<std::string> args = {"--keys", File("k.npy"), "--values", File("v.npy"), "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    const auto r = RunCommand(&RunCodecEval, args);
    EXPECT_EQ(r.code, 0) << r.err;
    return ParseJsonLines(r.out);
  }

  static std::string* dir_;
};
std::string* CodecEvalSynth::dir_ = nullptr;

TEST_F(CodecEvalSynth, JsonHasSaneFiguresAndKvarnBeatsKivi) {
  const std::vector<Json> rows =
      EvalJson({"--queries", File("q.npy"), "--preset", "kvarn_k4v2_g128", "--preset",
                "kivi_k4v2_g128", "--preset", "hadamard_k4v2_g128", "--preset", "fp16"});
  ASSERT_EQ(rows.size(), 4u);
  const Json& kvarn = rows[0];
  const Json& kivi = rows[1];
  const Json& fp16 = rows[3];
  EXPECT_EQ(kvarn["preset"].AsString(), "kvarn_k4v2_g128");
  EXPECT_EQ(kvarn["method"].AsString(), "kvarn");
  EXPECT_EQ(kvarn["heads"].AsNumber(), 4);
  EXPECT_EQ(kvarn["tokens"].AsNumber(), 2048);
  EXPECT_EQ(kvarn["head_dim"].AsNumber(), 128);
  EXPECT_EQ(kvarn["sink_tokens"].AsNumber(), 128);
  EXPECT_EQ(kvarn["tiles_per_head"].AsNumber(), 15);
  EXPECT_EQ(kvarn["tail_tokens"].AsNumber(), 0);
  EXPECT_DOUBLE_EQ(kvarn["bits_per_element"].AsNumber(), 3.375);
  EXPECT_NEAR(kvarn["compression_ratio"].AsNumber(), 4.74, 0.005);
  // One fp16 tile of 16 and 15 tiles of 3.375 bits per element.
  EXPECT_NEAR(kvarn["effective_bits_per_element"].AsNumber(), (16 + 15 * 3.375) / 16, 1e-5);
  EXPECT_EQ(kvarn["queries"].AsString(), "file");
  EXPECT_EQ(kvarn["num_queries"].AsNumber(), 16);
  EXPECT_EQ(kvarn["query_seed"].kind(), Json::Kind::kNull);
  EXPECT_EQ(kvarn["iterations"].AsNumber(), 8);
  EXPECT_GT(kvarn["encode_gbps"].AsNumber(), 0);
  EXPECT_GT(kvarn["decode_gbps"].AsNumber(), 0);
  for (const Json& r : rows) {
    SCOPED_TRACE(r["preset"].AsString());
    EXPECT_GE(r["attn_cosine_mean"].AsNumber(), r["attn_cosine_min"].AsNumber());
    EXPECT_LE(r["attn_cosine_mean"].AsNumber(), 1.0 + 1e-9);
    EXPECT_GT(r["attn_cosine_min"].AsNumber(), 0.5);
    EXPECT_LE(r["k_rel_l2"].AsNumber(), r["k_rel_l2_quantized"].AsNumber() + 1e-9);
  }
  // fp16: fp16 rounding only.
  EXPECT_DOUBLE_EQ(fp16["bits_per_element"].AsNumber(), 16.0);
  EXPECT_LT(fp16["k_rel_l2"].AsNumber(), 1e-3);
  EXPECT_LT(fp16["v_rel_l2"].AsNumber(), 1e-3);
  EXPECT_LT(fp16["attn_rel_l2"].AsNumber(), 2e-3);
  EXPECT_GT(fp16["attn_cosine_min"].AsNumber(), 0.99999);
  // Quantized presets err more than fp16, and kvarn less than kivi at the same bits.
  EXPECT_GT(kvarn["attn_rel_l2"].AsNumber(), 10 * fp16["attn_rel_l2"].AsNumber());
  EXPECT_LT(kvarn["attn_rel_l2"].AsNumber(), kivi["attn_rel_l2"].AsNumber());
  EXPECT_LT(kvarn["v_rel_l2"].AsNumber(), kivi["v_rel_l2"].AsNumber());
  EXPECT_LT(kvarn["k_rel_l2"].AsNumber(), kivi["k_rel_l2"].AsNumber());
}

TEST_F(CodecEvalSynth, JsonKeysAreStableAndInOrder) {
  const auto r = RunCommand(&RunCodecEval, {"--keys", File("k.npy"), "--values", File("v.npy"),
                                            "--preset", "kvarn_k4v2_g128", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const char* keys[] = {"preset",
                        "method",
                        "key_bits",
                        "value_bits",
                        "tile_tokens",
                        "heads",
                        "tokens",
                        "head_dim",
                        "sink_tokens",
                        "tiles_per_head",
                        "tail_tokens",
                        "bits_per_element",
                        "effective_bits_per_element",
                        "compression_ratio",
                        "effective_compression_ratio",
                        "k_rel_l2",
                        "v_rel_l2",
                        "k_rel_l2_quantized",
                        "v_rel_l2_quantized",
                        "attn_rel_l2",
                        "attn_cosine_mean",
                        "attn_cosine_min",
                        "queries",
                        "num_queries",
                        "query_seed",
                        "iterations",
                        "encode_gbps",
                        "decode_gbps",
                        "encode_seconds",
                        "decode_seconds"};
  size_t pos = 0;
  for (const char* key : keys) {
    const size_t at = r.out.find(std::string("\"") + key + "\":", pos);
    ASSERT_NE(at, std::string::npos) << key;
    pos = at;
  }
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1);
}

TEST_F(CodecEvalSynth, RandomQueriesAreSeededAndSaidSo) {
  const auto a = EvalJson({"--preset", "kvarn_k4v2_g128", "--seed", "7"});
  const auto b = EvalJson({"--preset", "kvarn_k4v2_g128", "--seed", "7"});
  const auto c = EvalJson({"--preset", "kvarn_k4v2_g128", "--seed", "8", "--random-queries", "3"});
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0]["queries"].AsString(), "random");
  EXPECT_EQ(a[0]["query_seed"].AsNumber(), 7);
  EXPECT_EQ(a[0]["num_queries"].AsNumber(), 4 * 16);
  EXPECT_EQ(a[0]["attn_rel_l2"].AsNumber(), b[0]["attn_rel_l2"].AsNumber());
  EXPECT_NE(a[0]["attn_rel_l2"].AsNumber(), c[0]["attn_rel_l2"].AsNumber());
  EXPECT_EQ(c[0]["num_queries"].AsNumber(), 4 * 3);

  const auto table = RunCommand(&RunCodecEval, {"--keys", File("k.npy"), "--values", File("v.npy"),
                                                "--preset", "kvarn_k4v2_g128", "--seed", "7"});
  ASSERT_EQ(table.code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("queries: 16 per head, random: every channel N(0, 1), seed 7"));
}

TEST_F(CodecEvalSynth, TableIsAlignedAndExplainsItself) {
  const auto r = RunCommand(&RunCodecEval, {"--keys", File("k.npy"), "--values", File("v.npy"),
                                            "--queries", File("q.npy"), "--preset",
                                            "kvarn_k4v2_g128", "--preset", "hadamard_k4v2_g64"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("4 heads x 2048 tokens x head_dim 128, float32"));
  EXPECT_THAT(r.out, HasSubstr("per head: 128-token fp16 sink, 15 quantized tiles of 128 tokens, "
                               "0-token fp16 tail (kvarn_k4v2_g128)"));
  EXPECT_THAT(r.out, HasSubstr("per head: 64-token fp16 sink, 31 quantized tiles of 64 tokens, "
                               "0-token fp16 tail (hadamard_k4v2_g64)"));
  EXPECT_THAT(r.out, HasSubstr("queries: 4 per query head from " + File("q.npy")));
  // Every table row has the same width up to its last column.
  std::vector<std::string> rows;
  std::istringstream in(r.out);
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with("preset ") || line.starts_with("kvarn_k4v2_g128 ") ||
        line.starts_with("hadamard_k4v2_g64 ")) {
      rows.push_back(line);
    }
  }
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].size(), rows[1].size());
  EXPECT_EQ(rows[1].size(), rows[2].size());
  EXPECT_THAT(r.out, Not(HasSubstr("\r")));
  EXPECT_EQ(r.err, "");
}

TEST_F(CodecEvalSynth, ProgressGoesToStderrOnlyForLargeInputsOnATerminal) {
  const std::vector<std::string> args = {"--keys",      File("k.npy"),    "--values",
                                         File("v.npy"), "--preset",       "kvarn_k4v2_g128",
                                         "--preset",    "kivi_k4v2_g128", "--json"};
  // 2 presets x 4 heads x 15 tiles = 120 tiles of work: drawn on a terminal.
  auto r = RunCommand(&RunCodecEval, args, /*err_is_terminal=*/true);
  ASSERT_EQ(r.code, 0);
  EXPECT_THAT(r.err, HasSubstr("100%"));
  EXPECT_THAT(r.err, HasSubstr("\r["));
  EXPECT_THAT(r.out, Not(HasSubstr("%")));
  EXPECT_EQ(ParseJsonLines(r.out).size(), 2u);
  // Not a terminal: nothing, unless asked for.
  r = RunCommand(&RunCodecEval, args, /*err_is_terminal=*/false);
  EXPECT_EQ(r.err, "");
  std::vector<std::string> always = args;
  always.insert(always.end(), {"--progress", "always"});
  r = RunCommand(&RunCodecEval, always, false);
  EXPECT_THAT(r.err, HasSubstr("100%"));
  // One preset on one head of 1024 tokens: 7 tiles, small, no bar even on a terminal.
  const std::string dir = ScratchDir();
  SynthOptions small;
  small.tokens = 1024;
  small.heads = 1;
  std::vector<std::string> files;
  ASSERT_TRUE(WriteSynthetic(dir, MakeSynthetic(small), &files).ok());
  r = RunCommand(&RunCodecEval,
                 {"--keys", files[0], "--values", files[1], "--preset", "kvarn_k4v2_g128"}, true);
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.err, "");
  r = RunCommand(&RunCodecEval, {"--keys", files[0], "--values", files[1], "--preset", "fp16",
                                 "--progress", "sometimes"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--progress sometimes is not auto, always or never"));
}

// Small hand-made inputs for the policy and error paths.
class CodecEvalInputs : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = ScratchDir(); }
  std::string Write(const std::string& name, std::vector<size_t> shape, uint32_t seed = 1) {
    size_t n = 1;
    for (size_t s : shape) n *= s;
    testing::WriteF32(dir_ + "/" + name, shape, Pattern(n, seed, 2.0f));
    return dir_ + "/" + name;
  }
  testing::RunResult Eval(std::vector<std::string> args) { return RunCommand(&RunCodecEval, args); }
  std::string dir_;
};

TEST_F(CodecEvalInputs, SequencePolicySplitsSinkTilesAndTail) {
  const std::string k = Write("k.npy", {300, 64}, 1), v = Write("v.npy", {300, 64}, 2);
  auto rows = ParseJsonLines(
      Eval({"--keys", k, "--values", v, "--preset", "kvarn_k4v2_g128", "--json"}).out);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0]["heads"].AsNumber(), 1);
  EXPECT_EQ(rows[0]["sink_tokens"].AsNumber(), 128);
  EXPECT_EQ(rows[0]["tiles_per_head"].AsNumber(), 1);
  EXPECT_EQ(rows[0]["tail_tokens"].AsNumber(), 44);
  Preset p;
  ASSERT_TRUE(ParsePreset("kvarn_k4v2_g128", &p).ok());
  const double bits = (172.0 * 2 * 64 * 16 + 8.0 * p.RecordBytes(64)) / (300.0 * 2 * 64);
  EXPECT_NEAR(rows[0]["effective_bits_per_element"].AsNumber(), bits, 1e-5);

  rows = ParseJsonLines(Eval({"--keys", k, "--values", v, "--preset", "kvarn_k4v2_g128",
                              "--sink-tokens", "0", "--json"})
                            .out);
  EXPECT_EQ(rows[0]["sink_tokens"].AsNumber(), 0);
  EXPECT_EQ(rows[0]["tiles_per_head"].AsNumber(), 2);
  EXPECT_EQ(rows[0]["tail_tokens"].AsNumber(), 44);

  rows = ParseJsonLines(Eval({"--keys", k, "--values", v, "--preset", "kvarn_k4v2_g128",
                              "--sink-tokens", "128", "--json"})
                            .out);
  EXPECT_EQ(rows[0]["sink_tokens"].AsNumber(), 128);
}

TEST_F(CodecEvalInputs, ShortSequenceIsAllFp16AndSaysNoneForTheQuantizedPart) {
  const std::string k = Write("k.npy", {1, 1, 128}, 1), v = Write("v.npy", {1, 1, 128}, 2);
  const auto r = Eval({"--keys", k, "--values", v, "--preset", "kvarn_k2v2_g64", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto rows = ParseJsonLines(r.out);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0]["sink_tokens"].AsNumber(), 1);
  EXPECT_EQ(rows[0]["tiles_per_head"].AsNumber(), 0);
  EXPECT_EQ(rows[0]["k_rel_l2_quantized"].kind(), Json::Kind::kNull);
  EXPECT_EQ(rows[0]["encode_gbps"].kind(), Json::Kind::kNull);
  EXPECT_DOUBLE_EQ(rows[0]["effective_bits_per_element"].AsNumber(), 16.0);
  EXPECT_LT(rows[0]["attn_rel_l2"].AsNumber(), 1e-3);
  // The table shows '-' for what does not exist.
  const auto table = Eval({"--keys", k, "--values", v, "--preset", "kvarn_k2v2_g64"});
  EXPECT_THAT(table.out, HasSubstr("       -"));
}

TEST_F(CodecEvalInputs, QueryShapesIncludingGroupedQueryAttention) {
  const std::string k = Write("k.npy", {2, 200, 64}, 1), v = Write("v.npy", {2, 200, 64}, 2);
  const std::string q2 = Write("q2.npy", {3, 64}, 3);
  const std::string q3 = Write("q3.npy", {2, 5, 64}, 4);
  const std::string gqa = Write("gqa.npy", {4, 70, 64}, 5);  // 70 > 64 per AttendDecode call
  auto rows = ParseJsonLines(
      Eval({"--keys", k, "--values", v, "--queries", q2, "--preset", "hadamard_k4v4_g64", "--json"})
          .out);
  EXPECT_EQ(rows.at(0)["num_queries"].AsNumber(), 6);
  rows = ParseJsonLines(
      Eval({"--keys", k, "--values", v, "--queries", q3, "--preset", "fp16", "--json"}).out);
  EXPECT_EQ(rows.at(0)["num_queries"].AsNumber(), 10);
  EXPECT_LT(rows.at(0)["attn_rel_l2"].AsNumber(), 2e-3);
  rows = ParseJsonLines(
      Eval({"--keys", k, "--values", v, "--queries", gqa, "--preset", "fp16", "--json"}).out);
  EXPECT_EQ(rows.at(0)["num_queries"].AsNumber(), 280);
  EXPECT_LT(rows.at(0)["attn_rel_l2"].AsNumber(), 2e-3);
}

TEST_F(CodecEvalInputs, ExactAttentionUsesTheGroupMapping) {
  KvTensor keys, values;
  keys.heads = values.heads = 2;
  keys.tokens = values.tokens = 2;
  keys.head_dim = values.head_dim = 64;
  keys.data.assign(2 * 2 * 64, 0.0f);  // equal scores: the output is the mean of the values
  values.data.assign(2 * 2 * 64, 0.0f);
  values.data[0] = 2;           // head 0, token 0, channel 0
  values.data[2 * 64 + 1] = 4;  // head 1, token 0, channel 1
  QuerySet q;
  q.query_heads = 4;
  q.per_head = 1;
  q.head_dim = 64;
  q.data.assign(4 * 64, 1.0f);
  const std::vector<double> out = ExactAttention(keys, values, q);
  EXPECT_DOUBLE_EQ(out[0 * 64 + 0], 1.0);  // query heads 0, 1 read kv-head 0
  EXPECT_DOUBLE_EQ(out[1 * 64 + 0], 1.0);
  EXPECT_DOUBLE_EQ(out[2 * 64 + 1], 2.0);  // query heads 2, 3 read kv-head 1
  EXPECT_DOUBLE_EQ(out[3 * 64 + 0], 0.0);
}

TEST_F(CodecEvalInputs, Float16InputsAreAccepted) {
  const std::vector<float> data = Pattern(256 * 64, 9);
  testing::WriteF16(dir_ + "/k.npy", {256, 64}, data);
  testing::WriteF16(dir_ + "/v.npy", {256, 64}, data);
  const auto r =
      Eval({"--keys", dir_ + "/k.npy", "--values", dir_ + "/v.npy", "--preset", "kvarn_k4v2_g128"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("1 head x 256 tokens x head_dim 64, float16"));
}

struct BadInput {
  const char* name;
  std::vector<size_t> k_shape, v_shape, q_shape;  // q_shape empty: no --queries
  int poison;                                     // 0 none, 1 NaN, 2 +Inf, 3 beyond fp16
  std::vector<std::string> extra;
  const char* message;
};

TEST_F(CodecEvalInputs, EveryBadInputHasItsOwnMessageAndExitCode2) {
  const std::vector<size_t> kv = {2, 130, 64};
  // clang-format off
  const BadInput cases[] = {
      {"nan", kv, kv, {}, 1, {},
       "k.npy: element [1, 2, 3] is NaN; inputs must be finite"},
      {"inf", kv, kv, {}, 2, {},
       "k.npy: element [1, 2, 3] is Inf; inputs must be finite"},
      {"huge", kv, kv, {}, 3, {},
       "k.npy: element [1, 2, 3] = 100000 is beyond the fp16 range"},
      {"rank1", {64}, {64}, {}, 0, {},
       "k.npy has shape (64,) (rank 1); expected [T, D] or [H, T, D]"},
      {"rank4", {1, 2, 8, 64}, {1, 2, 8, 64}, {}, 0, {},
       "(rank 4); expected [T, D] or [H, T, D] (for a PyTorch [B, H, T, D] cache, save one "
       "batch entry: k[b])"},
      {"mismatch", kv, {2, 129, 64}, {}, 0, {},
       "k.npy has shape (2, 130, 64) but "},
      {"dim", {2, 130, 96}, {2, 130, 96}, {}, 0, {},
       "k.npy has shape (2, 130, 96): head_dim 96 is not supported: use 64, 128, 256 or 512"},
      {"empty", {2, 0, 64}, {2, 0, 64}, {}, 0, {},
       "k.npy has shape (2, 0, 64): T = 0 tokens; need at least 1"},
      {"qdim", kv, kv, {4, 128}, 0, {},
       "q.npy has shape (4, 128): head_dim 128 does not match the keys' 64"},
      {"qheads", kv, kv, {3, 4, 64}, 0, {},
       "q.npy has shape (3, 4, 64); expected [Nq, 64] or [H*g, Nq, 64] with H = 2 kv-heads"},
      {"qrank", kv, kv, {64}, 0, {},
       "q.npy has shape (64,); expected"},
      {"preset", kv, kv, {}, 0, {"--preset", "kvarn_k8v2_g128"},
       "--preset: unknown preset 'kvarn_k8v2_g128'"},
      {"sink", kv, kv, {}, 0, {"--sink-tokens", "64"},
       "--sink-tokens 64 is not 0 or kvarn_k4v2_g128's tile size 128"},
      {"sinknum", kv, kv, {}, 0, {"--sink-tokens", "x"},
       "--sink-tokens: 'x' is not an integer"},
      {"iters", kv, kv, {}, 0, {"--iterations", "100"},
       "--iterations: 100 is out of range 0..64"},
      {"both", kv, kv, {4, 64}, 0, {"--random-queries", "4"},
       "--random-queries and --queries exclude each other"},
  };
  // clang-format on
  for (const BadInput& c : cases) {
    SCOPED_TRACE(c.name);
    size_t n = 1;
    for (size_t s : c.k_shape) n *= s;
    std::vector<float> k = Pattern(n, 1);
    if (c.poison != 0) {
      k[(1 * 130 + 2) * 64 + 3] = c.poison == 1 ? NAN : c.poison == 2 ? INFINITY : 1e5f;
    }
    testing::WriteF32(dir_ + "/k.npy", c.k_shape, k);
    Write("v.npy", c.v_shape, 2);
    std::vector<std::string> args = {"--keys",        dir_ + "/k.npy", "--values",
                                     dir_ + "/v.npy", "--preset",      "kvarn_k4v2_g128"};
    if (!c.q_shape.empty()) {
      Write("q.npy", c.q_shape, 3);
      args.insert(args.end(), {"--queries", dir_ + "/q.npy"});
    }
    args.insert(args.end(), c.extra.begin(), c.extra.end());
    const auto r = Eval(args);
    EXPECT_EQ(r.code, 2);
    EXPECT_THAT(r.err, HasSubstr(c.message));
    EXPECT_EQ(r.out, "");
  }
}

TEST_F(CodecEvalInputs, CodecErrorsReachTheUserWithTheirPlace) {
  // A constant tile of 60000: in range, but rotated it is 60000 * sqrt(64) on one channel,
  // which no fp16 zero point holds without balancing. The codec refuses it, and its message arrives
  // with the preset, head and tokens in front.
  const std::vector<float> k(256 * 64, 60000.0f), v(256 * 64, 1.0f);
  testing::WriteF32(dir_ + "/k.npy", {256, 64}, k);
  testing::WriteF32(dir_ + "/v.npy", {256, 64}, v);
  auto r = Eval({"--keys", dir_ + "/k.npy", "--values", dir_ + "/v.npy", "--preset",
                 "hadamard_k4v2_g128", "--sink-tokens", "0"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("hadamard_k4v2_g128: head 0, tokens 0..127: codec: tile magnitudes "
                               "exceed what the record's fp16 scales can hold"));
  // The same in the fp16 sink is refused by StoreTokens, naming the token.
  r = Eval({"--keys", dir_ + "/k.npy", "--values", dir_ + "/v.npy", "--preset", "kvarn_k4v2_g128"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("kvarn_k4v2_g128: head 0, fp16 sink: codec: keys of token 0 (layer 0, "
                               "kv-head 0) overflow fp16 once rotated"));
}

TEST(SinkPolicyTest, AcceptsZeroGAndTheTileSize) {
  Preset g128, g64;
  ASSERT_TRUE(ParsePreset("kvarn_k4v2_g128", &g128).ok());
  ASSERT_TRUE(ParsePreset("kivi_k4v2_g64", &g64).ok());
  SinkPolicy s;
  ASSERT_TRUE(ParseSinkPolicy("0", {g128, g64}, &s).ok());
  EXPECT_EQ(s, SinkPolicy::kNone);
  ASSERT_TRUE(ParseSinkPolicy("G", {g128, g64}, &s).ok());
  EXPECT_EQ(s, SinkPolicy::kTile);
  ASSERT_TRUE(ParseSinkPolicy("64", {g64}, &s).ok());
  EXPECT_EQ(s, SinkPolicy::kTile);
  EXPECT_FALSE(ParseSinkPolicy("128", {g128, g64}, &s).ok());
}

}  // namespace
}  // namespace kvarn::ctl
