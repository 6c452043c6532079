#include "tests/bench/bench_data.h"

#include "client/kvarnctl/rng.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <utility>

#include "kernels/fp16.h"

namespace kvarn::bench {
namespace {

// kvarnctl's splitmix64 generator (header-only): deterministic benchmark data.
using Rng = ctl::Rng;

// tokens x D values in the original frame, widened from fp16 so that every consumer sees
// the same numbers. Keys get a few wide channels.
void Synthetic(size_t tokens, int d, bool keys, Rng& rng, float* out) {
  for (size_t t = 0; t < tokens; ++t) {
    for (int c = 0; c < d; ++c) {
      const float spread = keys && (c % 16 == 5) ? 6.0f : 1.0f;
      out[t * d + c] = RoundToHalf(spread * static_cast<float>(rng.Normal()));
    }
  }
}

std::vector<uint16_t> ToHalf(const float* x, size_t n) {
  std::vector<uint16_t> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = FloatToHalf(x[i]);
  return h;
}

// The storage frame of fp16 parts: every row multiplied by H, rounded to fp16.
std::vector<uint16_t> RotatedHalf(const float* x, size_t tokens, int d) {
  std::vector<float> r(x, x + tokens * d);
  for (size_t t = 0; t < tokens; ++t) FwhtInPlace(r.data() + t * d, d);
  return ToHalf(r.data(), r.size());
}

void Check(const CodecStatus& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "benchmark setup failed: %s\n", s.ToString().c_str());
    std::abort();
  }
}

}  // namespace

TileIn TileRing::Input(int i, Frame frame, bool rotates) const {
  const bool rotated = frame == Frame::kStorage && rotates;
  const size_t off = static_cast<size_t>(i) * TileElems();
  TileIn in;
  in.keys = (rotated ? keys_rotated : keys).data() + off;
  in.values = (rotated ? values_rotated : values).data() + off;
  in.dtype = DType::kF16;
  in.frame = frame;
  return in;
}

const TileRing& GetTileRing(int tile_tokens, int head_dim) {
  static std::map<std::pair<int, int>, TileRing> rings;
  TileRing& ring = rings[{tile_tokens, head_dim}];
  if (ring.keys.empty()) {
    ring.tile_tokens = tile_tokens;
    ring.head_dim = head_dim;
    const size_t tokens = static_cast<size_t>(kRingTiles) * tile_tokens;
    std::vector<float> k(tokens * head_dim), v(tokens * head_dim);
    Rng rng(1000 * tile_tokens + head_dim);
    Synthetic(tokens, head_dim, /*keys=*/true, rng, k.data());
    Synthetic(tokens, head_dim, /*keys=*/false, rng, v.data());
    ring.keys = ToHalf(k.data(), k.size());
    ring.values = ToHalf(v.data(), v.size());
    ring.keys_rotated = RotatedHalf(k.data(), tokens, head_dim);
    ring.values_rotated = RotatedHalf(v.data(), tokens, head_dim);
  }
  return ring;
}

const std::vector<uint8_t>& GetRecordRing(const Preset& preset, int head_dim) {
  static std::map<std::pair<std::string, int>, std::vector<uint8_t>> records;
  std::vector<uint8_t>& r = records[{preset.Name(), head_dim}];
  if (r.empty()) {
    const TileRing& ring = GetTileRing(preset.tile_tokens, head_dim);
    const size_t bytes = preset.RecordBytes(head_dim);
    r.resize(bytes * kRingTiles);
    for (int i = 0; i < kRingTiles; ++i) {
      Check(Codec::Simd().EncodeTile(preset, head_dim,
                                     ring.Input(i, Frame::kOriginal, preset.rotates()),
                                     std::span<uint8_t>(r.data() + i * bytes, bytes)));
    }
  }
  return r;
}

SequenceView AttentionData::Head::View() const {
  SequenceView s;
  s.sink = {sink_keys.data(), sink_values.data(), kSinkTokens};
  s.tiles = tiles;
  s.tail = {tail_keys.data(), tail_values.data(), kTailTokens};
  return s;
}

const float* AttentionData::Queries(int kv_head) const {
  return queries.data() + static_cast<size_t>(kv_head) * kHeadsPerKv * kHeadDim;
}
const float* AttentionData::DenseKeys(int kv_head) const {
  return dense_keys.data() + static_cast<size_t>(kv_head) * kTokens * kHeadDim;
}
const float* AttentionData::DenseValues(int kv_head) const {
  return dense_values.data() + static_cast<size_t>(kv_head) * kTokens * kHeadDim;
}
size_t AttentionData::QuantizedBytes() const {
  const size_t fp16_tokens = kSinkTokens + kTailTokens;
  return kKvHeads * (kTiles * preset.RecordBytes(kHeadDim) + fp16_tokens * kHeadDim * 2 * 2);
}
const uint16_t* AttentionData::DenseKeys16(int kv_head) const {
  return dense_keys16.data() + static_cast<size_t>(kv_head) * kTokens * kHeadDim;
}
const uint16_t* AttentionData::DenseValues16(int kv_head) const {
  return dense_values16.data() + static_cast<size_t>(kv_head) * kTokens * kHeadDim;
}
size_t AttentionData::DenseBytes() const { return 2 * dense_keys.size() * sizeof(float); }
size_t AttentionData::DenseF16Bytes() const {
  return 2 * dense_keys16.size() * sizeof(uint16_t);
}

const AttentionData& GetAttentionData() {
  static const AttentionData* data = [] {
    auto* a = new AttentionData;
    Check(ParsePreset(kDefaultPresetName, &a->preset));
    constexpr int d = AttentionData::kHeadDim, g = 128;
    constexpr size_t tokens = AttentionData::kTokens;
    Rng rng(42);
    a->queries.resize(static_cast<size_t>(AttentionData::kKvHeads) * AttentionData::kHeadsPerKv *
                      d);
    for (float& q : a->queries) q = rng.Normal();
    a->dense_keys.resize(AttentionData::kKvHeads * tokens * d);
    a->dense_values.resize(a->dense_keys.size());
    const size_t record_bytes = a->preset.RecordBytes(d);
    for (int h = 0; h < AttentionData::kKvHeads; ++h) {
      float* k = a->dense_keys.data() + h * tokens * d;
      float* v = a->dense_values.data() + h * tokens * d;
      Synthetic(tokens, d, /*keys=*/true, rng, k);
      Synthetic(tokens, d, /*keys=*/false, rng, v);
      AttentionData::Head head;
      constexpr size_t sink = AttentionData::kSinkTokens;
      constexpr size_t tail_start = sink + static_cast<size_t>(AttentionData::kTiles) * g;
      head.sink_keys = RotatedHalf(k, sink, d);
      head.sink_values = RotatedHalf(v, sink, d);
      head.tail_keys = RotatedHalf(k + tail_start * d, AttentionData::kTailTokens, d);
      head.tail_values = RotatedHalf(v + tail_start * d, AttentionData::kTailTokens, d);
      head.records.resize(AttentionData::kTiles * record_bytes);
      for (int i = 0; i < AttentionData::kTiles; ++i) {
        const size_t first = sink + static_cast<size_t>(i) * g;
        const std::vector<uint16_t> kh = ToHalf(k + first * d, g * d),
                                    vh = ToHalf(v + first * d, g * d);
        TileIn in{kh.data(), vh.data(), DType::kF16, Frame::kOriginal};
        Check(Codec::Simd().EncodeTile(
            a->preset, d, in,
            std::span<uint8_t>(head.records.data() + i * record_bytes, record_bytes)));
      }
      for (int i = 0; i < AttentionData::kTiles; ++i)
        head.tiles.push_back(head.records.data() + i * record_bytes);
      a->heads.push_back(std::move(head));
    }
    a->dense_keys16 = ToHalf(a->dense_keys.data(), a->dense_keys.size());  // exact: fp16 values
    a->dense_values16 = ToHalf(a->dense_values.data(), a->dense_values.size());
    return a;
  }();
  return *data;
}

double RelL2(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double e = static_cast<double>(a[i]) - b[i];
    num += e * e;
    den += static_cast<double>(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace kvarn::bench
