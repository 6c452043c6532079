#include "tests/integration/kv_data.h"

#include <cmath>
#include <cstdio>
#include <numeric>

#include "kernels/fp16.h"

namespace kvarn::it {
namespace {

uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double Uniform(uint64_t& state) { return (static_cast<double>(SplitMix(state) >> 11) + 0.5) * 0x1.0p-53; }

}  // namespace

Layout SmallLayout() {
  Layout l;
  l.model_id = "it-model";
  l.num_layers = 2;
  l.num_kv_heads = 2;
  l.head_dim = 64;
  l.preset = "kvarn_k4v2_g64";
  l.sink_tokens = 64;
  return l;
}

std::vector<uint32_t> Tokens(uint32_t first, size_t n) {
  std::vector<uint32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

std::vector<float> KvData::KeysF32() const {
  std::vector<float> f(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) f[i] = HalfToFloat(keys[i]);
  return f;
}

std::vector<float> KvData::ValuesF32() const {
  std::vector<float> f(values.size());
  for (size_t i = 0; i < values.size(); ++i) f[i] = HalfToFloat(values[i]);
  return f;
}

KvData MakeKv(std::span<const uint32_t> tokens, const Layout& layout, uint64_t salt) {
  const size_t per_token = size_t{layout.num_layers} * layout.num_kv_heads * layout.head_dim;
  KvData d;
  d.keys.resize(tokens.size() * per_token);
  d.values.resize(tokens.size() * per_token);
  for (size_t t = 0; t < tokens.size(); ++t) {
    uint64_t state = (uint64_t{tokens[t]} << 20) ^ (salt * 0xD1B54A32D192ED03ull) ^ 0x5EEDull;
    for (size_t i = 0; i < per_token; ++i) {
      // Box-Muller: two normals per pair of uniforms.
      const double r = std::sqrt(-2.0 * std::log(Uniform(state)));
      const double a = 2.0 * M_PI * Uniform(state);
      d.keys[t * per_token + i] = FloatToHalf(static_cast<float>(r * std::cos(a)));
      d.values[t * per_token + i] = FloatToHalf(static_cast<float>(r * std::sin(a)));
    }
  }
  return d;
}

absl::StatusOr<SequenceTable> AppendTokens(Session& session, uint64_t seq, std::span<const uint32_t> tokens,
                                           size_t from, size_t to, bool mixed, uint64_t salt) {
  const Layout layout{.num_layers = static_cast<uint32_t>(session.block_layout().num_layers),
                      .num_kv_heads = static_cast<uint32_t>(session.block_layout().num_kv_heads),
                      .head_dim = static_cast<uint32_t>(session.block_layout().head_dim)};
  const size_t g = static_cast<size_t>(session.block_layout().tile_tokens);
  auto table = session.Table(seq);
  if (!table.ok()) return table.status();
  SequenceTable last = *table;
  bool inline_next = false;
  size_t pos = from;
  while (pos < to) {
    const size_t room = g - last.tail_tokens;
    const size_t n = std::min(room, to - pos);
    const std::span<const uint32_t> ids = tokens.subspan(pos, n);
    const KvData kv = MakeKv(ids, layout, salt);
    absl::StatusOr<AppendInfo> r =
        inline_next ? session.AppendInline(seq, ids, kv.keys.data(), kv.values.data(), DType::kF16)
                    : session.Append(seq, ids, kv.keys.data(), kv.values.data(), DType::kF16);
    if (!r.ok()) return r.status();
    last = r->table;
    pos += n;
    if (mixed) inline_next = !inline_next;
  }
  return last;
}

uint64_t Fnv64(const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t h = 0xCBF29CE484222325ull;
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 0x100000001B3ull;
  }
  return h;
}

std::string Hex64(uint64_t x) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(x));
  return buf;
}

absl::StatusOr<BlockDigest> DigestQuantBlock(const Session& session, uint32_t block) {
  const BlockLayout& l = session.block_layout();
  BlockDigest d;
  d.raw = Fnv64(session.QuantBlock(block), l.quant_block_bytes());
  std::vector<float> all;
  std::vector<float> k(l.tile_elems()), v(l.tile_elems());
  for (int layer = 0; layer < l.num_layers; ++layer) {
    for (int h = 0; h < l.num_kv_heads; ++h) {
      if (absl::Status s = session.DequantizeBlock(block, layer, h, k.data(), v.data()); !s.ok()) return s;
      all.insert(all.end(), k.begin(), k.end());
      all.insert(all.end(), v.begin(), v.end());
    }
  }
  d.dequantized = Fnv64(all.data(), all.size() * sizeof(float));
  return d;
}

uint64_t DigestSinkBlock(const Session& session, uint32_t block) {
  return Fnv64(session.SinkBlock(block), session.block_layout().fp16_block_bytes());
}

}  // namespace kvarn::it
