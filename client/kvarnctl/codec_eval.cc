#include "client/kvarnctl/codec_eval.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <span>

#include "client/kvarnctl/flags.h"
#include "kernels/block_layout.h"
#include "kernels/codec.h"
#include "kernels/fp16.h"

namespace kvarn::ctl {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kMaxQueriesPerCall = 64;  // Codec::AttendDecode's limit per call
// Throughput: when one pass over the tiles is short, repeat the encode and decode passes
// (same inputs, results discarded) and keep the fastest, so a busy machine or a cold cache
// disturbs the figure less.
constexpr double kMinTimingSeconds = 0.2;
constexpr int kMaxTimingPasses = 5;

// Sums for a relative L2 error.
struct ErrorSums {
  double diff = 0, ref = 0;
  void Add(const float* ref_row, const float* got_row, int n) {
    for (int i = 0; i < n; ++i) {
      const double d = static_cast<double>(got_row[i]) - ref_row[i];
      diff += d * d;
      ref += static_cast<double>(ref_row[i]) * ref_row[i];
    }
  }
  void Add(const ErrorSums& o) {
    diff += o.diff;
    ref += o.ref;
  }
  double RelL2() const { return ref > 0 ? std::sqrt(diff / ref) : std::sqrt(diff); }
};

// The per-head token split of the sequence policy.
struct Split {
  int sink = 0, tiles = 0, tail = 0;
};

Split SplitTokens(const Preset& preset, int tokens, SinkPolicy policy) {
  const int g = preset.tile_tokens;
  Split s;
  s.sink = policy == SinkPolicy::kTile ? std::min(g, tokens) : 0;
  s.tiles = (tokens - s.sink) / g;
  s.tail = tokens - s.sink - s.tiles * g;
  return s;
}

// K/V of up to G tokens kept in fp16, as the cache keeps them: Codec::StoreTokens, the
// daemon's own path, rotates them into the storage frame and rounds to fp16.
struct Fp16Part {
  std::vector<uint16_t> keys, values;  // [count][D], storage frame
};

// Stores tokens [first, first + count) of one head and adds the error of their
// original-frame reconstruction.
CodecStatus StoreFp16Part(const Codec& codec, const Preset& preset, const KvTensor& keys,
                          const KvTensor& values, int head, int first, int count, const char* part,
                          Fp16Part* out, ErrorSums* k_err, ErrorSums* v_err) {
  const int d = keys.head_dim;
  const size_t n = static_cast<size_t>(count) * d;
  out->keys.assign(n, 0);
  out->values.assign(n, 0);
  if (count == 0) return {};
  const BlockLayout layout = MakeBlockLayout(preset, 1, 1, d);
  std::vector<uint8_t> slot(layout.fp16_block_bytes());
  const CodecStatus s =
      codec.StoreTokens(preset, layout, slot.data(), 0, count, keys.Row(head, first),
                        values.Row(head, first), DType::kF32);
  if (!s.ok()) {
    return CodecStatus(s.code(), preset.Name() + ": head " + std::to_string(head) + ", fp16 " +
                                     part + ": codec: " + s.message());
  }
  for (int t = 0; t < count; ++t) {  // the block's rows are token-major: [K row][V row] a token
    const size_t row = static_cast<size_t>(t) * layout.fp16_token_bytes();
    std::memcpy(out->keys.data() + static_cast<size_t>(t) * d,
                slot.data() + row + layout.Fp16KeysOffset(0, 0), d * 2);
    std::memcpy(out->values.data() + static_cast<size_t>(t) * d,
                slot.data() + row + layout.Fp16ValuesOffset(0, 0), d * 2);
  }
  std::vector<float> row(d);
  for (int which = 0; which < 2; ++which) {
    const KvTensor& src = which == 0 ? keys : values;
    const std::vector<uint16_t>& stored = which == 0 ? out->keys : out->values;
    for (int t = 0; t < count; ++t) {
      for (int c = 0; c < d; ++c) {
        // StoreTokens refused rows that leave the fp16 range once rotated: all finite.
        row[c] = HalfToFloat(stored[static_cast<size_t>(t) * d + c]);
      }
      if (preset.rotates()) FwhtInPlace(row.data(), d);
      (which == 0 ? k_err : v_err)->Add(src.Row(head, first + t), row.data(), d);
    }
  }
  return {};
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

std::vector<double> ExactAttention(const KvTensor& keys, const KvTensor& values,
                                   const QuerySet& queries) {
  const int d = keys.head_dim, t_count = keys.tokens;
  const int group = queries.query_heads / keys.heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> out(static_cast<size_t>(queries.query_heads) * queries.per_head * d, 0.0);
  std::vector<double> scores(t_count), q(d);
  for (int qh = 0; qh < queries.query_heads; ++qh) {
    const int kv = qh / group;
    for (int i = 0; i < queries.per_head; ++i) {
      const size_t qi = static_cast<size_t>(qh) * queries.per_head + i;
      for (int c = 0; c < d; ++c) q[c] = queries.data[qi * d + c];
      double max_score = -INFINITY;
      for (int t = 0; t < t_count; ++t) {
        const float* k = keys.Row(kv, t);
        double s = 0;
        for (int c = 0; c < d; ++c) s += q[c] * k[c];
        scores[t] = s * scale;
        max_score = std::max(max_score, scores[t]);
      }
      double sum = 0;
      double* o = &out[qi * d];
      for (int t = 0; t < t_count; ++t) {
        const double p = std::exp(scores[t] - max_score);
        sum += p;
        const float* v = values.Row(kv, t);
        for (int c = 0; c < d; ++c) o[c] += p * v[c];
      }
      for (int c = 0; c < d; ++c) o[c] /= sum;
    }
  }
  return out;
}

int64_t TilesOfWork(const Preset& preset, const KvTensor& keys, SinkPolicy sink) {
  return static_cast<int64_t>(SplitTokens(preset, keys.tokens, sink).tiles) * keys.heads;
}

namespace {

// A sequence as the cache holds it: per head, the fp16 sink, the records of the quantized
// tiles and the fp16 tail; plus what the encoding cost and how much it erred.
struct StoredSequence {
  const Preset* preset = nullptr;
  int head_dim = 0;
  Split split;
  size_t record_bytes = 0;
  std::vector<uint8_t> records;  // [heads][tiles][record_bytes]
  std::vector<Fp16Part> sinks, tails;
  ErrorSums k_fp16, v_fp16, k_quant, v_quant;
  Clock::duration encode_time{}, decode_time{};

  const uint8_t* Record(int head, int tile) const {
    return records.data() + (static_cast<size_t>(head) * split.tiles + tile) * record_bytes;
  }
  std::span<uint8_t> MutableRecord(int head, int tile) {
    return {records.data() + (static_cast<size_t>(head) * split.tiles + tile) * record_bytes,
            record_bytes};
  }
};

CodecStatus TileError(const CodecStatus& s, const std::string& preset, int head, int first, int g) {
  return CodecStatus(s.code(), preset + ": head " + std::to_string(head) + ", tokens " +
                                   std::to_string(first) + ".." + std::to_string(first + g - 1) +
                                   ": codec: " + s.message());
}

// Encodes every full tile (timed, each decoded back for its error) and stores the fp16 parts.
CodecStatus StoreSequence(const Codec& codec, const Preset& preset, const KvTensor& keys,
                          const KvTensor& values, const EvalOptions& options, ProgressBar* progress,
                          StoredSequence* seq) {
  const int d = keys.head_dim, g = preset.tile_tokens;
  seq->preset = &preset;
  seq->head_dim = d;
  seq->split = SplitTokens(preset, keys.tokens, options.sink);
  seq->record_bytes = preset.RecordBytes(d);
  const Split& split = seq->split;
  seq->records.assign(static_cast<size_t>(keys.heads) * split.tiles * seq->record_bytes, 0);
  seq->sinks.resize(keys.heads);
  seq->tails.resize(keys.heads);
  std::vector<float> k_hat(static_cast<size_t>(g) * d), v_hat(k_hat.size());
  EncodeOptions encode_options;
  encode_options.iterations = options.iterations;
  const std::string name = preset.Name(), label = "eval " + name;
  for (int h = 0; h < keys.heads; ++h) {
    KVARN_RETURN_IF_ERROR(StoreFp16Part(codec, preset, keys, values, h, 0, split.sink, "sink",
                                        &seq->sinks[h], &seq->k_fp16, &seq->v_fp16));
    KVARN_RETURN_IF_ERROR(StoreFp16Part(codec, preset, keys, values, h,
                                        split.sink + split.tiles * g, split.tail, "tail",
                                        &seq->tails[h], &seq->k_fp16, &seq->v_fp16));
    for (int i = 0; i < split.tiles; ++i) {
      const int first = split.sink + i * g;
      const std::span<uint8_t> record = seq->MutableRecord(h, i);
      const Clock::time_point t0 = Clock::now();
      const CodecStatus enc = codec.EncodeTile(
          preset, d, TileIn{keys.Row(h, first), values.Row(h, first)}, record, encode_options);
      const Clock::time_point t1 = Clock::now();
      const CodecStatus dec =
          enc.ok() ? codec.DecodeTile(preset, d, record, TileOut{k_hat.data(), v_hat.data()}) : enc;
      seq->decode_time += Clock::now() - t1;
      seq->encode_time += t1 - t0;
      if (!dec.ok()) return TileError(dec, name, h, first, g);
      seq->k_quant.Add(keys.Row(h, first), k_hat.data(), static_cast<int>(k_hat.size()));
      seq->v_quant.Add(values.Row(h, first), v_hat.data(), static_cast<int>(v_hat.size()));
      if (progress != nullptr) progress->Advance(1, label);
    }
  }
  return {};
}

// Decode attention of every query head over its kv-head's stored sequence, against the
// exact reference.
CodecStatus MeasureAttention(const Codec& codec, const StoredSequence& stored,
                             const QuerySet& queries, const std::vector<double>& reference,
                             int kv_heads, PresetResult* r) {
  const int d = stored.head_dim, tiles_per_head = stored.split.tiles;
  const int group = queries.query_heads / kv_heads;
  std::vector<float> out(static_cast<size_t>(kMaxQueriesPerCall) * d);
  std::vector<const uint8_t*> tiles(tiles_per_head);
  double diff2 = 0, ref2 = 0, cos_sum = 0, cos_min = 1.0;
  for (int qh = 0; qh < queries.query_heads; ++qh) {
    const int kv = qh / group;
    for (int i = 0; i < tiles_per_head; ++i) tiles[i] = stored.Record(kv, i);
    SequenceView seq;
    seq.sink = {stored.sinks[kv].keys.data(), stored.sinks[kv].values.data(), stored.split.sink};
    seq.tiles = tiles;
    seq.tail = {stored.tails[kv].keys.data(), stored.tails[kv].values.data(), stored.split.tail};
    for (int first = 0; first < queries.per_head; first += kMaxQueriesPerCall) {
      const int n = std::min(kMaxQueriesPerCall, queries.per_head - first);
      const size_t q0 = static_cast<size_t>(qh) * queries.per_head + first;
      const CodecStatus s =
          codec.AttendDecode(*stored.preset, d, &queries.data[q0 * d], n, seq, out.data());
      if (!s.ok()) {
        return CodecStatus(s.code(), stored.preset->Name() + ": attention, query head " +
                                         std::to_string(qh) + ": codec: " + s.message());
      }
      for (int j = 0; j < n; ++j) {
        const double* ref = &reference[(q0 + j) * d];
        const float* got = &out[static_cast<size_t>(j) * d];
        double dot = 0, gg = 0, rr = 0, dd = 0;
        for (int c = 0; c < d; ++c) {
          const double diff = got[c] - ref[c];
          dd += diff * diff;
          dot += got[c] * ref[c];
          gg += static_cast<double>(got[c]) * got[c];
          rr += ref[c] * ref[c];
        }
        diff2 += dd;
        ref2 += rr;
        const double cosine = (gg > 0 && rr > 0) ? dot / std::sqrt(gg * rr) : (gg == rr ? 1 : 0);
        cos_sum += cosine;
        cos_min = std::min(cos_min, cosine);
      }
    }
  }
  r->num_queries = queries.query_heads * queries.per_head;
  r->attn_rel_l2 = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  r->attn_cosine_mean = cos_sum / std::max(1, r->num_queries);
  r->attn_cosine_min = cos_min;
  return {};
}

// Throughput: the first pass's time, improved by timing-only passes while the passes so far
// are short (see kMinTimingSeconds).
void MeasureThroughput(const Codec& codec, const StoredSequence& stored, const KvTensor& keys,
                       const KvTensor& values, const EvalOptions& options, double* encode_s,
                       double* decode_s) {
  const Preset& preset = *stored.preset;
  const int d = stored.head_dim, g = preset.tile_tokens, tiles_per_head = stored.split.tiles;
  *encode_s = Seconds(stored.encode_time);
  *decode_s = Seconds(stored.decode_time);
  double spent = *encode_s + *decode_s;
  std::vector<uint8_t> scratch(stored.record_bytes);
  std::vector<float> k_hat(static_cast<size_t>(g) * d), v_hat(k_hat.size());
  EncodeOptions encode_options;
  encode_options.iterations = options.iterations;
  for (int pass = 1; tiles_per_head > 0 && pass < kMaxTimingPasses && spent < kMinTimingSeconds;
       ++pass) {
    const Clock::time_point t0 = Clock::now();
    for (int h = 0; h < keys.heads; ++h) {
      for (int i = 0; i < tiles_per_head; ++i) {
        const int first = stored.split.sink + i * g;
        (void)codec.EncodeTile(preset, d, TileIn{keys.Row(h, first), values.Row(h, first)}, scratch,
                               encode_options);
      }
    }
    const Clock::time_point t1 = Clock::now();
    for (int h = 0; h < keys.heads; ++h) {
      for (int i = 0; i < tiles_per_head; ++i) {
        (void)codec.DecodeTile(preset, d,
                               std::span<const uint8_t>(stored.Record(h, i), stored.record_bytes),
                               TileOut{k_hat.data(), v_hat.data()});
      }
    }
    const Clock::time_point t2 = Clock::now();
    *encode_s = std::min(*encode_s, Seconds(t1 - t0));
    *decode_s = std::min(*decode_s, Seconds(t2 - t1));
    spent += Seconds(t2 - t0);
  }
}

}  // namespace

CodecStatus EvaluatePreset(const Preset& preset, const KvTensor& keys, const KvTensor& values,
                           const QuerySet& queries, const std::vector<double>& reference,
                           const EvalOptions& options, ProgressBar* progress,
                           PresetResult* result) {
  const Codec& codec = Codec::Default();
  StoredSequence stored;
  KVARN_RETURN_IF_ERROR(StoreSequence(codec, preset, keys, values, options, progress, &stored));

  PresetResult r;
  r.preset = preset;
  r.heads = keys.heads;
  r.tokens = keys.tokens;
  r.head_dim = keys.head_dim;
  r.sink_tokens = stored.split.sink;
  r.tiles_per_head = stored.split.tiles;
  r.tail_tokens = stored.split.tail;
  KVARN_RETURN_IF_ERROR(MeasureAttention(codec, stored, queries, reference, keys.heads, &r));

  const double elements = 2.0 * keys.heads * keys.tokens * keys.head_dim;
  const double fp16_tokens = static_cast<double>(r.sink_tokens + r.tail_tokens) * keys.heads;
  const double quantized_tiles = static_cast<double>(keys.heads) * r.tiles_per_head;
  const double stored_bits =
      fp16_tokens * 2.0 * keys.head_dim * 16.0 + 8.0 * quantized_tiles * stored.record_bytes;
  r.bits_per_element = preset.BitsPerElement(keys.head_dim);
  r.effective_bits_per_element = stored_bits / elements;
  r.compression_ratio = 16.0 / r.bits_per_element;
  r.effective_compression_ratio = 16.0 / r.effective_bits_per_element;

  ErrorSums k_all = stored.k_fp16, v_all = stored.v_fp16;
  k_all.Add(stored.k_quant);
  v_all.Add(stored.v_quant);
  r.k_rel_l2 = k_all.RelL2();
  r.v_rel_l2 = v_all.RelL2();
  if (r.tiles_per_head > 0) {
    r.k_rel_l2_quantized = stored.k_quant.RelL2();
    r.v_rel_l2_quantized = stored.v_quant.RelL2();
    MeasureThroughput(codec, stored, keys, values, options, &r.encode_seconds, &r.decode_seconds);
    // fp16 K and V of every quantized token: 2 matrices x 2 bytes per element.
    const double fp16_bytes = 4.0 * quantized_tiles * preset.tile_tokens * keys.head_dim;
    if (r.encode_seconds > 0) r.encode_gbps = fp16_bytes / r.encode_seconds / 1e9;
    if (r.decode_seconds > 0) r.decode_gbps = fp16_bytes / r.decode_seconds / 1e9;
  }
  *result = std::move(r);
  return {};
}

CodecStatus ParseSinkPolicy(const std::string& text, const std::vector<Preset>& presets,
                            SinkPolicy* out) {
  if (text == "0") {
    *out = SinkPolicy::kNone;
    return {};
  }
  if (text == "G" || text == "g") {
    *out = SinkPolicy::kTile;
    return {};
  }
  int64_t n = 0;
  KVARN_RETURN_IF_ERROR(ParseInt(text, 0, 1 << 20, "--sink-tokens", &n));
  for (const Preset& p : presets) {
    if (n != p.tile_tokens) {
      return InvalidArgument("--sink-tokens " + text + " is not 0 or " + p.Name() +
                             "'s tile size " + std::to_string(p.tile_tokens) +
                             "; the sink is 0 tokens or one tile (pass G for each preset's tile)");
    }
  }
  *out = SinkPolicy::kTile;
  return {};
}

}  // namespace kvarn::ctl
