// The SIMD codec on every instruction set this build generates and this CPU runs, not only
// the best one: each target is forced in turn (Highway's SetSupportedTargetsForTest) and must
// agree with the scalar reference on encode, decode and attention. Vector length changes the
// plane order of the attention kernels and the lane layout of the transform, so a bug can
// hide on the development machine's target and show on a user's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "hwy/targets.h"
#include "kernels/codec.h"
#include "kernels/fp16.h"
#include "tests/kernels/codec_test_util.h"

namespace kvarn {
namespace {

using test::Gaussian;
using test::MustParse;

class SimdTargetTest : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override { hwy::SetSupportedTargetsForTest(GetParam()); }
  void TearDown() override { hwy::SetSupportedTargetsForTest(0); }
};

TEST_P(SimdTargetTest, DispatchesToTheForcedTarget) {
  EXPECT_EQ(Codec::Simd().target(), hwy::TargetName(GetParam()));
}

const char* const kPresets[] = {"kvarn_k4v2_g128", "kvarn_k2v4_g64", "kivi_k4v4_g64",
                                "hadamard_k2v2_g128", "fp16"};
const int kDims[] = {64, 512};

struct Tile {
  std::vector<float> k, v;
};
Tile RandomTile(const Preset& p, int d, uint32_t seed) {
  const size_t n = static_cast<size_t>(p.tile_tokens) * d;
  return {Gaussian(n, seed), Gaussian(n, seed + 1, 2.0f)};
}

TEST_P(SimdTargetTest, EncodesLikeTheReference) {
  for (const char* name : kPresets) {
    const Preset p = MustParse(name);
    for (int d : kDims) {
      SCOPED_TRACE(::testing::Message() << name << " D=" << d);
      const Tile t = RandomTile(p, d, 100 + d);
      EXPECT_TRUE(test::RecordsAgree(p, d, test::EncodeOrDie(Codec::Reference(), p, d, t.k, t.v),
                                     test::EncodeOrDie(Codec::Simd(), p, d, t.k, t.v)));
    }
  }
}

TEST_P(SimdTargetTest, ReadsF16InputExactly) {
  for (const char* name : kPresets) {
    const Preset p = MustParse(name);
    for (int d : kDims) {
      SCOPED_TRACE(::testing::Message() << name << " D=" << d);
      const Tile t = RandomTile(p, d, 200 + d);
      const std::vector<uint16_t> kh = test::ToHalf(t.k), vh = test::ToHalf(t.v);
      std::vector<uint8_t> from_half(p.RecordBytes(d));
      ASSERT_TRUE(
          Codec::Simd().EncodeTile(p, d, {kh.data(), vh.data(), DType::kF16}, from_half).ok());
      EXPECT_EQ(from_half,
                test::EncodeOrDie(Codec::Simd(), p, d, test::FromHalf(kh), test::FromHalf(vh)));
    }
  }
}

TEST_P(SimdTargetTest, DecodesLikeTheReference) {
  for (const char* name : kPresets) {
    const Preset p = MustParse(name);
    for (int d : kDims) {
      const Tile t = RandomTile(p, d, 300 + d);
      const std::vector<uint8_t> record = test::EncodeOrDie(Codec::Reference(), p, d, t.k, t.v);
      for (Frame frame : {Frame::kOriginal, Frame::kStorage}) {
        SCOPED_TRACE(::testing::Message()
                     << name << " D=" << d << " frame " << static_cast<int>(frame));
        std::vector<float> kr, vr, ks, vs;
        test::DecodeOrDie(Codec::Reference(), p, d, record, frame, &kr, &vr);
        test::DecodeOrDie(Codec::Simd(), p, d, record, frame, &ks, &vs);
        EXPECT_LT(test::RelL2(ks.data(), kr.data(), kr.size()), 1e-6);
        EXPECT_LT(test::RelL2(vs.data(), vr.data(), vr.size()), 1e-6);
      }
    }
  }
}

// Every element of `h` is `f` rounded to the nearest half, ties to even (fp16.h's contract).
::testing::AssertionResult AreNearestEvenHalves(const std::vector<uint16_t>& h,
                                                const std::vector<float>& f) {
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < h.size(); ++i) {
    if (h[i] != FloatToHalf(f[i]) && wrong++ == 0) first = i;
  }
  if (wrong == 0) return ::testing::AssertionSuccess();
  char first_text[160];
  std::snprintf(first_text, sizeof(first_text),
                "element %zu = %.9g became 0x%04x (%.9g), nearest-even is 0x%04x (%.9g)", first,
                f[first], h[first], HalfToFloat(h[first]), FloatToHalf(f[first]),
                RoundToHalf(f[first]));
  return ::testing::AssertionFailure()
         << wrong << " of " << h.size() << " elements misrounded; first: " << first_text;
}

TEST_P(SimdTargetTest, RoundsF16OutputToNearestEven) {
  for (const char* name : kPresets) {
    const Preset p = MustParse(name);
    const int d = 64;
    SCOPED_TRACE(name);
    const Tile t = RandomTile(p, d, 400);
    const std::vector<uint8_t> record = test::EncodeOrDie(Codec::Simd(), p, d, t.k, t.v);
    std::vector<float> kf, vf;
    test::DecodeOrDie(Codec::Simd(), p, d, record, Frame::kOriginal, &kf, &vf);
    std::vector<uint16_t> kh(kf.size()), vh(vf.size());
    ASSERT_TRUE(Codec::Simd().DecodeTile(p, d, record, {kh.data(), vh.data(), DType::kF16}).ok());
    EXPECT_TRUE(AreNearestEvenHalves(kh, kf)) << "keys";
    EXPECT_TRUE(AreNearestEvenHalves(vh, vf)) << "values";
  }
}

TEST_P(SimdTargetTest, AttendsLikeTheReference) {
  constexpr int kHeads = 5;
  for (const char* name : kPresets) {
    const Preset p = MustParse(name);
    const int g = p.tile_tokens;
    for (int d : kDims) {
      SCOPED_TRACE(::testing::Message() << name << " D=" << d);
      const size_t n = static_cast<size_t>(g) * d;
      std::vector<std::vector<uint8_t>> records;
      for (uint32_t i = 0; i < 2; ++i) {
        const Tile t = RandomTile(p, d, 500 + 10 * i + d);
        records.push_back(test::EncodeOrDie(Codec::Reference(), p, d, t.k, t.v));
      }
      const std::vector<const uint8_t*> tiles = {records[0].data(), records[1].data()};
      const std::vector<uint16_t> fk = test::ToHalf(Gaussian(n, 7)),
                                  fv = test::ToHalf(Gaussian(n, 8));
      SequenceView seq;
      seq.sink = {fk.data(), fv.data(), g};
      seq.tiles = tiles;
      seq.tail = {fk.data(), fv.data(), g - 1};
      const std::vector<float> q = Gaussian(static_cast<size_t>(kHeads) * d, 9, 1.5f);
      std::vector<float> want(kHeads * static_cast<size_t>(d)), got(want.size());
      ASSERT_TRUE(Codec::Reference().AttendDecode(p, d, q.data(), kHeads, seq, want.data(), 0.0f,
                                                    nullptr, AttendPrecision::kExact).ok());
      ASSERT_TRUE(Codec::Simd().AttendDecode(p, d, q.data(), kHeads, seq, got.data(), 0.0f, nullptr,
                                               AttendPrecision::kExact).ok());
      EXPECT_LT(test::RelL2(got.data(), want.data(), want.size()), 1e-5);
    }
  }
}

constexpr int kStoreTokens = 4;  // tokens per StoreTokens call of these tests

// Tokens that take each level of the SIMD StoreTokens check (kernels/simd_store.cc): token 0
// small values (the magnitude bound vouches for them), token 1 one value of 20,000 in every
// row (beyond the bound of the rotating presets, yet every row's norm is well inside the
// fp16 range), token 2 rows of Gaussian values of spread 6,000 (rows' norms beyond the fp16
// range, left to the exact check, yet no rotated value overflows), token 3 small again.
std::vector<float> StoreValues(const BlockLayout& l, uint32_t seed) {
  const size_t per_token = l.slots() * static_cast<size_t>(l.head_dim);
  std::vector<float> x = Gaussian(kStoreTokens * per_token, seed, 2.0f);
  for (size_t r = 0; r < l.slots(); ++r) x[per_token + r * l.head_dim + r % l.head_dim] = 20000.0f;
  const std::vector<float> wide = Gaussian(per_token, seed + 7, 6000.0f);
  for (size_t i = 0; i < per_token; ++i)
    x[2 * per_token + i] = std::clamp(wide[i], -60000.0f, 60000.0f);
  return x;
}

TEST_P(SimdTargetTest, StoresTokensLikeTheReference) {
  for (const char* name : kPresets) {
    const Preset p = MustParse(name);
    for (int d : {64, 128, 512}) {
      const BlockLayout l = test::SmallStoreLayout(p, d);
      const std::vector<float> k = StoreValues(l, 300 + d), v = StoreValues(l, 400 + d);
      const std::vector<uint16_t> kh = test::ToHalf(k), vh = test::ToHalf(v);
      for (DType dtype : {DType::kF32, DType::kF16}) {
        SCOPED_TRACE(::testing::Message()
                     << name << " D=" << d << (dtype == DType::kF16 ? " f16" : " f32"));
        const void* keys = dtype == DType::kF16 ? static_cast<const void*>(kh.data()) : k.data();
        const void* values = dtype == DType::kF16 ? static_cast<const void*>(vh.data()) : v.data();
        const int first = p.tile_tokens - kStoreTokens;
        std::vector<uint8_t> want(l.fp16_block_bytes(), 0xAB), got(want.size(), 0xAB);
        ASSERT_TRUE(Codec::Reference()
                        .StoreTokens(p, l, want.data(), first, kStoreTokens, keys, values, dtype)
                        .ok());
        ASSERT_TRUE(Codec::Simd()
                        .StoreTokens(p, l, got.data(), first, kStoreTokens, keys, values, dtype)
                        .ok());
        EXPECT_TRUE(got == want);
      }
    }
  }
}

// Every non-finite or out-of-range value is refused by every target, wherever it lies
// (first, middle, last), and nothing is written; so is a row in range whose rotation
// overflows, which the magnitude bound must not let through.
TEST_P(SimdTargetTest, StoreTokensRefusesEachBadValueWritingNothing) {
  for (const char* name : {"kvarn_k4v2_g128", "fp16"}) {
    const Preset p = MustParse(name);
    const int d = 128;
    const BlockLayout l = test::SmallStoreLayout(p, d);
    const std::vector<float> good = Gaussian(kStoreTokens * l.slots() * d, 500, 2.0f);
    const std::vector<uint16_t> good_h = test::ToHalf(good);
    const size_t count = good.size();
    for (size_t at : {size_t{0}, count / 2 + 3, count - 1}) {
      for (uint16_t bad :
           {uint16_t{0x7C00}, uint16_t{0xFC00}, uint16_t{0x7E00}, uint16_t{0xFE01}}) {
        for (int which = 0; which < 2; ++which) {
          SCOPED_TRACE(::testing::Message()
                       << name << " f16 " << std::hex << bad << std::dec << " at " << at
                       << (which == 0 ? " in keys" : " in values"));
          std::vector<uint16_t> k = good_h, v = good_h;
          (which == 0 ? k : v)[at] = bad;
          std::vector<uint8_t> slot(l.fp16_block_bytes(), 0x5A);
          EXPECT_EQ(
              Codec::Simd()
                  .StoreTokens(p, l, slot.data(), 0, kStoreTokens, k.data(), v.data(), DType::kF16)
                  .code(),
              CodecCode::kInvalidArgument);
          EXPECT_TRUE(std::all_of(slot.begin(), slot.end(), [](uint8_t b) { return b == 0x5A; }));
        }
      }
      for (float bad : {70000.0f, -70000.0f, INFINITY, -NAN}) {
        SCOPED_TRACE(::testing::Message() << name << " f32 " << bad << " at " << at);
        std::vector<float> v = good;
        v[at] = bad;
        std::vector<uint8_t> slot(l.fp16_block_bytes(), 0x5A);
        EXPECT_EQ(
            Codec::Simd()
                .StoreTokens(p, l, slot.data(), 0, kStoreTokens, good.data(), v.data(), DType::kF32)
                .code(),
            CodecCode::kInvalidArgument);
        EXPECT_TRUE(std::all_of(slot.begin(), slot.end(), [](uint8_t b) { return b == 0x5A; }));
      }
    }
    // In range, but one row of 6,000s rotates to 6,000 x sqrt(128) = 67,882 in its first
    // channel: beyond fp16 for the rotating preset only.
    std::vector<uint16_t> k = good_h;
    std::fill(k.begin() + 5 * d, k.begin() + 6 * d, FloatToHalf(6000.0f));
    std::vector<uint8_t> slot(l.fp16_block_bytes(), 0x5A);
    const CodecStatus s = Codec::Simd().StoreTokens(p, l, slot.data(), 0, kStoreTokens, k.data(),
                                                    good_h.data(), DType::kF16);
    if (p.rotates()) {
      EXPECT_EQ(s.code(), CodecCode::kInvalidArgument) << name;
      EXPECT_TRUE(std::all_of(slot.begin(), slot.end(), [](uint8_t b) { return b == 0x5A; }));
    } else {
      EXPECT_TRUE(s.ok()) << name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(CompiledAndSupported, SimdTargetTest,
                         ::testing::ValuesIn(hwy::SupportedAndGeneratedTargets()),
                         [](const auto& info) { return std::string(hwy::TargetName(info.param)); });

}  // namespace
}  // namespace kvarn
