// `kvarnctl codec eval`: flags, input checks, progress and output around codec_eval.h.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "client/kvarnctl/codec_command.h"
#include "client/kvarnctl/codec_eval.h"
#include "client/kvarnctl/codec_io.h"
#include "client/kvarnctl/flags.h"
#include "kernels/codec.h"

namespace kvarn::ctl {
namespace {

// Inputs with more tiles of work than this show a progress bar (on a terminal).
constexpr int64_t kProgressThresholdTiles = 64;
constexpr int kDefaultRandomQueries = 16;

constexpr char kEvalUsage[] =
    "usage: kvarnctl codec eval --preset P [--preset P2 ...] --keys K.npy --values V.npy\n"
    "                           [--queries Q.npy] [--sink-tokens 0|G] [--iterations N]\n"
    "                           [--json] [--seed S] [--random-queries N] [--progress MODE]\n\n"
    "Runs your K/V through each preset as the daemon would store it and reports, side by side:\n"
    "stored bits per element (per tile, and over the whole sequence with the fp16 parts),\n"
    "compression vs fp16, K and V reconstruction error, decode attention error against exact\n"
    "attention, and encode/decode speed.\n\n"
    "Input: K and V of one layer, [T, D] (one head) or [H, T, D], any T >= 1, D in 64, 128,\n"
    "256, 512; unrotated, as the attention layer made them (post-RoPE keys). Per head, the\n"
    "first G tokens stay fp16 (the attention sink; --sink-tokens 0 quantizes them too), then\n"
    "full G-token tiles are quantized and the remaining < G tokens stay fp16 (the tail).\n\n"
    "Queries: Q.npy [Nq, D] (the same for every head) or [Hq, Nq, D] with Hq a multiple of H\n"
    "(grouped-query attention: query head i reads kv-head i / (Hq/H)). Without --queries,\n"
    "16 random queries per head with N(0, 1) channels from --seed; the output says so.\n"
    "Attention error: Codec::AttendDecode of each query over all T tokens (softmax scale\n"
    "1/sqrt(D)) against exact fp64 softmax attention over the original K/V.\n"
    "Throughput: fp16-equivalent K+V bytes of the quantized tiles per second spent inside\n"
    "EncodeTile / DecodeTile, one thread, steady clock; when a pass over the tiles is short\n"
    "(< 0.2 s), up to 5 passes are timed and the fastest is reported.\n\n"
    "A progress bar is drawn on stderr when the work exceeds 64 tiles and stderr is a\n"
    "terminal (--progress always|never overrides). Exit status 2 on bad flags or input.\n\n"
    "Flags:\n";

std::string ShapeLine(const KvTensor& k) {
  return std::to_string(k.heads) + (k.heads == 1 ? " head" : " heads") + " x " +
         std::to_string(k.tokens) + " tokens x head_dim " + std::to_string(k.head_dim) + ", " +
         NpyTypeName(k.file_type);
}

// "per head: 128-token fp16 sink, 15 quantized tiles of 128, 0-token fp16 tail" for each
// distinct split among the presets.
std::string PolicyLines(const std::vector<PresetResult>& results) {
  std::map<std::string, std::vector<std::string>> by_split;
  std::vector<std::string> order;
  for (const PresetResult& r : results) {
    const std::string split = std::to_string(r.sink_tokens) + "-token fp16 sink, " +
                              std::to_string(r.tiles_per_head) + " quantized tile" +
                              (r.tiles_per_head == 1 ? "" : "s") + " of " +
                              std::to_string(r.preset.tile_tokens) + " tokens, " +
                              std::to_string(r.tail_tokens) + "-token fp16 tail";
    if (!by_split.count(split)) order.push_back(split);
    by_split[split].push_back(r.preset.Name());
  }
  std::string out;
  for (const std::string& split : order) {
    out += "per head: " + split;
    if (order.size() > 1) {
      out += " (";
      for (size_t i = 0; i < by_split[split].size(); ++i) {
        out += (i ? ", " : "") + by_split[split][i];
      }
      out += ")";
    }
    out += "\n";
  }
  return out;
}

constexpr char kLegend[] =
    "bits/el: stored bits per K or V element, scales included; tile = one quantized tile,\n"
    "  total = the whole sequence with its fp16 sink and tail. ratio: 16 / bits.\n"
    "K err, V err: relative L2 error ||X^ - X|| / ||X|| in the original frame; all = whole\n"
    "  sequence, quant = quantized tiles only. attn err, attn cos: decode attention output\n"
    "  vs exact fp64 attention (relative L2 over all queries; mean cosine).\n"
    "enc, dec GB/s: fp16 K+V bytes of the quantized tiles per second inside the codec, one "
    "thread.\n";

}  // namespace

int RunCodecEval(std::span<const std::string> args, const CommandIo& io) {
  std::vector<std::string> preset_names;
  std::string keys_path, values_path, queries_path, sink_text = "G", progress_mode = "auto";
  int64_t iterations = kDefaultIterations, random_queries = kDefaultRandomQueries;
  uint64_t seed = 1;
  bool json = false;
  FlagSet flags("codec eval");
  flags.StringList("preset", &preset_names, "P", "a preset to evaluate, e.g. kvarn_k4v2_g128",
                   true);
  flags.String("keys", &keys_path, "K.npy", "keys, [T, D] or [H, T, D]", true);
  flags.String("values", &values_path, "V.npy", "values, the same shape", true);
  flags.String("queries", &queries_path, "Q.npy", "decode queries, [Nq, D] or [Hq, Nq, D]");
  flags.String("sink-tokens", &sink_text, "0|G", "fp16 sink per head: G (default) or 0");
  flags.Int("iterations", &iterations, 0, 64, "N", "balancing iterations (default 8)");
  flags.Bool("json", &json, "one JSON object per preset per line instead of the table");
  flags.Uint64("seed", &seed, "S", "seed of the random queries (default 1)");
  flags.Int("random-queries", &random_queries, 1, 4096, "N",
            "random queries per head without --queries (default 16)");
  flags.String("progress", &progress_mode, "MODE", "auto (default), always or never");
  const CodecStatus parsed = flags.Parse(args);
  if (!parsed.ok()) return ReportError(io, parsed);
  if (flags.help_requested()) {
    io.out << kEvalUsage << flags.Usage() << "\n" << kJsonKeysHelp;
    return kExitOk;
  }
  if (progress_mode != "auto" && progress_mode != "always" && progress_mode != "never") {
    return ReportError(io, InvalidArgument("codec eval: --progress " + progress_mode +
                                           " is not auto, always or never"));
  }
  std::vector<Preset> presets;
  for (const std::string& name : preset_names) {
    Preset p;
    const CodecStatus s = ParsePreset(name, &p);
    if (!s.ok()) return ReportError(io, InvalidArgument("--preset: " + s.message()));
    presets.push_back(p);
  }
  EvalOptions options;
  options.iterations = static_cast<int>(iterations);
  if (const CodecStatus s = ParseSinkPolicy(sink_text, presets, &options.sink); !s.ok()) {
    return ReportError(io, s);
  }

  KvTensor keys, values;
  if (const CodecStatus s = LoadSequence(keys_path, &keys); !s.ok()) return ReportError(io, s);
  if (const CodecStatus s = LoadSequence(values_path, &values); !s.ok()) {
    return ReportError(io, s);
  }
  if (const CodecStatus s = CheckSameShape(keys, values); !s.ok()) return ReportError(io, s);
  QuerySet queries;
  if (!queries_path.empty()) {
    if (flags.Seen("random-queries")) {
      return ReportError(
          io, InvalidArgument("codec eval: --random-queries and --queries exclude each other"));
    }
    if (const CodecStatus s = LoadQueries(queries_path, keys, &queries); !s.ok()) {
      return ReportError(io, s);
    }
  } else {
    queries = RandomQueries(keys, static_cast<int>(random_queries), seed);
  }

  int64_t total_tiles = 0;
  for (const Preset& p : presets) total_tiles += TilesOfWork(p, keys, options.sink);
  const bool show_progress =
      progress_mode == "always" ||
      (progress_mode == "auto" && io.err_is_terminal && total_tiles > kProgressThresholdTiles);
  ProgressBar progress(io.err, total_tiles, show_progress);
  if (show_progress) progress.Advance(0, "exact fp64 attention");
  const std::vector<double> reference = ExactAttention(keys, values, queries);

  std::vector<PresetResult> results;
  for (const Preset& p : presets) {
    PresetResult r;
    const CodecStatus s =
        EvaluatePreset(p, keys, values, queries, reference, options, &progress, &r);
    if (!s.ok()) {
      progress.Finish();
      return ReportError(io, s);
    }
    results.push_back(std::move(r));
  }
  progress.Finish();

  if (json) {
    for (const PresetResult& r : results) {
      io.out << FormatJsonLine(r, queries, seed, options.iterations) << "\n";
    }
    return kExitOk;
  }
  const Codec& codec = Codec::Default();
  io.out << "keys " << keys.path << ", values " << values.path << ": " << ShapeLine(keys) << "\n"
         << PolicyLines(results) << "queries: " << queries.source << "\n"
         << "reference: exact fp64 softmax attention over the original K/V, scale 1/sqrt("
         << keys.head_dim << ")\n"
         << "codec: " << codec.name() << " (" << codec.target() << "), " << options.iterations
         << " balancing iterations, one thread\n\n"
         << FormatTable(results) << "\n"
         << kLegend;
  return kExitOk;
}

}  // namespace kvarn::ctl
