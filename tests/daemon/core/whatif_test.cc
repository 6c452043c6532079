// The what-if ghost cache (whatif.h) and the sampled quantization error with its baselines
// (quant_error.h), alone and as the core drives them.
#include "daemon/core/whatif.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "daemon/core/quant_error.h"
#include "gtest/gtest.h"
#include "kernels/codec.h"
#include "tests/daemon/core/core_fixture.h"

namespace kvarn {
namespace {

TEST(GhostLruTest, DropsTheLeastRecentlyUsedKey) {
  GhostLru g(2);
  g.Insert(1);
  g.Insert(2);
  EXPECT_TRUE(g.Touch(1));  // 2 is now the least recently used
  g.Insert(3);
  EXPECT_EQ(g.size(), 2u);
  EXPECT_TRUE(g.Touch(1));
  EXPECT_TRUE(g.Touch(3));
  EXPECT_FALSE(g.Touch(2));
  g.Insert(3);  // present: touched, nothing dropped
  g.Insert(4);  // drops 1 (3 was touched after it)
  EXPECT_FALSE(g.Touch(1));
  EXPECT_TRUE(g.Touch(3));
  EXPECT_TRUE(g.Touch(4));
}

TEST(GhostLruTest, ZeroCapacityHoldsNothing) {
  GhostLru g(0);
  g.Insert(7);
  EXPECT_EQ(g.size(), 0u);
  EXPECT_FALSE(g.Touch(7));
}

TEST(GhostLruTest, MatchesAReferenceLruOnARandomTrace) {
  constexpr size_t kCap = 37;
  GhostLru g(kCap);
  std::vector<uint64_t> ref;  // most recently used first
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint64_t> key(0, 99);
  for (int i = 0; i < 20000; ++i) {
    const uint64_t k = key(rng);
    auto it = std::find(ref.begin(), ref.end(), k);
    const bool present = it != ref.end();
    if (rng() % 2) {
      ASSERT_EQ(g.Touch(k), present) << "step " << i;
      if (present) {
        ref.erase(it);
        ref.insert(ref.begin(), k);
      }
    } else {
      g.Insert(k);
      if (present) ref.erase(it);
      ref.insert(ref.begin(), k);
      if (ref.size() > kCap) ref.pop_back();
    }
    ASSERT_EQ(g.size(), ref.size());
  }
}

BlockHash HashOf(uint32_t i) {
  BlockHash h{};
  std::memcpy(h.data(), &i, sizeof(i));
  h[31] = 1;
  return h;
}

TEST(WhatIfCacheTest, EachScaleKeepsItsShareOfTheSealedTiles) {
  WhatIfCache w(/*quant_blocks=*/4, /*sink_blocks=*/0);
  std::vector<BlockHash> chain;
  for (uint32_t i = 0; i < 8; ++i) {
    chain.push_back(HashOf(i));
    w.Sealed(chain.back(), BlockClass::kQuant);
  }
  auto quant = [](size_t) { return BlockClass::kQuant; };
  // The first four tiles again: scales 0.5 and 1 (2 and 4 entries) lost tile 0, so their walk
  // stops at once; scales 2 and 4 (8 and 16 entries) hold all eight.
  w.Query(std::span<const BlockHash>(chain.data(), 4), quant, 64);
  EXPECT_EQ(w.hit_tokens()[0], 0u);
  EXPECT_EQ(w.hit_tokens()[1], 0u);
  EXPECT_EQ(w.hit_tokens()[2], 4u * 64);
  EXPECT_EQ(w.hit_tokens()[3], 4u * 64);
  // The last two tiles are in every ghost but scale 0.5's first one is tile 6's parent chain:
  // a chain of just {6, 7} hits everywhere.
  std::vector<BlockHash> tail = {chain[6], chain[7]};
  w.Query(tail, quant, 64);
  EXPECT_EQ(w.hit_tokens()[0], 2u * 64);
  EXPECT_EQ(w.hit_tokens()[1], 2u * 64);
  EXPECT_EQ(w.hit_tokens()[2], 6u * 64);
}

TEST(WhatIfCacheTest, SinkAndQuantTilesHaveTheirOwnCapacity) {
  WhatIfCache w(/*quant_blocks=*/2, /*sink_blocks=*/1);
  // Sealing many quantized tiles cannot push the sink tile out of the scale-1 ghost.
  w.Sealed(HashOf(100), BlockClass::kSink);
  for (uint32_t i = 0; i < 10; ++i) w.Sealed(HashOf(i), BlockClass::kQuant);
  std::vector<BlockHash> chain = {HashOf(100), HashOf(8), HashOf(9)};
  w.Query(chain, [](size_t i) { return i == 0 ? BlockClass::kSink : BlockClass::kQuant; }, 64);
  EXPECT_EQ(w.hit_tokens()[0], 0u) << "scale 0.5 has no sink entry (floor(0.5 * 1) = 0)";
  EXPECT_EQ(w.hit_tokens()[1], 3u * 64);
}

// A recording observer for the core's sampled errors.
class ErrorRecorder final : public CoreObserver {
 public:
  void OnSeal(bool, absl::Duration) override {}
  void OnEvict(EvictReason, uint32_t) override {}
  void OnQuantError(std::string_view method, double e) override { errors[std::string(method)].push_back(e); }
  std::map<std::string, std::vector<double>> errors;
};

class WhatIfCoreTest : public testing::CoreTest {};

TEST_F(WhatIfCoreTest, ScaleOneMatchesThePoolWithoutPressure) {
  MakeCore(/*quant_blocks=*/16, /*sink_blocks=*/4);
  SessionRef s = Open("t");
  const std::vector<uint32_t> p = Tokens(1, 3 * g_ + 5);
  auto a = core_->CreateSequence(s, p);
  ASSERT_TRUE(a.ok()) << a.status();
  AppendAll(s, a->sequence, p, 0);
  ASSERT_TRUE(core_->Release(s, std::vector<SequenceId>{a->sequence}).ok());
  auto b = core_->CreateSequence(s, p);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->cached_tokens, 3u * g_);
  auto st = core_->Stats(s);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->whatif_hit_tokens[1], st->prefix_hit_tokens) << "the ghost of the pool itself, no eviction yet";
  EXPECT_EQ(st->whatif_hit_tokens[2], st->prefix_hit_tokens);
  EXPECT_EQ(st->whatif_hit_tokens[3], st->prefix_hit_tokens);
  // Scale 0.5 keeps 8 quantized tiles and 2 sinks: plenty for three tiles.
  EXPECT_EQ(st->whatif_hit_tokens[0], st->prefix_hit_tokens);
}

TEST_F(WhatIfCoreTest, LargerScalesKeepWhatThePoolEvicted) {
  MakeCore(/*quant_blocks=*/4, /*sink_blocks=*/2);
  SessionRef s = Open("t");
  // Three prompts of one sink and two quantized tiles each: the pool (4 quantized blocks)
  // keeps two prompts' quantized tiles; the first prompt's go when the third seals.
  std::vector<std::vector<uint32_t>> prompts;
  for (uint32_t i = 0; i < 3; ++i) {
    prompts.push_back(Tokens(10000 * (i + 1), 3 * g_ + 1));  // the last token is never a hit
    auto q = core_->CreateSequence(s, prompts.back());
    ASSERT_TRUE(q.ok()) << q.status();
    AppendAll(s, q->sequence, prompts.back(), 0);
    ASSERT_TRUE(core_->Release(s, std::vector<SequenceId>{q->sequence}).ok());
  }
  auto again = core_->CreateSequence(s, prompts[0]);
  ASSERT_TRUE(again.ok()) << again.status();
  auto st = core_->Stats(s);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_LT(st->prefix_hit_tokens, 3u * g_) << "the pool lost some of the first prompt";
  EXPECT_EQ(st->whatif_hit_tokens[2], 3u * g_) << "twice the pool keeps all three prompts";
  EXPECT_EQ(st->whatif_hit_tokens[3], 3u * g_);
  EXPECT_LE(st->whatif_hit_tokens[0], st->whatif_hit_tokens[1]);
  EXPECT_LE(st->whatif_hit_tokens[1], st->whatif_hit_tokens[2]);
}

TEST_F(WhatIfCoreTest, SampledTilesReportKvarnAndBothBaselines) {
  ErrorRecorder rec;
  MakeCore(/*quant_blocks=*/40, /*sink_blocks=*/2, testing::SmallModel(), CoreConfig(), 16, &rec);
  SessionRef s = Open("t");
  const std::vector<uint32_t> p = Tokens(1, 34 * g_);  // 1 sink + 33 quantized tiles: ids 0, 16, 32 sampled
  auto q = core_->CreateSequence(s, p);
  ASSERT_TRUE(q.ok()) << q.status();
  AppendAll(s, q->sequence, p, 0);
  ASSERT_EQ(rec.errors["kvarn"].size(), 3u);
  ASSERT_EQ(rec.errors["hadamard"].size(), 3u);
  ASSERT_EQ(rec.errors["kivi"].size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    for (const char* m : {"kvarn", "hadamard", "kivi"}) {
      EXPECT_GT(rec.errors[m][i], 0.0) << m;
      EXPECT_LT(rec.errors[m][i], 1.0) << m;
    }
  }
}

// Gaussian K/V with a few outlier key channels, as LLM keys have.
void OutlierTile(int g, int d, uint32_t seed, std::vector<float>* k, std::vector<float>* v) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  k->resize(static_cast<size_t>(g) * d);
  v->resize(k->size());
  for (int t = 0; t < g; ++t) {
    for (int c = 0; c < d; ++c) {
      const float scale = (c % 17 == 3) ? 12.0f : 1.0f;
      (*k)[static_cast<size_t>(t) * d + c] = scale * n(rng);
      (*v)[static_cast<size_t>(t) * d + c] = n(rng);
    }
  }
}

TEST(QuantBaselinesTest, MatchTheNamedPresetsAndKvarnIsNotWorse) {
  constexpr int kD = 128;
  Preset kvarn;
  ASSERT_TRUE(ParsePreset("kvarn_k4v2_g128", &kvarn).ok());
  std::vector<float> k, v;
  OutlierTile(kvarn.tile_tokens, kD, 11, &k, &v);
  const std::array<BaselineError, 2> b = QuantBaselines(kvarn, kD, k.data(), v.data());
  const Codec& codec = Codec::Default();
  auto error_of = [&](const std::string& name) {
    Preset p;
    EXPECT_TRUE(ParsePreset(name, &p).ok()) << name;
    std::vector<uint8_t> rec(p.RecordBytes(kD));
    std::vector<float> dk(k.size()), dv(v.size());
    EXPECT_TRUE(codec.EncodeTile(p, kD, {k.data(), v.data(), DType::kF32, Frame::kOriginal}, rec).ok());
    EXPECT_TRUE(codec.DecodeTile(p, kD, rec, {dk.data(), dv.data(), DType::kF32, Frame::kOriginal}).ok());
    return RelativeL2(dk.data(), dv.data(), k.data(), v.data(), k.size());
  };
  EXPECT_EQ(b[0].method, "hadamard");
  EXPECT_EQ(b[1].method, "kivi");
  EXPECT_DOUBLE_EQ(b[0].relative_l2, error_of("hadamard_k4v2_g128"));
  EXPECT_DOUBLE_EQ(b[1].relative_l2, error_of("kivi_k4v2_g128"));
  const double kv = error_of("kvarn_k4v2_g128");
  EXPECT_GT(b[0].relative_l2, 0.0);
  EXPECT_GT(b[1].relative_l2, 0.0);
  EXPECT_LE(kv, b[0].relative_l2) << "balancing after the rotation must not lose to the rotation alone";
  RecordProperty("kvarn", std::to_string(kv));
  RecordProperty("hadamard", std::to_string(b[0].relative_l2));
  RecordProperty("kivi", std::to_string(b[1].relative_l2));
  std::printf("[ FIGURE   ] relative L2 on an outlier tile: kvarn %.4f hadamard %.4f kivi %.4f\n", kv,
              b[0].relative_l2, b[1].relative_l2);
}

TEST(QuantBaselinesTest, AZeroTileHasZeroError) {
  Preset kvarn;
  ASSERT_TRUE(ParsePreset("kvarn_k4v2_g64", &kvarn).ok());
  std::vector<float> z(64 * 64, 0.0f);
  for (const BaselineError& b : QuantBaselines(kvarn, 64, z.data(), z.data())) EXPECT_EQ(b.relative_l2, 0.0) << b.method;
}

}  // namespace
}  // namespace kvarn
