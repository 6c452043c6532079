// `kvarnctl codec eval`: how well each preset keeps the user's K/V, run through the same
// sequence policy as the daemon (KVARN_SPEC.md §6): per head, an fp16 sink of the first G
// tokens (or none), the full G-token tiles quantized by Codec::Default(), and the partial
// tail in fp16. The fp16 parts are stored as the cache stores them: in the preset's storage
// frame, rounded to fp16.
//
// Figures per preset: stored bits per element (per tile, and over the whole sequence with
// the fp16 parts), relative L2 reconstruction error of K and V in the original frame (whole
// sequence, and quantized tiles only), decode attention through Codec::AttendDecode against
// exact fp64 softmax attention over the original K/V, and single-thread encode and decode
// throughput in GB/s of the fp16 K+V those tiles hold (short runs are repeated, see
// PresetResult::encode_gbps).
#ifndef KVARN_CLIENT_KVARNCTL_CODEC_EVAL_H_
#define KVARN_CLIENT_KVARNCTL_CODEC_EVAL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "client/kvarnctl/codec_io.h"
#include "client/kvarnctl/progress.h"
#include "kernels/preset.h"
#include "kernels/status.h"

namespace kvarn::ctl {

enum class SinkPolicy {
  kTile,  // the first G tokens of each head stay fp16 (the daemon's default)
  kNone,  // quantize from token 0
};

struct EvalOptions {
  SinkPolicy sink = SinkPolicy::kTile;
  int iterations = kDefaultIterations;
};

struct PresetResult {
  Preset preset;
  int heads = 0, tokens = 0, head_dim = 0;
  // Per head: tokens in the fp16 sink, full tiles quantized, tokens in the fp16 tail.
  int sink_tokens = 0, tiles_per_head = 0, tail_tokens = 0;

  double bits_per_element = 0;            // one tile, metadata included (the codec's figure)
  double effective_bits_per_element = 0;  // the whole sequence, fp16 sink and tail included
  double compression_ratio = 0;           // 16 / bits_per_element
  double effective_compression_ratio = 0;

  // Relative L2 error ||X^ - X|| / ||X||, original frame.
  double k_rel_l2 = 0, v_rel_l2 = 0;                             // whole sequence
  std::optional<double> k_rel_l2_quantized, v_rel_l2_quantized;  // tiles only (none: no tile)

  // Decode attention of every query over all T tokens vs exact fp64 attention.
  double attn_rel_l2 = 0;       // over all outputs: sqrt(sum |o - o*|^2 / sum |o*|^2)
  double attn_cosine_mean = 0;  // cosine(o, o*) averaged over (query head, query)
  double attn_cosine_min = 0;
  int num_queries = 0;  // query vectors in total, all heads

  // fp16-equivalent K+V bytes of the quantized tiles / seconds inside EncodeTile or
  // DecodeTile, one thread; the fastest of up to 5 passes over the tiles while the passes
  // so far took under 0.2 s. None when no tile was quantized.
  std::optional<double> encode_gbps, decode_gbps;
  double encode_seconds = 0, decode_seconds = 0;  // of that fastest pass
};

// Exact decode attention in fp64 over the original K/V, softmax scale 1/sqrt(D):
// [query_heads][per_head][D].
std::vector<double> ExactAttention(const KvTensor& keys, const KvTensor& values,
                                   const QuerySet& queries);

// Tiles of work EvaluatePreset does (encode + decode counted once per tile), for sizing a
// progress bar.
int64_t TilesOfWork(const Preset& preset, const KvTensor& keys, SinkPolicy sink);

// Evaluates one preset. `reference` is ExactAttention(keys, values, queries). `progress`
// (may be null) advances by one per tile. Codec errors reach the caller with the head and
// tile they happened in.
// REQUIRES: keys and values of the same shape (CheckSameShape), queries for these keys.
CodecStatus EvaluatePreset(const Preset& preset, const KvTensor& keys, const KvTensor& values,
                           const QuerySet& queries, const std::vector<double>& reference,
                           const EvalOptions& options, ProgressBar* progress, PresetResult* result);

// Parses --sink-tokens: "0", "G", or the tile size of every preset given.
CodecStatus ParseSinkPolicy(const std::string& text, const std::vector<Preset>& presets,
                            SinkPolicy* out);

// Output. The JSON line's keys are stable and listed in kJsonKeysHelp.
std::string FormatJsonLine(const PresetResult& r, const QuerySet& queries, uint64_t seed,
                           int iterations);
std::string FormatTable(const std::vector<PresetResult>& results);
extern const char kJsonKeysHelp[];

}  // namespace kvarn::ctl

#endif  // KVARN_CLIENT_KVARNCTL_CODEC_EVAL_H_
