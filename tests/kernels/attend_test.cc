// Decode attention (KVARN_SPEC.md §7) against its definition: the fused kernels, which
// never materialize a tile, must equal dequantize-then-attend computed in fp64, and a group
// of query heads must equal the same heads one at a time.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/codec.h"
#include "kernels/fp16.h"
#include "tests/kernels/codec_test_util.h"

namespace kvarn {
namespace {

using test::Gaussian;
using test::MustParse;

// These tests hold the exact fold to its definition; the fast path's accuracy contract is
// tests/kernels/attend_accuracy_test.cc's.
constexpr AttendPrecision kExact = AttendPrecision::kExact;

// The K/V of one kv-head as AttendDecode sees it, owning its memory: up to kMaxTiles tiles
// encoded by the codec under test, and fp16 sink and tail in the storage frame.
class Sequence {
 public:
  static constexpr int kMaxTiles = 3;

  Sequence(const Codec& codec, const Preset& preset, int d, uint32_t seed)
      : preset_(preset), d_(d) {
    const int g = preset.tile_tokens;
    const size_t n = static_cast<size_t>(g) * d;
    for (int i = 0; i < kMaxTiles; ++i) {
      // Keys with per-channel offsets, as real keys have; values centred.
      std::vector<float> k = Gaussian(n, seed + 10 * i), v = Gaussian(n, seed + 10 * i + 1);
      const std::vector<float> offset = Gaussian(d, seed + 10 * i + 2, 0.5f);
      for (size_t j = 0; j < n; ++j) k[j] += offset[j % d];
      records_.push_back(test::EncodeOrDie(codec, preset, d, k, v));
      // What attention must see of this tile: its decoding in the storage frame.
      std::vector<float> k_hat, v_hat;
      test::DecodeOrDie(codec, preset, d, records_.back(), Frame::kStorage, &k_hat, &v_hat);
      tiles_kd_.insert(tiles_kd_.end(), k_hat.begin(), k_hat.end());
      tiles_vd_.insert(tiles_vd_.end(), v_hat.begin(), v_hat.end());
    }
    for (const auto& r : records_) tile_ptrs_.push_back(r.data());
    sink_k_ = test::ToHalf(Gaussian(n, seed + 100));
    sink_v_ = test::ToHalf(Gaussian(n, seed + 101));
    tail_k_ = test::ToHalf(Gaussian(n, seed + 102));
    tail_v_ = test::ToHalf(Gaussian(n, seed + 103));
    for (auto [half, wide] : {std::pair{&sink_k_, &sink_kd_}, std::pair{&sink_v_, &sink_vd_},
                              std::pair{&tail_k_, &tail_kd_}, std::pair{&tail_v_, &tail_vd_}}) {
      for (uint16_t h : *half) wide->push_back(HalfToFloat(h));
    }
  }

  SequenceView View(int sink_tokens, int tiles, int tail_tokens) const {
    SequenceView s;
    s.sink = {sink_k_.data(), sink_v_.data(), sink_tokens};
    s.tiles = std::span<const uint8_t* const>(tile_ptrs_.data(), static_cast<size_t>(tiles));
    s.tail = {tail_k_.data(), tail_v_.data(), tail_tokens};
    return s;
  }

  // Dequantize-then-attend in fp64: the query rotated into the storage frame, softmax over
  // sink, decoded tiles and tail, the output rotated back.
  std::vector<double> Expected(const float* queries, int num_queries, int sink_tokens, int tiles,
                               int tail_tokens, double scale) const {
    const int g = preset_.tile_tokens;
    std::vector<const double*> keys, values;  // token rows, in sequence order
    for (int t = 0; t < sink_tokens; ++t) {
      keys.push_back(&sink_kd_[static_cast<size_t>(t) * d_]);
      values.push_back(&sink_vd_[static_cast<size_t>(t) * d_]);
    }
    for (int t = 0; t < tiles * g; ++t) {
      keys.push_back(&tiles_kd_[static_cast<size_t>(t) * d_]);
      values.push_back(&tiles_vd_[static_cast<size_t>(t) * d_]);
    }
    for (int t = 0; t < tail_tokens; ++t) {
      keys.push_back(&tail_kd_[static_cast<size_t>(t) * d_]);
      values.push_back(&tail_vd_[static_cast<size_t>(t) * d_]);
    }
    std::vector<double> out(static_cast<size_t>(num_queries) * d_, 0.0);
    std::vector<double> s(keys.size());
    for (int h = 0; h < num_queries; ++h) {
      std::vector<double> q(queries + static_cast<size_t>(h) * d_,
                            queries + static_cast<size_t>(h + 1) * d_);
      if (preset_.rotates()) test::FwhtDouble(q.data(), d_);
      for (size_t t = 0; t < keys.size(); ++t) {
        double dot = 0.0;
        for (int c = 0; c < d_; ++c) dot += q[c] * keys[t][c];
        s[t] = dot * scale;
      }
      const double m = *std::max_element(s.begin(), s.end());
      double sum = 0.0;
      double* o = &out[static_cast<size_t>(h) * d_];
      for (size_t t = 0; t < keys.size(); ++t) {
        const double p = std::exp(s[t] - m);
        sum += p;
        for (int c = 0; c < d_; ++c) o[c] += p * values[t][c];
      }
      for (int c = 0; c < d_; ++c) o[c] /= sum;
      if (preset_.rotates()) test::FwhtDouble(o, d_);
    }
    return out;
  }

  // log sum_t exp(scale * q . k_t) per query head, in fp64 (what AttendDecode's lse reports).
  std::vector<double> ExpectedLse(const float* queries, int num_queries, int sink_tokens, int tiles,
                                  int tail_tokens, double scale) const {
    const int g = preset_.tile_tokens;
    std::vector<const double*> keys;
    for (int t = 0; t < sink_tokens; ++t) keys.push_back(&sink_kd_[static_cast<size_t>(t) * d_]);
    for (int t = 0; t < tiles * g; ++t) keys.push_back(&tiles_kd_[static_cast<size_t>(t) * d_]);
    for (int t = 0; t < tail_tokens; ++t) keys.push_back(&tail_kd_[static_cast<size_t>(t) * d_]);
    std::vector<double> lse(num_queries);
    for (int h = 0; h < num_queries; ++h) {
      std::vector<double> q(queries + static_cast<size_t>(h) * d_,
                            queries + static_cast<size_t>(h + 1) * d_);
      if (preset_.rotates()) test::FwhtDouble(q.data(), d_);
      std::vector<double> s(keys.size());
      for (size_t t = 0; t < keys.size(); ++t) {
        double dot = 0.0;
        for (int c = 0; c < d_; ++c) dot += q[c] * keys[t][c];
        s[t] = dot * scale;
      }
      const double m = *std::max_element(s.begin(), s.end());
      double sum = 0.0;
      for (double x : s) sum += std::exp(x - m);
      lse[h] = m + std::log(sum);
    }
    return lse;
  }

  const std::vector<const uint8_t*>& tile_ptrs() const { return tile_ptrs_; }

 private:
  Preset preset_;
  int d_;
  std::vector<std::vector<uint8_t>> records_;
  std::vector<const uint8_t*> tile_ptrs_;
  std::vector<uint16_t> sink_k_, sink_v_, tail_k_, tail_v_;
  // fp64 copies of every token AttendDecode can see, [tokens][D].
  std::vector<double> sink_kd_, sink_vd_, tiles_kd_, tiles_vd_, tail_kd_, tail_vd_;
};

// Largest per-head relative L2 error of `got` against `want`, both [heads][d].
double WorstHeadError(const std::vector<float>& got, const std::vector<double>& want, int heads,
                      int d) {
  double worst = 0.0;
  for (int h = 0; h < heads; ++h) {
    worst = std::max(
        worst, test::RelL2(&got[static_cast<size_t>(h) * d], &want[static_cast<size_t>(h) * d], d));
  }
  return worst;
}

using CodecPreset = std::tuple<const Codec*, std::string>;
class AttendTest : public ::testing::TestWithParam<CodecPreset> {
 protected:
  const Codec& codec() const { return *std::get<0>(GetParam()); }
  Preset preset() const { return MustParse(std::get<1>(GetParam())); }
};

TEST_P(AttendTest, FusedAttentionEqualsDequantizeThenAttend) {
  const Preset p = preset();
  const int g = p.tile_tokens;
  constexpr int kHeads = 5;  // one block of four heads and one more
  for (int d : test::kHeadDims) {
    const Sequence seq(codec(), p, d, /*seed=*/1000 + d);
    const std::vector<float> q = Gaussian(static_cast<size_t>(kHeads) * d, 7 + d, /*stddev=*/1.5f);
    for (int sink : {0, g}) {
      for (int tiles : {0, 1, Sequence::kMaxTiles}) {
        for (int tail : {0, 1, g - 1}) {
          if (sink + tiles + tail == 0) continue;
          SCOPED_TRACE(::testing::Message()
                       << "D=" << d << " sink=" << sink << " tiles=" << tiles << " tail=" << tail);
          std::vector<float> out(static_cast<size_t>(kHeads) * d);
          const CodecStatus s =
              codec().AttendDecode(p, d, q.data(), kHeads, seq.View(sink, tiles, tail), out.data(),
                                   0.0f, nullptr, kExact);
          ASSERT_TRUE(s.ok()) << s.ToString();
          const std::vector<double> want =
              seq.Expected(q.data(), kHeads, sink, tiles, tail, 1.0 / std::sqrt(d));
          EXPECT_LT(WorstHeadError(out, want, kHeads, d), 1e-5);
        }
      }
    }
  }
}

// lse is the log of the softmax denominator, so attention over two splits of a sequence
// merges into attention over the whole: what a decode step does with its own new token.
TEST_P(AttendTest, LseIsTheSoftmaxDenominatorAndSplitsMergeExactly) {
  const Preset p = preset();
  const int g = p.tile_tokens;
  constexpr int kHeads = 3;
  for (int d : {64, 128}) {
    SCOPED_TRACE(d);
    const Sequence seq(codec(), p, d, 5000 + d);
    const std::vector<float> q = Gaussian(static_cast<size_t>(kHeads) * d, 17 + d, 1.5f);
    const double scale = 1.0 / std::sqrt(d);
    std::vector<float> whole(kHeads * d), head(kHeads * d), rest(kHeads * d);
    std::vector<float> lse_whole(kHeads), lse_head(kHeads), lse_rest(kHeads);
    ASSERT_TRUE(codec().AttendDecode(p, d, q.data(), kHeads, seq.View(g, 2, 7), whole.data(), 0.0f,
                                     lse_whole.data(), kExact).ok());
    const std::vector<double> want = seq.ExpectedLse(q.data(), kHeads, g, 2, 7, scale);
    for (int h = 0; h < kHeads; ++h) EXPECT_NEAR(lse_whole[h], want[h], 1e-4 * std::max(1.0, std::fabs(want[h])));
    // Split: sink and tiles | tail.
    ASSERT_TRUE(codec().AttendDecode(p, d, q.data(), kHeads, seq.View(g, 2, 0), head.data(), 0.0f,
                                     lse_head.data(), kExact).ok());
    ASSERT_TRUE(codec().AttendDecode(p, d, q.data(), kHeads, seq.View(0, 0, 7), rest.data(), 0.0f,
                                     lse_rest.data(), kExact).ok());
    std::vector<float> merged(kHeads * d);
    for (int h = 0; h < kHeads; ++h) {
      const double m = std::max(lse_head[h], lse_rest[h]);
      const double a = std::exp(lse_head[h] - m), b = std::exp(lse_rest[h] - m);
      for (int c = 0; c < d; ++c) {
        merged[h * d + c] = static_cast<float>((a * head[h * d + c] + b * rest[h * d + c]) / (a + b));
      }
      EXPECT_NEAR(m + std::log(a + b), lse_whole[h], 1e-4 * std::max(1.0, std::fabs(static_cast<double>(lse_whole[h]))));
    }
    EXPECT_LT(test::RelL2(merged.data(), whole.data(), whole.size()), 1e-5);
  }
}

TEST_P(AttendTest, UsesAnExplicitSoftmaxScale) {
  const Preset p = preset();
  const int d = 128, heads = 3;
  const Sequence seq(codec(), p, d, 2000);
  const std::vector<float> q = Gaussian(heads * d, 8);
  const SequenceView view = seq.View(p.tile_tokens, 2, 9);
  for (float scale : {0.045f, 0.3f}) {  // half and 3.4x the default 1/sqrt(128)
    SCOPED_TRACE(scale);
    std::vector<float> out(heads * d);
    ASSERT_TRUE(codec().AttendDecode(p, d, q.data(), heads, view, out.data(), scale, nullptr, kExact).ok());
    const std::vector<double> want = seq.Expected(q.data(), heads, p.tile_tokens, 2, 9, scale);
    EXPECT_LT(WorstHeadError(out, want, heads, d), 1e-5);
  }
  // 0 means 1/sqrt(D).
  std::vector<float> by_default(heads * d), explicit_scale(heads * d);
  ASSERT_TRUE(codec().AttendDecode(p, d, q.data(), heads, view, by_default.data(), 0.0f, nullptr, kExact).ok());
  ASSERT_TRUE(codec()
                  .AttendDecode(p, d, q.data(), heads, view, explicit_scale.data(),
                                1.0f / std::sqrt(128.0f), nullptr, kExact)
                  .ok());
  EXPECT_LT(test::RelL2(by_default.data(), explicit_scale.data(), by_default.size()), 1e-6);
}

TEST_P(AttendTest, IsInvariantToTheOrderOfTiles) {
  const Preset p = preset();
  const int d = 64, heads = 2;
  const Sequence seq(codec(), p, d, 3000);
  const std::vector<float> q = Gaussian(heads * d, 9, 2.0f);
  SequenceView view = seq.View(p.tile_tokens, Sequence::kMaxTiles, 3);
  std::vector<float> forward(heads * d), backward(heads * d);
  ASSERT_TRUE(codec().AttendDecode(p, d, q.data(), heads, view, forward.data(), 0.0f, nullptr, kExact).ok());
  std::vector<const uint8_t*> reversed(seq.tile_ptrs().rbegin(), seq.tile_ptrs().rend());
  view.tiles = reversed;
  ASSERT_TRUE(codec().AttendDecode(p, d, q.data(), heads, view, backward.data(), 0.0f, nullptr, kExact).ok());
  EXPECT_LT(test::RelL2(backward.data(), forward.data(), forward.size()), 1e-5);
}

// Grouped-query attention: H heads in one call equal H calls of one head. The largest group
// (64 heads) only at the smallest head_dim, to keep the scalar reference quick.
TEST_P(AttendTest, AGroupOfQueryHeadsEqualsOneHeadAtATime) {
  const Preset p = preset();
  for (int d : test::kHeadDims) {
    std::vector<int> groups = {1, 2, 3, 4, 5, 6, 7, 8, 13};
    if (d == 64) groups.push_back(64);
    const int most = groups.back();
    const Sequence seq(codec(), p, d, 4000 + d);
    const SequenceView view = seq.View(p.tile_tokens, 2, 7);
    const std::vector<float> q = Gaussian(static_cast<size_t>(most) * d, 10 + d, 1.5f);
    std::vector<float> single(static_cast<size_t>(most) * d);
    for (int h = 0; h < most; ++h) {
      const CodecStatus s = codec().AttendDecode(p, d, &q[static_cast<size_t>(h) * d], 1, view,
                                                 &single[static_cast<size_t>(h) * d], 0.0f,
                                                 nullptr, kExact);
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
    for (int heads : groups) {
      SCOPED_TRACE(::testing::Message() << "D=" << d << " heads=" << heads);
      std::vector<float> group(static_cast<size_t>(heads) * d);
      const CodecStatus s = codec().AttendDecode(p, d, q.data(), heads, view, group.data(), 0.0f,
                                                 nullptr, kExact);
      ASSERT_TRUE(s.ok()) << s.ToString();
      for (int h = 0; h < heads; ++h) {
        EXPECT_LT(
            test::RelL2(&group[static_cast<size_t>(h) * d], &single[static_cast<size_t>(h) * d], d),
            1e-6)
            << "head " << h;
      }
    }
  }
}

// SequenceView::next is a hint to fetch ahead: whatever it names (a view with more or fewer
// tiles than are fetched ahead, one of fp16 rows only, the view itself), results are the
// bits of the call without it, on both precisions, lse included.
TEST_P(AttendTest, TheNextViewHintChangesNoResult) {
  const Preset p = preset();
  const int g = p.tile_tokens, d = 128, heads = 4;
  const Sequence seq(codec(), p, d, 6000), other(codec(), p, d, 6100);
  const std::vector<float> q = Gaussian(static_cast<size_t>(heads) * d, 11, 1.5f);
  const SequenceView hints[] = {other.View(g, Sequence::kMaxTiles, 5), other.View(0, 1, 0),
                                other.View(g, 0, g - 1), other.View(0, 0, 3)};
  for (AttendPrecision precision : {AttendPrecision::kExact, AttendPrecision::kFast}) {
    for (int tiles : {0, 1, Sequence::kMaxTiles}) {
      const SequenceView plain = seq.View(g, tiles, 7);
      std::vector<float> want(static_cast<size_t>(heads) * d), want_lse(heads);
      ASSERT_TRUE(codec()
                      .AttendDecode(p, d, q.data(), heads, plain, want.data(), 0.0f,
                                    want_lse.data(), precision)
                      .ok());
      std::vector<const SequenceView*> nexts = {&plain};
      for (const SequenceView& h : hints) nexts.push_back(&h);
      for (const SequenceView* next : nexts) {
        SCOPED_TRACE(::testing::Message()
                     << (precision == AttendPrecision::kFast ? "fast" : "exact")
                     << " tiles=" << tiles << " next: " << next->tiles.size() << " tiles, "
                     << next->sink.tokens + next->tail.tokens << " fp16 tokens");
        SequenceView hinted = plain;
        hinted.next = next;
        std::vector<float> got(want.size(), -1.0f), got_lse(heads, -1.0f);
        ASSERT_TRUE(codec()
                        .AttendDecode(p, d, q.data(), heads, hinted, got.data(), 0.0f,
                                      got_lse.data(), precision)
                        .ok());
        EXPECT_TRUE(got == want);
        EXPECT_TRUE(got_lse == want_lse);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllPresets, AttendTest,
                         ::testing::Combine(test::Implementations(),
                                            ::testing::ValuesIn(AllPresetNames())),
                         test::CodecPresetParamName());

}  // namespace
}  // namespace kvarn
