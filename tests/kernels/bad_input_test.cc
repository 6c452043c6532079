// Bad input: every entry point answers kInvalidArgument with a message naming the problem,
// and writes nothing to its outputs (each output buffer is pre-filled with a pattern that
// must survive the call). Run for both implementations.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "kernels/codec.h"
#include "kernels/fp16.h"
#include "tests/kernels/codec_test_util.h"

namespace kvarn {
namespace {

using test::Gaussian;
using test::MustParse;

// An output buffer pre-filled with a position-dependent byte pattern.
class Guarded {
 public:
  explicit Guarded(size_t bytes) : bytes_(bytes) {
    for (size_t i = 0; i < bytes; ++i) bytes_[i] = static_cast<uint8_t>(0xA5 ^ (i * 37));
    pristine_ = bytes_;
  }
  float* f32() { return reinterpret_cast<float*>(bytes_.data()); }
  uint8_t* data() { return bytes_.data(); }
  std::span<uint8_t> span() { return bytes_; }
  // True when no byte changed since construction.
  bool Untouched() const { return bytes_ == pristine_; }

 private:
  std::vector<uint8_t> bytes_, pristine_;
};

::testing::AssertionResult IsInvalidArgument(const CodecStatus& s,
                                             std::initializer_list<const char*> substrings) {
  if (s.code() != CodecCode::kInvalidArgument) {
    return ::testing::AssertionFailure() << "expected INVALID_ARGUMENT, got " << s.ToString();
  }
  for (const char* sub : substrings) {
    if (s.message().find(sub) == std::string::npos) {
      return ::testing::AssertionFailure()
             << "message '" << s.message() << "' lacks '" << sub << "'";
    }
  }
  return ::testing::AssertionSuccess();
}

class BadInputTest : public ::testing::TestWithParam<const Codec*> {
 protected:
  const Codec& codec() const { return *GetParam(); }
};

// ---- head_dim -------------------------------------------------------------------------

TEST_P(BadInputTest, RejectsUnsupportedHeadDims) {
  const Preset p = MustParse("kvarn_k4v2_g128");
  // Inputs and buffers large enough for head_dim 1024, so a missing check cannot overrun.
  const size_t big = 128 * 1024;
  const std::vector<float> k = Gaussian(big, 1), v = Gaussian(big, 2), q = Gaussian(1024, 3);
  const std::vector<uint8_t> valid_record =
      test::EncodeOrDie(codec(), p, 128, std::vector<float>(k.begin(), k.begin() + 128 * 128),
                        std::vector<float>(v.begin(), v.begin() + 128 * 128));
  for (int d : {0, -64, 1, 32, 63, 96, 100, 192, 1024, 4096}) {
    SCOPED_TRACE("head_dim " + std::to_string(d));
    const std::string dim = std::to_string(d);
    Guarded record(p.RecordBytes(128));
    EXPECT_TRUE(IsInvalidArgument(codec().EncodeTile(p, d, {k.data(), v.data()}, record.span()),
                                  {"head_dim", dim.c_str()}));
    EXPECT_TRUE(record.Untouched());

    Guarded ko(big * 4), vo(big * 4);
    EXPECT_TRUE(IsInvalidArgument(codec().DecodeTile(p, d, valid_record, {ko.data(), vo.data()}),
                                  {"head_dim", dim.c_str()}));
    EXPECT_TRUE(ko.Untouched() && vo.Untouched());

    const uint8_t* tiles[] = {valid_record.data()};
    SequenceView seq;
    seq.tiles = tiles;
    Guarded out(1024 * 4);
    EXPECT_TRUE(IsInvalidArgument(codec().AttendDecode(p, d, q.data(), 1, seq, out.f32()),
                                  {"head_dim", dim.c_str()}));
    EXPECT_TRUE(out.Untouched());
  }
}

// ---- element values -------------------------------------------------------------------

struct BadValue {
  float f32;
  const char* says;  // what the message must name
};
const BadValue kBadF32[] = {
    {std::numeric_limits<float>::quiet_NaN(), "NaN"},
    {-std::numeric_limits<float>::quiet_NaN(), "NaN"},
    {std::numeric_limits<float>::signaling_NaN(), "NaN"},
    {std::numeric_limits<float>::infinity(), "Inf"},
    {-std::numeric_limits<float>::infinity(), "Inf"},
    {65536.0f, "fp16 range"},
    {-70000.0f, "fp16 range"},
    {1e30f, "fp16 range"},
    {-std::numeric_limits<float>::max(), "fp16 range"},
};
struct BadHalf {
  uint16_t bits;
  const char* says;
};
const BadHalf kBadF16[] = {
    {0x7E00, "NaN"}, {0xFE00, "NaN"}, {0x7C01, "NaN"},
    {0x7FFF, "NaN"}, {0x7C00, "Inf"}, {0xFC00, "Inf"},
};

// Positions of the bad element in a [G][D] tile: first, middle, last.
std::vector<size_t> Positions(size_t n) { return {0, n / 2 + 3, n - 1}; }

TEST_P(BadInputTest, RejectsNonFiniteOrOutOfRangeF32KeysAndValues) {
  for (const std::string& name : AllPresetNames()) {
    const Preset p = MustParse(name);
    for (int d : {64, 128}) {
      const size_t n = static_cast<size_t>(p.tile_tokens) * d;
      std::vector<float> k = Gaussian(n, 4), v = Gaussian(n, 5);
      for (const BadValue& bad : kBadF32) {
        for (size_t pos : Positions(n)) {
          for (bool in_values : {false, true}) {
            for (Frame frame : {Frame::kOriginal, Frame::kStorage}) {
              SCOPED_TRACE(name + " D=" + std::to_string(d) + " value=" + std::to_string(bad.f32) +
                           " pos=" + std::to_string(pos) + (in_values ? " in values" : " in keys") +
                           (frame == Frame::kStorage ? " storage" : " original"));
              float& slot = (in_values ? v : k)[pos];
              const float saved = slot;
              slot = bad.f32;
              Guarded record(p.RecordBytes(d));
              const CodecStatus s =
                  codec().EncodeTile(p, d, {k.data(), v.data(), DType::kF32, frame}, record.span());
              slot = saved;
              EXPECT_TRUE(IsInvalidArgument(s, {in_values ? "values" : "keys", bad.says}));
              EXPECT_TRUE(record.Untouched());
            }
          }
        }
      }
    }
  }
}

TEST_P(BadInputTest, NamesTheTokenAndChannelOfTheFirstBadElement) {
  const Preset p = MustParse("kvarn_k4v2_g128");
  const int d = 128;
  std::vector<float> k = Gaussian(128 * d, 6), v = Gaussian(128 * d, 7);
  v[77 * d + 5] = std::numeric_limits<float>::infinity();
  v[90 * d + 1] = std::numeric_limits<float>::quiet_NaN();
  Guarded record(p.RecordBytes(d));
  EXPECT_TRUE(IsInvalidArgument(codec().EncodeTile(p, d, {k.data(), v.data()}, record.span()),
                                {"values", "token 77", "channel 5", "Inf"}));
  EXPECT_TRUE(record.Untouched());
}

TEST_P(BadInputTest, RejectsNaNAndInfInF16KeysAndValues) {
  for (const std::string& name : AllPresetNames()) {
    const Preset p = MustParse(name);
    const int d = 128;
    const size_t n = static_cast<size_t>(p.tile_tokens) * d;
    std::vector<uint16_t> k = test::ToHalf(Gaussian(n, 8)), v = test::ToHalf(Gaussian(n, 9));
    for (const BadHalf& bad : kBadF16) {
      for (size_t pos : Positions(n)) {
        for (bool in_values : {false, true}) {
          SCOPED_TRACE(name + " bits=" + std::to_string(bad.bits) + " pos=" + std::to_string(pos) +
                       (in_values ? " in values" : " in keys"));
          uint16_t& slot = (in_values ? v : k)[pos];
          const uint16_t saved = slot;
          slot = bad.bits;
          Guarded record(p.RecordBytes(d));
          const CodecStatus s =
              codec().EncodeTile(p, d, {k.data(), v.data(), DType::kF16}, record.span());
          slot = saved;
          EXPECT_TRUE(IsInvalidArgument(s, {in_values ? "values" : "keys", bad.says}));
          EXPECT_TRUE(record.Untouched());
        }
      }
    }
  }
}

TEST_P(BadInputTest, AcceptsTheLargestFiniteFp16Magnitude) {
  const int d = 128;
  for (const char* name : {"fp16", "kivi_k4v4_g128", "kivi_k2v2_g64"}) {
    SCOPED_TRACE(name);
    const Preset p = MustParse(name);
    const size_t n = static_cast<size_t>(p.tile_tokens) * d;
    std::vector<float> k = Gaussian(n, 10), v = Gaussian(n, 11);
    k[3] = 65504.0f;
    v[n - 1] = -65504.0f;
    std::vector<uint8_t> record(p.RecordBytes(d));
    const CodecStatus s = codec().EncodeTile(p, d, {k.data(), v.data()}, record);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
}

TEST_P(BadInputTest, RejectsHadamardTilesWhoseRotatedMagnitudesOverflowTheFp16Scales) {
  // A constant tile of 60000 rotates into channel 0 = 60000 * sqrt(D), beyond fp16, so the
  // key offsets b_K cannot be stored. (kvarn presets absorb such magnitudes into the
  // per-token balancing scale, so they accept this tile.)
  const int d = 128;
  for (const std::string& name : test::QuantizedPresetNames()) {
    const Preset p = MustParse(name);
    if (p.method != Method::kHadamard) continue;
    SCOPED_TRACE(name);
    const size_t n = static_cast<size_t>(p.tile_tokens) * d;
    const std::vector<float> k(n, 60000.0f), v = Gaussian(n, 12);
    Guarded record(p.RecordBytes(d));
    EXPECT_TRUE(
        IsInvalidArgument(codec().EncodeTile(p, d, {k.data(), v.data()}, record.span()), {"fp16"}));
    EXPECT_TRUE(record.Untouched());
  }
}

TEST_P(BadInputTest, RejectsMissingTileOrOutputPointers) {
  const Preset p = MustParse("kvarn_k4v2_g64");
  const int d = 64;
  const std::vector<float> k = Gaussian(64 * d, 13), v = Gaussian(64 * d, 14);
  Guarded record(p.RecordBytes(d));
  EXPECT_TRUE(IsInvalidArgument(codec().EncodeTile(p, d, {nullptr, v.data()}, record.span()), {}));
  EXPECT_TRUE(IsInvalidArgument(codec().EncodeTile(p, d, {k.data(), nullptr}, record.span()), {}));
  EXPECT_TRUE(record.Untouched());
  const std::vector<uint8_t> valid = test::EncodeOrDie(codec(), p, d, k, v);
  Guarded out(64 * d * 4);
  EXPECT_TRUE(IsInvalidArgument(codec().DecodeTile(p, d, valid, {out.data(), nullptr}), {}));
  EXPECT_TRUE(IsInvalidArgument(codec().DecodeTile(p, d, valid, {nullptr, out.data()}), {}));
  EXPECT_TRUE(out.Untouched());
}

// ---- record sizes ---------------------------------------------------------------------

TEST_P(BadInputTest, RejectsRecordBuffersOfTheWrongSize) {
  for (const std::string& name : AllPresetNames()) {
    const Preset p = MustParse(name);
    for (int d : test::kHeadDims) {
      SCOPED_TRACE(name + " D=" + std::to_string(d));
      const size_t want = p.RecordBytes(d);
      const size_t n = static_cast<size_t>(p.tile_tokens) * d;
      const std::vector<float> k = Gaussian(n, 15), v = Gaussian(n, 16);
      const std::string want_text = std::to_string(want);
      for (size_t size : {want - 1, want + 1, size_t{0}}) {
        SCOPED_TRACE("size " + std::to_string(size));
        Guarded record(want + 1);
        const std::span<uint8_t> wrong =
            size == 0 ? std::span<uint8_t>() : record.span().first(size);
        EXPECT_TRUE(IsInvalidArgument(codec().EncodeTile(p, d, {k.data(), v.data()}, wrong),
                                      {want_text.c_str()}));
        EXPECT_TRUE(record.Untouched());
      }
      std::vector<uint8_t> valid(want + 1, 0);
      ASSERT_TRUE(
          codec().EncodeTile(p, d, {k.data(), v.data()}, std::span(valid).first(want)).ok());
      for (size_t size : {want - 1, want + 1, size_t{0}}) {
        SCOPED_TRACE("size " + std::to_string(size));
        Guarded ko(n * 4), vo(n * 4);
        const std::span<const uint8_t> wrong =
            size == 0 ? std::span<const uint8_t>() : std::span<const uint8_t>(valid).first(size);
        EXPECT_TRUE(IsInvalidArgument(codec().DecodeTile(p, d, wrong, {ko.data(), vo.data()}),
                                      {want_text.c_str()}));
        EXPECT_TRUE(ko.Untouched() && vo.Untouched());
      }
    }
  }
}

// ---- presets and options --------------------------------------------------------------

TEST_P(BadInputTest, RejectsMalformedPresetStructs) {
  const Preset malformed[] = {
      {Method::kKvarn, 3, 2, 128},          {Method::kKvarn, 4, 3, 128},
      {Method::kKvarn, 8, 2, 128},          {Method::kKvarn, 4, 8, 128},
      {Method::kKvarn, 0, 0, 128},          {Method::kKvarn, -4, 2, 128},
      {Method::kKvarn, 4, 2, 100},          {Method::kKvarn, 4, 2, 0},
      {Method::kKvarn, 4, 2, 256},          {Method::kKvarn, 4, 2, 32},
      {Method::kKvarn, 4, 2, -128},         {Method::kKivi, 16, 16, 128},
      {Method::kHadamard, 1, 2, 64},        {Method::kFp16, 4, 2, 128},
      {Method::kFp16, 16, 16, 64},          {Method::kFp16, 16, 16, 256},
      {Method::kFp16, 8, 8, 128},           {static_cast<Method>(7), 4, 2, 128},
      {static_cast<Method>(-1), 4, 2, 128},
  };
  const int d = 128;
  // Inputs and buffers large enough for the largest tile above.
  const size_t big = 256 * d;
  const std::vector<float> k = Gaussian(big, 17), v = Gaussian(big, 18), q = Gaussian(d, 19);
  const Preset good = MustParse("kvarn_k4v2_g128");
  std::vector<uint8_t> valid(4 * big, 0);
  ASSERT_TRUE(
      codec()
          .EncodeTile(good, d, {k.data(), v.data()}, std::span(valid).first(good.RecordBytes(d)))
          .ok());
  for (const Preset& p : malformed) {
    SCOPED_TRACE(::testing::Message()
                 << "method " << static_cast<int>(p.method) << " k" << p.key_bits << " v"
                 << p.value_bits << " g" << p.tile_tokens);
    for (size_t size : {good.RecordBytes(d), 2 * big}) {
      Guarded record(size);
      EXPECT_TRUE(IsInvalidArgument(codec().EncodeTile(p, d, {k.data(), v.data()}, record.span()),
                                    {"preset"}));
      EXPECT_TRUE(record.Untouched());
      Guarded ko(big * 4), vo(big * 4);
      EXPECT_TRUE(
          IsInvalidArgument(codec().DecodeTile(p, d, std::span<const uint8_t>(valid).first(size),
                                               {ko.data(), vo.data()}),
                            {"preset"}));
      EXPECT_TRUE(ko.Untouched() && vo.Untouched());
    }
    const uint8_t* tiles[] = {valid.data()};
    SequenceView seq;
    seq.tiles = tiles;
    Guarded out(d * 4);
    EXPECT_TRUE(
        IsInvalidArgument(codec().AttendDecode(p, d, q.data(), 1, seq, out.f32()), {"preset"}));
    EXPECT_TRUE(out.Untouched());
  }
}

TEST_P(BadInputTest, RejectsIterationsOutOfRange) {
  const int d = 64;
  for (const char* name : {"kvarn_k4v2_g128", "hadamard_k2v2_g64", "fp16"}) {
    SCOPED_TRACE(name);
    const Preset p = MustParse(name);
    const size_t n = static_cast<size_t>(p.tile_tokens) * d;
    const std::vector<float> k = Gaussian(n, 20), v = Gaussian(n, 21);
    for (int it : {-1, EncodeOptions::kMaxIterations + 1, 1000, INT_MIN, INT_MAX}) {
      SCOPED_TRACE("iterations " + std::to_string(it));
      Guarded record(p.RecordBytes(d));
      EncodeOptions opt;
      opt.iterations = it;
      EXPECT_TRUE(
          IsInvalidArgument(codec().EncodeTile(p, d, {k.data(), v.data()}, record.span(), opt),
                            {"iterations", "64"}));
      EXPECT_TRUE(record.Untouched());
    }
    for (int it : {0, 1, EncodeOptions::kMaxIterations}) {
      std::vector<uint8_t> record(p.RecordBytes(d));
      EncodeOptions opt;
      opt.iterations = it;
      const CodecStatus s = codec().EncodeTile(p, d, {k.data(), v.data()}, record, opt);
      EXPECT_TRUE(s.ok()) << "iterations " << it << ": " << s.ToString();
    }
  }
}

// ---- AttendDecode ---------------------------------------------------------------------

// A valid sequence of kvarn_k4v2_g64, D=64: full sink, two tiles, a 5-token tail.
class AttendBadInputTest : public BadInputTest {
 protected:
  static constexpr int kD = 64;
  void SetUp() override {
    preset_ = MustParse("kvarn_k4v2_g64");
    const int g = preset_.tile_tokens;
    for (int i = 0; i < 2; ++i) {
      records_.push_back(test::EncodeOrDie(codec(), preset_, kD, Gaussian(g * kD, 30 + i),
                                           Gaussian(g * kD, 40 + i)));
    }
    for (const auto& r : records_) tiles_.push_back(r.data());
    sink_k_ = test::ToHalf(Gaussian((g + 1) * kD, 50));
    sink_v_ = test::ToHalf(Gaussian((g + 1) * kD, 51));
    queries_ = Gaussian(1000 * kD, 52);  // room for every head count tried
    seq_.sink = {sink_k_.data(), sink_v_.data(), g};
    seq_.tiles = tiles_;
    seq_.tail = {sink_k_.data(), sink_v_.data(), 5};
  }
  // Expects rejection and an untouched output of num_queries (at least 1) heads.
  void ExpectRejected(const SequenceView& seq, int num_queries, const float* queries,
                      std::initializer_list<const char*> says, float scale = 0.0f) {
    Guarded out(static_cast<size_t>(std::max(num_queries, 1)) * kD * 4);
    EXPECT_TRUE(IsInvalidArgument(
        codec().AttendDecode(preset_, kD, queries, num_queries, seq, out.f32(), scale), says));
    EXPECT_TRUE(out.Untouched());
  }

  Preset preset_;
  std::vector<std::vector<uint8_t>> records_;
  std::vector<const uint8_t*> tiles_;
  std::vector<uint16_t> sink_k_, sink_v_;
  std::vector<float> queries_;
  SequenceView seq_;
};

TEST_P(AttendBadInputTest, TheValidBaselineSucceeds) {
  std::vector<float> out(3 * kD);
  const CodecStatus s = codec().AttendDecode(preset_, kD, queries_.data(), 3, seq_, out.data());
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (float x : out) ASSERT_TRUE(std::isfinite(x));
}

TEST_P(AttendBadInputTest, RejectsQueryHeadCountsOutside1To64) {
  for (int nq : {0, -1, 65, 1000}) {
    SCOPED_TRACE(nq);
    ExpectRejected(seq_, nq, queries_.data(), {"num_queries", std::to_string(nq).c_str()});
  }
  std::vector<float> out(64 * kD);
  EXPECT_TRUE(codec().AttendDecode(preset_, kD, queries_.data(), 64, seq_, out.data()).ok());
}

TEST_P(AttendBadInputTest, RejectsNaNOrInfInAnyQuery) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    for (size_t pos : {size_t{0}, size_t{kD + 7}, size_t{3 * kD - 1}}) {
      SCOPED_TRACE(::testing::Message() << bad << " at " << pos);
      std::vector<float> q(queries_.begin(), queries_.begin() + 3 * kD);
      q[pos] = bad;
      ExpectRejected(seq_, 3, q.data(), {"query", "NaN or Inf"});
    }
  }
}

TEST_P(AttendBadInputTest, RejectsSinkOrTailTokenCountsOutside0ToG) {
  const int g = preset_.tile_tokens;
  for (int tokens : {-1, g + 1, INT_MIN}) {
    SCOPED_TRACE(tokens);
    SequenceView s = seq_;
    s.sink.tokens = tokens;
    ExpectRejected(s, 2, queries_.data(), {"sink", "0..64"});
    s = seq_;
    s.tail.tokens = tokens;
    ExpectRejected(s, 2, queries_.data(), {"tail", "0..64"});
  }
}

TEST_P(AttendBadInputTest, RejectsFp16RunsWithTokensButNoData) {
  SequenceView s = seq_;
  s.sink.keys = nullptr;
  ExpectRejected(s, 1, queries_.data(), {"sink"});
  s = seq_;
  s.tail.values = nullptr;
  ExpectRejected(s, 1, queries_.data(), {"tail"});
}

TEST_P(AttendBadInputTest, RejectsNullTilePointers) {
  for (size_t i = 0; i < tiles_.size(); ++i) {
    std::vector<const uint8_t*> tiles = tiles_;
    tiles[i] = nullptr;
    SequenceView s = seq_;
    s.tiles = tiles;
    ExpectRejected(s, 2, queries_.data(), {"null tile"});
  }
}

TEST_P(AttendBadInputTest, RejectsAnEmptySequence) {
  ExpectRejected(SequenceView{}, 1, queries_.data(), {"no tokens"});
  SequenceView s;  // runs with data but zero tokens are still empty
  s.sink = {sink_k_.data(), sink_v_.data(), 0};
  s.tail = {sink_k_.data(), sink_v_.data(), 0};
  ExpectRejected(s, 1, queries_.data(), {"no tokens"});
}

TEST_P(AttendBadInputTest, RejectsNegativeOrNonFiniteSoftmaxScales) {
  for (float scale : {-1.0f, -0.0625f, std::numeric_limits<float>::quiet_NaN(),
                      std::numeric_limits<float>::infinity()}) {
    SCOPED_TRACE(scale);
    ExpectRejected(seq_, 1, queries_.data(), {"softmax_scale"}, scale);
  }
}

TEST_P(AttendBadInputTest, RejectsMissingQueryOrOutputBuffers) {
  ExpectRejected(seq_, 1, nullptr, {});
  EXPECT_TRUE(
      IsInvalidArgument(codec().AttendDecode(preset_, kD, queries_.data(), 1, seq_, nullptr), {}));
}

// ---- corrupt records ------------------------------------------------------------------

TEST_P(BadInputTest, DecodeRejectsRecordsWithNonFiniteScaleFields) {
  const uint16_t kNonFinite[] = {0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C01};
  for (const std::string& name : test::QuantizedPresetNames()) {
    const Preset p = MustParse(name);
    for (int d : {64, 128}) {
      const size_t n = static_cast<size_t>(p.tile_tokens) * d;
      const std::vector<uint8_t> valid =
          test::EncodeOrDie(codec(), p, d, Gaussian(n, 60), Gaussian(n, 61));
      Guarded ko(n * 4), vo(n * 4);
      for (const test::ScaleField& f : test::ScaleFields(p, d)) {
        for (int i : {0, f.count - 1}) {
          for (uint16_t bits : kNonFinite) {
            SCOPED_TRACE(::testing::Message() << name << " D=" << d << " " << f.name << "[" << i
                                              << "] = 0x" << std::hex << bits);
            std::vector<uint8_t> record = valid;
            std::memcpy(record.data() + f.offset + 2 * static_cast<size_t>(i), &bits, 2);
            for (DType dtype : {DType::kF32, DType::kF16}) {
              for (Frame frame : {Frame::kOriginal, Frame::kStorage}) {
                EXPECT_TRUE(IsInvalidArgument(
                    codec().DecodeTile(p, d, record, {ko.data(), vo.data(), dtype, frame}),
                    {"corrupt", f.name}));
                EXPECT_TRUE(ko.Untouched() && vo.Untouched());
              }
            }
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Implementations, BadInputTest, test::Implementations(),
                         test::CodecParamName());
INSTANTIATE_TEST_SUITE_P(Implementations, AttendBadInputTest, test::Implementations(),
                         test::CodecParamName());

}  // namespace
}  // namespace kvarn
