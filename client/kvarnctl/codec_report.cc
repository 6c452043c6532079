// Output of `kvarnctl codec eval`: the aligned table and the JSON lines.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "client/kvarnctl/codec_eval.h"
#include "client/kvarnctl/json.h"

namespace kvarn::ctl {
namespace {

std::string Printf(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

// Errors span 1e-6 .. 1: fixed point where it reads well, scientific below.
std::string Err(double v) { return v >= 1e-3 || v == 0 ? Printf("%.4f", v) : Printf("%.2e", v); }
std::string Err(const std::optional<double>& v) { return v ? Err(*v) : "-"; }
std::string Gbps(const std::optional<double>& v) { return v ? Printf("%.2f", *v) : "-"; }

// A JSON value as text, for the fixed-order line below.
std::string JsonNumber(double v) { return JsonWriter().Double(v).str(); }
std::string JsonNumber(const std::optional<double>& v) { return v ? JsonNumber(*v) : "null"; }
std::string JsonString(const std::string& s) { return JsonQuote(s); }


}  // namespace

const char kJsonKeysHelp[] =
    "JSON output (--json): one object per preset per line, keys in this order:\n"
    "  preset, method, key_bits, value_bits, tile_tokens   the preset\n"
    "  heads, tokens, head_dim                               the input (heads = 1 for [T, D])\n"
    "  sink_tokens, tiles_per_head, tail_tokens              the per-head split: fp16 sink,\n"
    "                                                        quantized tiles, fp16 tail\n"
    "  bits_per_element                                      one tile, scales included\n"
    "  effective_bits_per_element                            whole sequence incl. fp16 parts\n"
    "  compression_ratio, effective_compression_ratio        16 / the bits above\n"
    "  k_rel_l2, v_rel_l2                                    ||X^-X||/||X||, whole sequence,\n"
    "                                                        original frame\n"
    "  k_rel_l2_quantized, v_rel_l2_quantized                the same over the quantized tiles\n"
    "                                                        only (null when there are none)\n"
    "  attn_rel_l2, attn_cosine_mean, attn_cosine_min        decode attention vs exact fp64\n"
    "  queries (\"file\" or \"random\"), num_queries (all heads), query_seed (null for file)\n"
    "  iterations                                            balancing iterations\n"
    "  encode_gbps, decode_gbps                              fp16 K+V GB/s, one thread (null\n"
    "                                                        when no tile was quantized)\n"
    "  encode_seconds, decode_seconds                        time inside the codec calls\n"
    "                                                        (the fastest timed pass)\n";

std::string FormatJsonLine(const PresetResult& r, const QuerySet& queries, uint64_t seed,
                           int iterations) {
  std::string j = "{";
  const auto add = [&j](const char* key, const std::string& value) {
    if (j.size() > 1) j += ", ";
    j += JsonString(key) + ": " + value;
  };
  const auto num = [](int v) { return std::to_string(v); };
  add("preset", JsonString(r.preset.Name()));
  add("method", JsonString(MethodName(r.preset.method)));
  add("key_bits", num(r.preset.key_bits));
  add("value_bits", num(r.preset.value_bits));
  add("tile_tokens", num(r.preset.tile_tokens));
  add("heads", num(r.heads));
  add("tokens", num(r.tokens));
  add("head_dim", num(r.head_dim));
  add("sink_tokens", num(r.sink_tokens));
  add("tiles_per_head", num(r.tiles_per_head));
  add("tail_tokens", num(r.tail_tokens));
  add("bits_per_element", JsonNumber(r.bits_per_element));
  add("effective_bits_per_element", JsonNumber(r.effective_bits_per_element));
  add("compression_ratio", JsonNumber(r.compression_ratio));
  add("effective_compression_ratio", JsonNumber(r.effective_compression_ratio));
  add("k_rel_l2", JsonNumber(r.k_rel_l2));
  add("v_rel_l2", JsonNumber(r.v_rel_l2));
  add("k_rel_l2_quantized", JsonNumber(r.k_rel_l2_quantized));
  add("v_rel_l2_quantized", JsonNumber(r.v_rel_l2_quantized));
  add("attn_rel_l2", JsonNumber(r.attn_rel_l2));
  add("attn_cosine_mean", JsonNumber(r.attn_cosine_mean));
  add("attn_cosine_min", JsonNumber(r.attn_cosine_min));
  add("queries", JsonString(queries.from_file ? "file" : "random"));
  add("num_queries", num(r.num_queries));
  add("query_seed", queries.from_file ? "null" : std::to_string(seed));
  add("iterations", num(iterations));
  add("encode_gbps", JsonNumber(r.encode_gbps));
  add("decode_gbps", JsonNumber(r.decode_gbps));
  add("encode_seconds", JsonNumber(r.encode_seconds));
  add("decode_seconds", JsonNumber(r.decode_seconds));
  return j + "}";
}

std::string FormatTable(const std::vector<PresetResult>& results) {
  std::vector<std::vector<std::string>> rows = {
      {"preset", "bits/el", "bits/el", "ratio", "ratio", "K err", "K err", "V err", "V err",
       "attn err", "attn cos", "enc GB/s", "dec GB/s"},
      {"", "tile", "total", "tile", "total", "all", "quant", "all", "quant", "", "mean", "", ""},
  };
  for (const PresetResult& r : results) {
    rows.push_back(
        {r.preset.Name(), Printf("%.3f", r.bits_per_element),
         Printf("%.3f", r.effective_bits_per_element), Printf("%.2fx", r.compression_ratio),
         Printf("%.2fx", r.effective_compression_ratio), Err(r.k_rel_l2), Err(r.k_rel_l2_quantized),
         Err(r.v_rel_l2), Err(r.v_rel_l2_quantized), Err(r.attn_rel_l2),
         Printf("%.5f", r.attn_cosine_mean), Gbps(r.encode_gbps), Gbps(r.decode_gbps)});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      const size_t pad = width[c] - row[c].size();
      if (c == 0) {
        line += row[c] + std::string(pad, ' ');
      } else {
        line += std::string(pad + 2, ' ') + row[c];
      }
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + '\n';
  }
  return out;
}

}  // namespace kvarn::ctl
