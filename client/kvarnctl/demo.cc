// `kvarnctl demo`: several simulated inference workers sharing a kvarnd. Each worker thread
// opens its own session and serves requests: a prompt made of one of a few shared system
// prompts plus a private user part; it adopts the cached prefix, prefills the rest through
// the shared-memory tail (Stage + Commit), then decodes token by token, running decode
// attention in place over its blocks before each append. K/V are synthetic but a pure
// function of (position, token id), so identical prefixes produce identical tiles, as a
// real model would. A progress line goes to stderr; a summary to stdout (one JSON object
// with --json).
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "client/kvarnctl/daemon_commands.h"
#include "client/kvarnctl/json.h"
#include "kernels/fp16.h"

namespace kvarn::ctl {
namespace {

struct DemoConfig {
  int64_t workers = 4, requests = 8, system_prompts = 2, system_tokens = 512;
  int64_t user_min = 64, user_max = 256, decode_tokens = 128;
  uint64_t seed = 1;
};

// Deterministic pseudo-normal values for element i of token (pos, id).
inline float Synth(uint64_t pos, uint32_t id, uint64_t i, bool value) {
  uint64_t x = (pos * 0x9E3779B97F4A7C15ull) ^ (uint64_t{id} * 0xC2B2AE3D27D4EB4Full) ^ (i * 0x165667B19E3779F9ull) ^ (value ? 0xABCDEFull : 0);
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 32;
  // Sum of four 16-bit uniforms: roughly normal, mean 0, std 1.
  float s = 0;
  for (int k = 0; k < 4; ++k) s += static_cast<float>((x >> (16 * k)) & 0xFFFF) / 65535.0f;
  return (s - 2.0f) * 1.732f * (1.0f + (i % 16 == 3 ? 4.0f : 0.0f));  // a few outlier channels
}

void TokensKv(const BlockLayout& l, uint64_t first_pos, std::span<const uint32_t> ids, std::vector<uint16_t>* k,
              std::vector<uint16_t>* v) {
  const size_t per = l.slots() * static_cast<size_t>(l.head_dim);
  k->resize(ids.size() * per);
  v->resize(ids.size() * per);
  for (size_t t = 0; t < ids.size(); ++t) {
    for (size_t i = 0; i < per; ++i) {
      (*k)[t * per + i] = FloatToHalf(Synth(first_pos + t, ids[t], i, false));
      (*v)[t * per + i] = FloatToHalf(Synth(first_pos + t, ids[t], i, true));
    }
  }
}

struct Totals {
  std::atomic<int64_t> requests{0}, prompt_tokens{0}, cached_tokens{0}, prefill{0}, decode{0};
  std::mutex mu;
  double attn_err_sum = 0;
  int attn_checks = 0;
  std::string first_error;
};

// Exact attention over the fp16-rounded synthetic K/V of one layer, for the check.
double AttentionError(const Session& s, uint64_t seq, const std::vector<uint32_t>& ids, int layer) {
  const BlockLayout& l = s.block_layout();
  const int d = l.head_dim, hkv = l.num_kv_heads, group = 2, hq = hkv * group;
  std::vector<float> q(static_cast<size_t>(hq) * d), out(q.size());
  std::mt19937 rng(static_cast<uint32_t>(seq));
  std::normal_distribution<float> nd;
  for (float& x : q) x = nd(rng);
  if (!s.Attend(seq, layer, q.data(), hq, out.data()).ok()) return -1;
  double num = 0, den = 0;
  const size_t per = l.slots() * static_cast<size_t>(d);
  for (int h = 0; h < hkv; ++h) {
    const size_t base = l.slot(layer, h) * static_cast<size_t>(d);
    for (int g = 0; g < group; ++g) {
      const float* qh = &q[static_cast<size_t>(h * group + g) * d];
      std::vector<double> score(ids.size());
      double m = -1e300;
      for (size_t t = 0; t < ids.size(); ++t) {
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += qh[c] * HalfToFloat(FloatToHalf(Synth(t, ids[t], base + c - 0 * per, false)));
        score[t] = dot / std::sqrt(static_cast<double>(d));
        m = std::max(m, score[t]);
      }
      double sum = 0;
      for (double& x : score) sum += (x = std::exp(x - m));
      for (int c = 0; c < d; ++c) {
        double o = 0;
        for (size_t t = 0; t < ids.size(); ++t) o += score[t] / sum * HalfToFloat(FloatToHalf(Synth(t, ids[t], base + c, true)));
        const double e = out[static_cast<size_t>(h * group + g) * d + c] - o;
        num += e * e;
        den += o * o;
      }
    }
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

void Worker(int w, const DemoConfig& cfg, const DaemonFlags& flags, const std::vector<std::vector<uint32_t>>& systems,
            Totals* totals) {
  const auto fail = [&](const std::string& what, const absl::Status& s) {
    std::lock_guard<std::mutex> lock(totals->mu);
    if (totals->first_error.empty()) totals->first_error = "worker " + std::to_string(w) + ": " + what + ": " + s.ToString();
  };
  auto c = Connect(flags, /*observer=*/false, 2, "kvarnctl demo worker " + std::to_string(w));
  if (!c.ok()) return fail("connect", c.status());
  Session& s = *c->session;
  const BlockLayout& l = s.block_layout();
  const int g = l.tile_tokens;
  std::mt19937 rng(static_cast<uint32_t>(cfg.seed * 1000 + w));
  std::vector<uint16_t> k, v;
  for (int r = 0; r < cfg.requests; ++r) {
    std::vector<uint32_t> prompt = systems[(w + r) % systems.size()];
    const int user = static_cast<int>(cfg.user_min + rng() % (cfg.user_max - cfg.user_min + 1));
    for (int i = 0; i < user; ++i) prompt.push_back(1000 + rng() % 30000);
    auto seq = s.CreateSequence(prompt);
    if (!seq.ok()) return fail("create", seq.status());
    totals->prompt_tokens += static_cast<int64_t>(prompt.size());
    totals->cached_tokens += static_cast<int64_t>(seq->cached_tokens);
    std::vector<uint32_t> ids(prompt.begin(), prompt.begin() + static_cast<long>(seq->cached_tokens));
    // Prefill: tail-sized chunks from the cached prefix on.
    size_t pos = seq->cached_tokens;
    while (pos < prompt.size()) {
      const size_t n = std::min(prompt.size() - pos, static_cast<size_t>(g - static_cast<int>(pos % g)));
      std::span<const uint32_t> chunk(prompt.data() + pos, n);
      TokensKv(l, pos, chunk, &k, &v);
      auto a = s.Append(seq->id, chunk, k.data(), v.data(), DType::kF16);
      if (!a.ok()) return fail("prefill", a.status());
      ids.insert(ids.end(), chunk.begin(), chunk.end());
      pos += n;
      totals->prefill += static_cast<int64_t>(n);
    }
    // Decode: attend in place (one layer a step), then append the next token.
    std::vector<float> q(static_cast<size_t>(l.num_kv_heads) * 2 * l.head_dim, 0.05f), out(q.size());
    for (int t = 0; t < cfg.decode_tokens; ++t) {
      if (!s.Attend(seq->id, t % l.num_layers, q.data(), l.num_kv_heads * 2, out.data()).ok()) {
        return fail("attend", absl::InternalError("decode attention failed"));
      }
      const uint32_t next[] = {static_cast<uint32_t>(1000 + rng() % 30000)};
      TokensKv(l, ids.size(), next, &k, &v);
      auto a = s.Append(seq->id, next, k.data(), v.data(), DType::kF16);
      if (!a.ok()) return fail("decode", a.status());
      ids.push_back(next[0]);
      ++totals->decode;
    }
    if (r == 0) {
      const double e = AttentionError(s, seq->id, ids, 0);
      std::lock_guard<std::mutex> lock(totals->mu);
      if (e >= 0) totals->attn_err_sum += e, ++totals->attn_checks;
    }
    const uint64_t done[] = {seq->id};
    if (absl::Status st = s.Release(done); !st.ok()) return fail("release", st);
    ++totals->requests;
  }
}

}  // namespace

int RunDemo(std::span<const std::string> args, const CommandIo& io) {
  FlagSet flags("demo");
  DaemonFlags d;
  d.tenant = "demo";
  d.Register(&flags);
  DemoConfig cfg;
  bool json = false;
  flags.Int("workers", &cfg.workers, 1, 64, "N", "simulated workers, one thread and session each (default 4)");
  flags.Int("requests", &cfg.requests, 1, 100000, "N", "requests per worker (default 8)");
  flags.Int("system-prompts", &cfg.system_prompts, 1, 64, "N", "distinct shared system prompts (default 2)");
  flags.Int("system-tokens", &cfg.system_tokens, 1, 1 << 20, "N", "tokens per system prompt (default 512)");
  flags.Int("user-min", &cfg.user_min, 1, 1 << 20, "N", "fewest private prompt tokens per request (default 64)");
  flags.Int("user-max", &cfg.user_max, 1, 1 << 20, "N", "most private prompt tokens per request (default 256)");
  flags.Int("decode-tokens", &cfg.decode_tokens, 0, 1 << 20, "N", "tokens decoded per request (default 128)");
  flags.Uint64("seed", &cfg.seed, "S", "random seed (default 1)");
  flags.Bool("json", &json, "print the summary as one JSON object (docs/kvarnctl.md); progress stays on stderr");
  if (int rc = ParseOrExit(flags, args, io,
                           "usage: kvarnctl demo [flags]\n\n"
                           "Simulated workers sharing system prompts through a running kvarnd: prefill and decode through\n"
                           "the shared-memory pool, decode attention read in place, and a closing summary (tokens/s, prefix\n"
                           "hit rate, blocks sealed, evictions, bytes per token against fp16). The K/V are synthetic.\n"
                           "Each worker opens its own session on the target, as tenant demo by default.");
      rc >= 0) {
    return rc;
  }
  if (cfg.user_min > cfg.user_max) return ReportError(io, InvalidArgument("--user-min exceeds --user-max"));

  auto probe = Connect(d, /*observer=*/true, 0, "kvarnctl demo");
  if (!probe.ok()) return ReportError(io, ToCli(probe.status()));
  auto before = probe->session->Stats();
  if (!before.ok()) return ReportError(io, ToCli(before.status()));
  const BlockLayout l = probe->session->block_layout();

  std::vector<std::vector<uint32_t>> systems(static_cast<size_t>(cfg.system_prompts));
  for (size_t p = 0; p < systems.size(); ++p) {
    for (int64_t t = 0; t < cfg.system_tokens; ++t) systems[p].push_back(static_cast<uint32_t>(100000 * (p + 1) + t));
  }
  Totals totals;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int w = 0; w < cfg.workers; ++w) threads.emplace_back([&, w] { Worker(w, cfg, d, systems, &totals); });
  std::atomic<bool> done{false};
  std::thread progress([&] {
    const int64_t total = cfg.workers * cfg.requests;
    auto last = std::chrono::steady_clock::now();
    while (!done.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      const auto now = std::chrono::steady_clock::now();
      if (!io.err_is_terminal && now - last < std::chrono::seconds(2)) continue;
      last = now;
      const double secs = std::chrono::duration<double>(now - t0).count();
      const int64_t tok = totals.prefill + totals.decode;
      const int64_t pt = totals.prompt_tokens;
      char line[200];
      std::snprintf(line, sizeof line, "[demo] %lld/%lld requests  %lld tokens  %.0f tokens/s  prefix hits %.0f%%",
                    static_cast<long long>(totals.requests.load()), static_cast<long long>(total), static_cast<long long>(tok),
                    tok / std::max(secs, 1e-9), pt ? 100.0 * totals.cached_tokens / pt : 0.0);
      io.err << (io.err_is_terminal ? "\r" : "") << line << (io.err_is_terminal ? "" : "\n");
      io.err.flush();
    }
    if (io.err_is_terminal) io.err << "\r" << std::string(90, ' ') << "\r";
  });
  for (std::thread& t : threads) t.join();
  done = true;
  progress.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!totals.first_error.empty()) return ReportError(io, CodecStatus(CodecCode::kInternal, totals.first_error));
  auto after = probe->session->Stats();
  if (!after.ok()) return ReportError(io, ToCli(after.status()));

  const int64_t tokens = totals.prefill + totals.decode;
  const double fp16_per_token = 2.0 * 2 * l.slots() * l.head_dim;
  const double quant_per_token = static_cast<double>(l.quant_block_bytes()) / l.tile_tokens;
  const uint64_t sealed = after->seals() - before->seals();
  const uint64_t evicted = after->evictions() - before->evictions();
  if (json) {
    JsonWriter j;
    j.BeginObject().Field("target", d.target);
    j.Key("config").BeginObject();
    j.Field("workers", cfg.workers).Field("requests_per_worker", cfg.requests);
    j.Field("system_prompts", cfg.system_prompts).Field("system_tokens", cfg.system_tokens);
    j.Field("user_min", cfg.user_min).Field("user_max", cfg.user_max).Field("decode_tokens", cfg.decode_tokens);
    j.Field("seed", cfg.seed).EndObject();
    j.Key("model").BeginObject();
    j.Field("num_layers", l.num_layers).Field("num_kv_heads", l.num_kv_heads).Field("head_dim", l.head_dim);
    j.Field("tile_tokens", l.tile_tokens).Field("preset", probe->session->preset().Name()).EndObject();
    j.Field("requests", totals.requests.load()).Field("seconds", secs);
    j.Field("tokens_appended", tokens).Field("prefill_tokens", totals.prefill.load());
    j.Field("decoded_tokens", totals.decode.load()).Field("tokens_per_second", tokens / std::max(secs, 1e-9));
    j.Field("prompt_tokens", totals.prompt_tokens.load()).Field("cached_tokens", totals.cached_tokens.load());
    j.Field("prefix_hit_ratio",
            static_cast<double>(totals.cached_tokens) / static_cast<double>(std::max<int64_t>(1, totals.prompt_tokens)));
    j.Field("tiles_sealed", sealed).Field("evictions", evicted);
    j.Field("quant_bytes_per_token", quant_per_token).Field("fp16_bytes_per_token", fp16_per_token);
    j.Field("compression_ratio", fp16_per_token / quant_per_token);
    j.Field("attention_checks", totals.attn_checks);
    if (totals.attn_checks > 0) {
      j.Field("attention_rel_l2", totals.attn_err_sum / totals.attn_checks);
    } else {
      j.Key("attention_rel_l2").Null();
    }
    j.EndObject();
    io.out << j.str() << "\n";
    return kExitOk;
  }
  std::ostringstream o;
  o << std::fixed;
  o << "demo: " << cfg.workers << " workers x " << cfg.requests << " requests, " << cfg.system_prompts
    << " shared system prompts of " << cfg.system_tokens << " tokens, " << cfg.user_min << "-" << cfg.user_max
    << " private prompt tokens, " << cfg.decode_tokens << " decode tokens each (synthetic K/V)\n";
  o << "model: " << l.num_layers << " layers x " << l.num_kv_heads << " kv-heads x " << l.head_dim << ", "
    << probe->session->preset().Name() << "\n\n";
  o << std::setprecision(1);
  o << "  requests          " << totals.requests << " in " << secs << " s\n";
  o << "  tokens appended   " << tokens << " (prefill " << totals.prefill << ", decode " << totals.decode << "): "
    << std::setprecision(0) << tokens / secs << " tokens/s\n";
  o << std::setprecision(1) << "  prefix hit rate   " << 100.0 * totals.cached_tokens / std::max<int64_t>(1, totals.prompt_tokens)
    << "% of prompt tokens (" << totals.cached_tokens << " of " << totals.prompt_tokens << ")\n";
  o << "  tiles sealed      " << sealed << " (quantized and fp16 sink)\n";
  o << "  evictions         " << evicted << "\n";
  o << std::setprecision(0) << "  bytes per token   " << quant_per_token << " B quantized vs " << fp16_per_token
    << " B fp16: " << std::setprecision(2) << fp16_per_token / quant_per_token << "x smaller\n";
  if (totals.attn_checks > 0) {
    o << std::setprecision(4) << "  attention check   relative L2 error " << totals.attn_err_sum / totals.attn_checks
      << " vs exact attention over the fp16 K/V (layer 0, " << 2 * l.num_kv_heads << " query heads, "
      << totals.attn_checks << " sequences)\n";
  }
  io.out << o.str();
  return kExitOk;
}

}  // namespace kvarn::ctl
