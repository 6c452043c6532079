// The `codec` command: its dispatcher, and the encode, decode and synth subcommands
// (eval lives in codec_eval_command.cc).
#include "client/kvarnctl/codec_command.h"

#include <cstdio>
#include <string_view>
#include <vector>

#include "client/kvarnctl/codec_synth.h"
#include "client/kvarnctl/codec_tile.h"
#include "client/kvarnctl/flags.h"
#include "client/kvarnctl/json.h"
#include "kernels/preset.h"

namespace kvarn::ctl {
namespace {

struct CodecSubcommand {
  std::string_view name;
  std::string_view summary;
  CommandHandler handler;
};

constexpr CodecSubcommand kSubcommands[] = {
    {"encode", "quantize one tile of one head (.npy) into a record file", &RunCodecEncode},
    {"decode", "dequantize a record file back to K/V (.npy)", &RunCodecDecode},
    {"eval", "compare presets on your K/V: bits, reconstruction and attention error, speed",
     &RunCodecEval},
    {"synth", "write SYNTHETIC K/V and queries to try the other subcommands on", &RunCodecSynth},
};

constexpr char kPresetsLine[] =
    "Presets: fp16, {kvarn|kivi|hadamard}_k{2|4}v{2|4}_g{64|128}. kvarn: Hadamard rotation,\n"
    "balancing, RTN (kvarnd's default: kvarn_k4v2_g128); kivi: RTN only; hadamard: rotation\n"
    "and RTN.\n";

std::string CodecHelp() {
  std::string h =
      "usage: kvarnctl codec <subcommand> [flags]\n\n"
      "The KVarN codec on your own K/V, no daemon needed. Inputs and outputs are .npy files\n"
      "(numpy.save of a tensor: float32 or float16, C order), e.g. from PyTorch:\n"
      "  numpy.save('k.npy', k[0].float().cpu().numpy())  # k: one layer's [B, H, T, D] keys\n\n"
      "Subcommands:\n";
  for (const CodecSubcommand& s : kSubcommands) {
    h += "  " + std::string(s.name) + std::string(8 - s.name.size(), ' ') + std::string(s.summary) +
         "\n";
  }
  h += "\n";
  h += kPresetsLine;
  h += "Run 'kvarnctl codec <subcommand> --help' for its flags.\n";
  return h;
}

std::string Fixed(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

}  // namespace

int RunCodecCommand(std::span<const std::string> args, const CommandIo& io) {
  if (args.empty()) {
    io.err << CodecHelp();
    return kExitUsage;
  }
  const std::string& sub = args[0];
  if (sub == "--help" || sub == "-h") {
    io.out << CodecHelp();
    return kExitOk;
  }
  if (sub == "help") {
    if (args.size() == 1) {
      io.out << CodecHelp();
      return kExitOk;
    }
    for (const CodecSubcommand& s : kSubcommands) {
      if (s.name == args[1]) {
        const std::vector<std::string> help = {"--help"};
        return s.handler(help, io);
      }
    }
    return ReportError(io, InvalidArgument("codec: no subcommand '" + args[1] +
                                           "'; subcommands: encode, decode, eval, synth"));
  }
  for (const CodecSubcommand& s : kSubcommands) {
    if (s.name == sub) return s.handler(args.subspan(1), io);
  }
  return ReportError(io, InvalidArgument("codec: unknown subcommand '" + sub +
                                         "'; subcommands: encode, decode, eval, synth "
                                         "(see kvarnctl codec --help)"));
}

int RunCodecEncode(std::span<const std::string> args, const CommandIo& io) {
  EncodeRequest req;
  int64_t iterations = kDefaultIterations;
  FlagSet flags("codec encode");
  flags.String("preset", &req.preset, "P", "codec preset, e.g. kvarn_k4v2_g128", true);
  flags.String("keys", &req.keys_path, "K.npy", "keys of one tile of one head, [G, D]", true);
  flags.String("values", &req.values_path, "V.npy", "values, same shape as the keys", true);
  flags.String("out", &req.out_path, "R.bin", "the record file to write", true);
  flags.Int("iterations", &iterations, 0, 64, "N", "balancing iterations (default 8)");
  flags.Bool("head-dim-check", &req.verify,
             "read the record back as decode does; print its head_dim and errors");
  bool json = false;
  flags.Bool("json", &json,
             "print one JSON object: record, preset, head_dim, record_bytes, bits_per_element, "
             "compression_ratio, check");
  const CodecStatus parsed = flags.Parse(args);
  if (!parsed.ok()) return ReportError(io, parsed);
  if (flags.help_requested()) {
    io.out << "usage: kvarnctl codec encode --preset P --keys K.npy --values V.npy --out R.bin\n"
              "                             [--iterations N] [--head-dim-check] [--json]\n\n"
              "Quantizes one tile of one head into a record (KVARN_SPEC.md section 5). K and V\n"
              "are [G, D]: G = the preset's tile tokens (128, or 64 for *_g64), D = head_dim\n"
              "(64, 128, 256 or 512); token-major and unrotated, as the attention layer made\n"
              "them, e.g. k[b, head, t0:t0+G, :] of a [B, H, T, D] cache.\n\nFlags:\n"
           << flags.Usage() << "\n"
           << kPresetsLine;
    return kExitOk;
  }
  req.iterations = static_cast<int>(iterations);
  EncodeReport report;
  const CodecStatus s = EncodeFiles(req, &report);
  if (!s.ok()) return ReportError(io, s);
  if (json) {
    JsonWriter j;
    j.BeginObject().Field("record", req.out_path).Field("preset", report.preset);
    j.Field("head_dim", report.head_dim).Field("record_bytes", uint64_t{report.record_bytes});
    j.Field("bits_per_element", report.bits_per_element);
    j.Field("compression_ratio", 16.0 / report.bits_per_element);
    if (req.verify) {
      j.Key("check").BeginObject().Field("inferred_head_dim", report.inferred_head_dim);
      j.Field("k_rel_l2", report.k_rel_l2).Field("v_rel_l2", report.v_rel_l2).EndObject();
    } else {
      j.Key("check").Null();
    }
    io.out << j.EndObject().str() << "\n";
    return kExitOk;
  }
  io.out << "wrote " << req.out_path << ": " << report.preset << " record, head_dim "
         << report.head_dim << ", " << report.record_bytes << " bytes ("
         << Fixed("%.3f", report.bits_per_element) << " bits/element, "
         << Fixed("%.2f", 16.0 / report.bits_per_element) << "x smaller than fp16)\n";
  if (req.verify) {
    io.out << "check: decode infers head_dim " << report.inferred_head_dim << " from the "
           << report.record_bytes << "-byte size; relative L2 error K "
           << Fixed("%.5f", report.k_rel_l2) << ", V " << Fixed("%.5f", report.v_rel_l2) << "\n";
  }
  return kExitOk;
}

int RunCodecDecode(std::span<const std::string> args, const CommandIo& io) {
  DecodeRequest req;
  int64_t head_dim = 0;
  FlagSet flags("codec decode");
  flags.String("preset", &req.preset, "P", "the preset the record was encoded with", true);
  flags.String("record", &req.record_path, "R.bin", "record file written by codec encode", true);
  flags.String("keys-out", &req.keys_out, "K.npy", "dequantized keys to write, float32 [G, D]",
               true);
  flags.String("values-out", &req.values_out, "V.npy", "dequantized values, float32 [G, D]", true);
  flags.Int("head-dim", &head_dim, 1, 1 << 20, "D",
            "head_dim of the record (default: inferred from its size)");
  bool json = false;
  flags.Bool("json", &json,
             "print one JSON object: keys_out, values_out, preset, tokens, head_dim, "
             "head_dim_inferred, record_bytes");
  const CodecStatus parsed = flags.Parse(args);
  if (!parsed.ok()) return ReportError(io, parsed);
  if (flags.help_requested()) {
    io.out << "usage: kvarnctl codec decode --preset P --record R.bin --keys-out K.npy\n"
              "                             --values-out V.npy [--head-dim D] [--json]\n\n"
              "Dequantizes one record into K and V, float32 [G, D], token-major, in the original\n"
              "(unrotated) frame. The head_dim follows from the record's size for the preset;\n"
              "a record of any other size is rejected.\n\nFlags:\n"
           << flags.Usage() << "\n"
           << kPresetsLine;
    return kExitOk;
  }
  req.head_dim = static_cast<int>(head_dim);
  DecodeReport report;
  const CodecStatus s = DecodeFiles(req, &report);
  if (!s.ok()) return ReportError(io, s);
  if (json) {
    JsonWriter j;
    j.BeginObject().Field("keys_out", req.keys_out).Field("values_out", req.values_out);
    j.Field("preset", report.preset).Field("tokens", report.tokens).Field("head_dim", report.head_dim);
    j.Field("head_dim_inferred", report.head_dim_inferred);
    j.Field("record_bytes", uint64_t{report.record_bytes}).EndObject();
    io.out << j.str() << "\n";
    return kExitOk;
  }
  io.out << "wrote " << req.keys_out << " and " << req.values_out << ": float32 (" << report.tokens
         << ", " << report.head_dim << "), original frame; head_dim " << report.head_dim
         << (report.head_dim_inferred ? " inferred from the " : " given, matching the ")
         << report.record_bytes << "-byte " << report.preset << " record\n";
  return kExitOk;
}

int RunCodecSynth(std::span<const std::string> args, const CommandIo& io) {
  std::string dir;
  SynthOptions o;
  int64_t tokens = o.tokens, heads = o.heads, head_dim = o.head_dim;
  FlagSet flags("codec synth");
  flags.String("out-dir", &dir, "DIR", "where to write k.npy, v.npy, q.npy (created if needed)",
               true);
  flags.Int("tokens", &tokens, 1, 1 << 20, "T", "tokens per head (default 2048)");
  flags.Int("heads", &heads, 1, 256, "H", "kv-heads (default 4)");
  flags.Int("head-dim", &head_dim, 1, 4096, "D", "64, 128, 256 or 512 (default 128)");
  flags.Uint64("seed", &o.seed, "S", "random seed (default 1); same seed, same files");
  bool json = false;
  flags.Bool("json", &json,
             "print one JSON object: synthetic, seed, heads, tokens, head_dim, queries, files, "
             "sink_mass, effective_tokens");
  const CodecStatus parsed = flags.Parse(args);
  if (!parsed.ok()) return ReportError(io, parsed);
  if (flags.help_requested()) {
    io.out << "usage: kvarnctl codec synth --out-dir DIR [--tokens T] [--heads H] [--head-dim D]\n"
              "                            [--seed S] [--json]\n\n"
              "Writes SYNTHETIC K/V, not taken from any model: k.npy and v.npy [H, T, D] and\n"
              "decode queries q.npy [H, 4, D], float32. They imitate what makes real caches hard\n"
              "to quantize: a few key channels with large magnitude and offset, RoPE (channel\n"
              "pairs rotating with position at geometric frequencies), an attention sink at\n"
              "token 0 with a large key norm, heavy-tailed (Student-t) values, uneven channel\n"
              "and token scales. Errors measured on them are indicative only; run codec eval on\n"
              "K/V dumped from your model for real figures. Deterministic for a seed.\n\nFlags:\n"
           << flags.Usage();
    return kExitOk;
  }
  o.tokens = static_cast<int>(tokens);
  o.heads = static_cast<int>(heads);
  o.head_dim = static_cast<int>(head_dim);
  const CodecStatus valid = CheckSynthOptions(o);
  if (!valid.ok()) return ReportError(io, valid);
  const SynthData data = MakeSynthetic(o);
  std::vector<std::string> files;
  const CodecStatus s = WriteSynthetic(dir, data, &files);
  if (!s.ok()) return ReportError(io, s);
  const AttentionShape shape = DescribeAttention(data);
  if (json) {
    JsonWriter j;
    j.BeginObject().Field("synthetic", true).Field("seed", o.seed).Field("heads", o.heads);
    j.Field("tokens", o.tokens).Field("head_dim", o.head_dim).Field("queries", o.queries);
    j.Key("files").BeginObject().Field("keys", files[0]).Field("values", files[1]);
    j.Field("queries", files[2]).EndObject();
    j.Field("sink_mass", shape.sink_mass).Field("effective_tokens", shape.effective_tokens).EndObject();
    io.out << j.str() << "\n";
    return kExitOk;
  }
  const std::string dims =
      std::to_string(o.heads) + ", " + std::to_string(o.tokens) + ", " + std::to_string(o.head_dim);
  io.out << "wrote SYNTHETIC K/V (generated, not from a model), float32, seed " << o.seed << ":\n"
         << "  " << files[0] << "  keys    [" << dims << "]\n"
         << "  " << files[1] << "  values  [" << dims << "]\n"
         << "  " << files[2] << "  queries [" << o.heads << ", " << o.queries << ", " << o.head_dim
         << "] (decode queries at position " << o.tokens << ")\n"
         << "features: outlier key channels with large offsets, RoPE-rotated key pairs, a sink at "
            "token 0, Student-t values;\n"
         << "their attention: token 0 takes " << Fixed("%.0f", 100 * shape.sink_mass)
         << "% of the mass on average, ~" << Fixed("%.0f", shape.effective_tokens)
         << " tokens effectively attended (exp entropy)\n";
  return kExitOk;
}

}  // namespace kvarn::ctl
