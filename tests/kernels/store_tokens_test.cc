// Codec::StoreTokens: the worker-side write of new tokens into an fp16 slot.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "hwy/aligned_allocator.h"
#include "kernels/codec.h"
#include "kernels/fp16.h"
#include "tests/kernels/codec_test_util.h"

namespace kvarn {
namespace {

class StoreTokensTest : public ::testing::TestWithParam<const char*> {};

TEST_P(StoreTokensTest, WritesRotatedFp16AndAgreesAcrossImplementations) {
  Preset p;
  ASSERT_TRUE(ParsePreset(GetParam(), &p).ok());
  for (int d : {64, 128, 512}) {
    const BlockLayout l = test::SmallStoreLayout(p, d);
    const int n = 5, first = p.tile_tokens - n;
    std::mt19937 rng(d);
    std::normal_distribution<float> nd(0.0f, 3.0f);
    std::vector<float> k(n * l.slots() * d), v(k.size());
    for (float& x : k) x = nd(rng);
    for (float& x : v) x = nd(rng);
    std::vector<uint8_t> a(l.fp16_block_bytes(), 0xAB);
    ASSERT_TRUE(Codec::Reference().StoreTokens(p, l, a.data(), first, n, k.data(), v.data(), DType::kF32).ok());
    // The SIMD codec writes the reference's bytes to a destination aligned to its vectors (a
    // pool block is) and to any other.
    auto buf = hwy::AllocateAligned<uint8_t>(a.size() + 64);
    for (size_t offset : {size_t{0}, size_t{16}, size_t{2}}) {
      uint8_t* b = buf.get() + offset;
      std::memset(b, 0xAB, a.size());
      ASSERT_TRUE(Codec::Simd().StoreTokens(p, l, b, first, n, k.data(), v.data(), DType::kF32).ok());
      EXPECT_EQ(std::memcmp(a.data(), b, a.size()), 0) << "d=" << d << " offset=" << offset;
    }
    // Token 2 of layer 1, kv-head 1 holds H x (or x) rounded to fp16; untouched tokens keep 0xAB.
    std::vector<float> row(k.begin() + (2 * l.slots() + l.slot(1, 1)) * d, k.begin() + (2 * l.slots() + l.slot(1, 1) + 1) * d);
    if (p.rotates()) FwhtInPlace(row.data(), d);
    const auto* keys = reinterpret_cast<const uint16_t*>(a.data() + l.Fp16KeysOffset(1, 1));
    const size_t stride = l.fp16_token_elems();
    for (int c = 0; c < d; ++c) ASSERT_EQ(keys[(first + 2) * stride + c], FloatToHalf(row[c])) << c;
    EXPECT_EQ(keys[(first - 1) * stride], 0xABAB);
    // Token-major: the n tokens are the one run [first, first + n) x fp16_token_bytes, every
    // (layer, head)'s key and value row of each; nothing outside it is written.
    const size_t begin = first * l.fp16_token_bytes(), end = (first + n) * l.fp16_token_bytes();
    EXPECT_EQ(end - begin, static_cast<size_t>(n) * l.slots() * 2 * d * sizeof(uint16_t));
    for (size_t i = 0; i < a.size(); ++i) {
      if (i < begin || i >= end) {
        ASSERT_EQ(a[i], 0xAB) << "byte " << i << " outside the tokens' run";
      }
    }
    for (size_t r = begin; r < end; r += d * sizeof(uint16_t)) {  // every row of the run written
      bool written = false;
      for (size_t i = r; i < r + d * sizeof(uint16_t); ++i) written |= a[i] != 0xAB;
      ASSERT_TRUE(written) << "row at byte " << r;
    }
  }
}

TEST_P(StoreTokensTest, RejectsBadInputWritingNothing) {
  Preset p;
  ASSERT_TRUE(ParsePreset(GetParam(), &p).ok());
  const BlockLayout l = test::SmallStoreLayout(p, 64);
  std::vector<float> k(2 * l.slots() * 64, 1.0f), v(k.size(), 1.0f);
  std::vector<uint8_t> slot(l.fp16_block_bytes(), 0x5A);
  const std::vector<uint8_t> before = slot;
  for (const Codec* codec : {&Codec::Reference(), &Codec::Simd()}) {
    EXPECT_EQ(codec->StoreTokens(p, l, slot.data(), p.tile_tokens - 1, 2, k.data(), v.data(), DType::kF32).code(),
              CodecCode::kInvalidArgument);
    EXPECT_EQ(codec->StoreTokens(p, l, slot.data(), -1, 1, k.data(), v.data(), DType::kF32).code(), CodecCode::kInvalidArgument);
    EXPECT_EQ(codec->StoreTokens(p, l, slot.data(), 0, 0, k.data(), v.data(), DType::kF32).code(), CodecCode::kInvalidArgument);
    std::vector<float> bad = v;
    bad[77] = NAN;
    EXPECT_EQ(codec->StoreTokens(p, l, slot.data(), 0, 2, k.data(), bad.data(), DType::kF32).code(), CodecCode::kInvalidArgument);
    // Every channel 60000: in range, but the rotated first channel is 60000 * 8 (rotating presets).
    std::vector<float> big(k.size(), 60000.0f);
    const CodecStatus s = codec->StoreTokens(p, l, slot.data(), 0, 2, big.data(), v.data(), DType::kF32);
    if (p.rotates()) {
      EXPECT_EQ(s.code(), CodecCode::kInvalidArgument);
      EXPECT_THAT(s.message(), ::testing::HasSubstr("overflow"));
    } else {
      EXPECT_TRUE(s.ok());
      slot = before;
    }
    EXPECT_EQ(slot, before);
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, StoreTokensTest,
                         ::testing::Values("kvarn_k4v2_g128", "kvarn_k2v2_g64", "hadamard_k4v4_g128", "kivi_k4v2_g64", "fp16"));

}  // namespace
}  // namespace kvarn
