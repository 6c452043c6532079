#include "daemon/service/config.h"

#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/units.h"
#include "kernels/preset.h"

namespace kvarn {
namespace {

struct Key {
  const char* help;
  std::function<absl::Status(const std::string&, DaemonConfig*)> set;
};

// A setter's refusal; Apply prefixes the key's name.
absl::Status Bad(const std::string& value, const std::string& want) {
  return absl::InvalidArgumentError(absl::StrCat("'", value, "' is not ", want));
}

template <typename T>
Key UInt(const char* help, T CoreConfig::*field) {
  return {help, [field](const std::string& v, DaemonConfig* c) {
            uint64_t x;
            if (!absl::SimpleAtoi(v, &x) || x > std::numeric_limits<T>::max()) {
              return Bad(v, absl::StrCat("an integer in 0..", std::numeric_limits<T>::max()));
            }
            c->core.*field = static_cast<T>(x);
            return absl::OkStatus();
          }};
}

template <typename T>
Key ModelUInt(const char* help, T ModelConfig::*field) {
  return {help, [field](const std::string& v, DaemonConfig* c) {
            uint64_t x;
            if (!absl::SimpleAtoi(v, &x) || x > 0xFFFFFFFFu) return Bad(v, "a non-negative integer");
            c->core.model.*field = static_cast<T>(x);
            return absl::OkStatus();
          }};
}

Key Double(const char* help, double CoreConfig::*field) {
  return {help, [field](const std::string& v, DaemonConfig* c) {
            double x;
            if (!absl::SimpleAtod(v, &x)) return Bad(v, "a number");
            c->core.*field = x;
            return absl::OkStatus();
          }};
}

Key Millis(const char* help, absl::Duration CoreConfig::*field) {
  return {help, [field](const std::string& v, DaemonConfig* c) {
            int64_t x;
            if (!absl::SimpleAtoi(v, &x) || x <= 0) return Bad(v, "a positive number of milliseconds");
            c->core.*field = absl::Milliseconds(x);
            return absl::OkStatus();
          }};
}

Key Str(const char* help, std::string DaemonConfig::*field) {
  return {help, [field](const std::string& v, DaemonConfig* c) {
            c->*field = v;
            return absl::OkStatus();
          }};
}

Key Bool(const char* help, bool DaemonConfig::*field) {
  return {help, [field](const std::string& v, DaemonConfig* c) {
            if (v != "true" && v != "false") return Bad(v, "true or false");
            c->*field = v == "true";
            return absl::OkStatus();
          }};
}

Key CoreBool(const char* help, bool CoreConfig::*field) {
  return {help, [field](const std::string& v, DaemonConfig* c) {
            if (v != "true" && v != "false") return Bad(v, "true or false");
            c->core.*field = v == "true";
            return absl::OkStatus();
          }};
}

Key Int(const char* help, int DaemonConfig::*field, int lo, int hi) {
  return {help, [=](const std::string& v, DaemonConfig* c) {
            int x;
            if (!absl::SimpleAtoi(v, &x) || x < lo || x > hi) return Bad(v, absl::StrCat("an integer in ", lo, "..", hi));
            c->*field = x;
            return absl::OkStatus();
          }};
}

Key Bytes(const char* help, uint64_t DaemonConfig::*field, uint64_t min) {
  return {help, [=](const std::string& v, DaemonConfig* c) {
            auto b = ParseBytes(v);
            if (!b.ok()) return b.status();
            if (*b < min) return Bad(v, absl::StrCat("at least ", min, " bytes"));
            c->*field = *b;
            return absl::OkStatus();
          }};
}

Key OneOf(const char* help, std::string DaemonConfig::*field, std::vector<std::string> allowed) {
  return {help, [=](const std::string& v, DaemonConfig* c) {
            if (std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
              return Bad(v, absl::StrCat("one of ", absl::StrJoin(allowed, ", ")));
            }
            c->*field = v;
            return absl::OkStatus();
          }};
}

const std::map<std::string, Key>& Keys() {
  static const auto* keys = new std::map<std::string, Key>{
      {"model_id", {"model id, part of the prefix-hash namespace (default model)", [](const std::string& v, DaemonConfig* c) {
                      c->core.model.model_id = v;
                      return absl::OkStatus();
                    }}},
      {"num_layers", ModelUInt("layers of the model (default 8)", &ModelConfig::num_layers)},
      {"num_kv_heads", ModelUInt("kv-heads per layer (default 4)", &ModelConfig::num_kv_heads)},
      {"head_dim", ModelUInt("head dimension: 64, 128, 256 or 512 (default 128)", &ModelConfig::head_dim)},
      {"preset", {"codec preset (default kvarn_k4v2_g128)", [](const std::string& v, DaemonConfig* c) {
                    c->core.model.preset = v;
                    return absl::OkStatus();
                  }}},
      {"sink_tokens", ModelUInt("fp16 sink tokens: 0 or the tile size (default 128)", &ModelConfig::sink_tokens)},
      {"capacity", {"pool bytes, e.g. 512MiB or 8GiB (default 256MiB)", [](const std::string& v, DaemonConfig* c) {
                      auto b = ParseBytes(v);
                      if (!b.ok()) return b.status();
                      c->core.capacity_bytes = *b;
                      return absl::OkStatus();
                    }}},
      {"fp16_share", Double("share of the capacity for fp16 blocks: sink blocks and tail slots (default 0.25)", &CoreConfig::fp16_share)},
      {"sink_share", Double("share of the fp16 blocks that are sink blocks; the rest are tail slots (default 0.25)", &CoreConfig::sink_share)},
      {"tenant_max_sessions", UInt("sessions a tenant may hold when it sets no quota (default 256)", &CoreConfig::tenant_max_sessions)},
      {"tenant_max_watchers", UInt("Watch streams a tenant may hold when it sets no quota (default 16)", &CoreConfig::tenant_max_watchers)},
      {"max_observer_sessions", UInt("observer sessions (status tools) open at once, all tenants (default 64)", &CoreConfig::max_observer_sessions)},
      {"max_watchers", UInt("Watch streams open at once, all tenants (default 256)", &CoreConfig::max_watchers)},
      {"high_watermark", Double("evict cached blocks above this share in use (default 0.95)", &CoreConfig::high_watermark)},
      {"low_watermark", Double("... down to this share (default 0.90)", &CoreConfig::low_watermark)},
      {"keepalive_ms", Millis("client keep-alive interval, ms (default 1000)", &CoreConfig::keepalive_interval)},
      {"lease_ttl_ms", Millis("a session silent this long ends, ms (default 10000)", &CoreConfig::lease_ttl)},
      {"grace_ms", Millis("after a session's stream breaks its sequences live this long, ms (default 2000)", &CoreConfig::grace)},
      {"default_tail_slots", UInt("tail slots of a session that asks for 0 (default 16)", &CoreConfig::default_tail_slots)},
      {"max_tail_slots", UInt("most tail slots one session may reserve (default 4096)", &CoreConfig::max_tail_slots)},
      {"max_read_tokens", UInt("most tokens one Read returns (default 4096)", &CoreConfig::max_read_tokens)},
      {"tenant_salt_secret", {"secret mixed into per-tenant prefix-hash salts (default empty)", [](const std::string& v, DaemonConfig* c) {
                                c->core.tenant_salt_secret = v;
                                return absl::OkStatus();
                              }}},
      {"share_across_tenants", CoreBool("without a tenants file: true lets all tenant labels share prefix-cache entries (default false)", &CoreConfig::share_across_tenants)},
      {"check_commits", CoreBool("true: scan committed tokens for NaN/Inf at every commit; false: only when their tile seals (default true)", &CoreConfig::check_commits)},
      {"admin_token", {"token granting admin operations (default none)", [](const std::string& v, DaemonConfig* c) {
                         c->core.admin_token = v;
                         return absl::OkStatus();
                       }}},
      {"admin_token_file", Str("with admin_token: written there (mode 0600); alone: the token is read from it (e.g. a mounted Secret), or a random one is generated and written there when it does not exist", &DaemonConfig::admin_token_file)},
      {"instance", Str("instance name, for logs and /proc/<pid>/maps (default kvarnd)", &DaemonConfig::instance)},
      {"backend", Str("host, cuda or auto (default host)", &DaemonConfig::backend)},
      {"cuda_device", Int("CUDA device ordinal (default 0)", &DaemonConfig::cuda_device, 0, 63)},
      {"listen", Str("Unix socket path, empty disables (default /run/kvarnd/kvarnd.sock; its directory must exist)", &DaemonConfig::listen)},
      {"socket_mode", {"permissions of the Unix socket and its descriptor channel, octal (default 0600: this uid only)",
                       [](const std::string& v, DaemonConfig* c) {
                         uint32_t x = 0;
                         if (v.empty() || v.size() > 4 || v.find_first_not_of("01234567") != std::string::npos) {
                           return Bad(v, "an octal mode such as 0600 or 0660");
                         }
                         for (char ch : v) x = x * 8 + static_cast<uint32_t>(ch - '0');
                         if ((x & 0600) != 0600 || (x & 0007) != 0) return Bad(v, "a mode with owner rw and no access for others");
                         c->socket_mode = x;
                         return absl::OkStatus();
                       }}},
      {"tcp", Str("host:port for gRPC over TCP, empty disables (default empty); not loopback needs TLS", &DaemonConfig::tcp)},
      {"tls_cert", Str("PEM certificate chain for TCP (default none)", &DaemonConfig::tls_cert)},
      {"tls_key", Str("PEM private key for TCP (default none)", &DaemonConfig::tls_key)},
      {"tls_client_ca", Str("PEM CA that client certificates must chain to: mutual TLS (default none)", &DaemonConfig::tls_client_ca)},
      {"allow_insecure_tcp", Bool("true: serve a non-loopback TCP address without TLS (default false; logs a warning)", &DaemonConfig::allow_insecure_tcp)},
      {"tenants_file", Str("tenants with token hashes and quotas, mode 0600; reloaded on SIGHUP (default none: one trust domain)", &DaemonConfig::tenants_file)},
      {"max_batch_items", {"items of one AppendBatch (default 4096)", [](const std::string& v, DaemonConfig* c) {
                             uint32_t x;
                             if (!absl::SimpleAtoi(v, &x) || x < 1 || x > 65536) return Bad(v, "an integer in 1..65536");
                             c->max_batch_items = x;
                             return absl::OkStatus();
                           }}},
      {"watch_poll_ms", {"longest a Watch stream waits before it notices its session ended, ms (default 200)",
                         [](const std::string& v, DaemonConfig* c) {
                           int64_t x;
                           if (!absl::SimpleAtoi(v, &x) || x < 1 || x > 60000) return Bad(v, "1..60000 milliseconds");
                           c->watch_poll = absl::Milliseconds(x);
                           return absl::OkStatus();
                         }}},
      {"metrics", Str("host:port of the Prometheus /metrics endpoint, empty disables (default 127.0.0.1:9464)", &DaemonConfig::metrics)},
      {"huge_pages", OneOf("host backend: put the pool's segments on the kernel's huge pages (vm.nr_hugepages): off, try (base pages when too few are free) or on (too few free: kvarnd does not start, a session is refused) (default off)", &DaemonConfig::huge_pages, {"off", "try", "on"})},
      {"ring_follow_cpu", Bool("true: drain a commit ring on the CPU its client committed from, if kvarnd's CPU mask allows it (default true)", &DaemonConfig::ring_follow_cpu)},
      {"ring_watch_us", {"after a pipelined batch (CommitRing::Publish), drained on another CPU than its "
                         "client's, the commit ring's drain thread watches that ring's tail until this "
                         "long after the ring's last batch, us; 0 always sleeps on the doorbells "
                         "(default 50)",
                         [](const std::string& v, DaemonConfig* c) {
                           int64_t x;
                           if (!absl::SimpleAtoi(v, &x) || x < 0 || x > 10000) return Bad(v, "0..10000 microseconds");
                           c->ring_watch = absl::Microseconds(x);
                           return absl::OkStatus();
                         }}},
      {"seal_threads", Int("threads quantizing one block (default 1)", &DaemonConfig::seal_threads, 1, 256)},
      {"max_message_mb", Int("largest gRPC message accepted, MiB; 0 derives it from the layout (default 0)",
                             &DaemonConfig::max_message_mb, 0, 1024)},
      {"max_read_bytes", {"K/V bytes one Read reply may carry; longer reads are split by the client (default 4MiB)",
                          [](const std::string& v, DaemonConfig* c) {
                            auto b = ParseBytes(v);
                            if (!b.ok()) return b.status();
                            if (*b < 4096) return Bad(v, "at least 4096 bytes");
                            c->max_read_bytes = *b;
                            return absl::OkStatus();
                          }}},
      {"grpc_memory", {"memory gRPC may use for calls in flight, its resource quota (default 256MiB)",
                       [](const std::string& v, DaemonConfig* c) {
                         auto b = ParseBytes(v);
                         if (!b.ok()) return b.status();
                         if (*b < (16ull << 20)) return Bad(v, "at least 16MiB");
                         c->grpc_memory_bytes = *b;
                         return absl::OkStatus();
                       }}},
      {"grpc_max_threads", Int("unary calls handled at once; more get RESOURCE_EXHAUSTED (default 32)",
                               &DaemonConfig::grpc_max_threads, 4, 4096)},
      {"drain_ms", {"on SIGTERM: no new sessions; open ones are served until they close or this long has passed, then calls still in flight are cancelled; a second SIGTERM cuts it short, ms (default 20000)",
                    [](const std::string& v, DaemonConfig* c) {
                      int64_t x;
                      if (!absl::SimpleAtoi(v, &x) || x < 0) return Bad(v, "a non-negative number of milliseconds");
                      c->drain = absl::Milliseconds(x);
                      return absl::OkStatus();
                    }}},
      {"log_level", Str("debug, info, warning or error (default info)", &DaemonConfig::log_level)},
      {"disk_tier_dir", Str("directory of the disk tier below the pool, created 0700 if missing; empty disables (default empty)", &DaemonConfig::disk_tier_dir)},
      {"disk_tier_bytes", Bytes("bytes the disk tier's records may take; its own LRU evicts beyond (default 8GiB)", &DaemonConfig::disk_tier_bytes, 1u << 20)},
      {"disk_tier_write", OneOf("when blocks are written to the disk tier: evict (when the pool evicts them) or seal (as soon as sealed) (default evict)", &DaemonConfig::disk_tier_write, {"evict", "seal"})},
      {"disk_tier_fsync", Bool("true: fdatasync each disk-tier record before it is renamed into place (default false)", &DaemonConfig::disk_tier_fsync)},
      {"memcached_servers", {"memcached servers of the shared tier, host:port,host:port (consistent hashing); empty disables (default empty)",
                             [](const std::string& v, DaemonConfig* c) {
                               c->memcached_servers.clear();
                               for (absl::string_view part : absl::StrSplit(v, ',', absl::SkipWhitespace())) {
                                 const std::string server(absl::StripAsciiWhitespace(part));
                                 const size_t colon = server.rfind(':');
                                 int port = 0;
                                 if (colon == std::string::npos || colon == 0 || !absl::SimpleAtoi(server.substr(colon + 1), &port) ||
                                     port < 1 || port > 65535) {
                                   return Bad(server, "host:port");
                                 }
                                 c->memcached_servers.push_back(server);
                               }
                               return absl::OkStatus();
                             }}},
      {"memcached_write", OneOf("when blocks are written to memcached: seal (as soon as sealed, so other nodes find them) or evict (default seal)", &DaemonConfig::memcached_write, {"seal", "evict"})},
      {"memcached_key_prefix", Str("prefix of the shared tier's keys, before the block's prefix hash (default kvarn1:)", &DaemonConfig::memcached_key_prefix)},
      {"memcached_chunk_bytes", Bytes("largest value written to memcached; a longer record is split (default 512KiB; memcached's item limit, -I, is 1MiB by default)", &DaemonConfig::memcached_chunk_bytes, 4096)},
      {"memcached_timeout_ms", {"connect and poll timeout per memcached server, ms; a server slower than this is a miss (default 250)",
                                [](const std::string& v, DaemonConfig* c) {
                                  int64_t x;
                                  if (!absl::SimpleAtoi(v, &x) || x < 1 || x > 60000) return Bad(v, "1..60000 milliseconds");
                                  c->memcached_timeout = absl::Milliseconds(x);
                                  return absl::OkStatus();
                                }}},
      {"tier_queue_bytes", Bytes("each tier's write-behind queue; blocks beyond it are not written (counted) (default 256MiB)", &DaemonConfig::tier_queue_bytes, 1u << 20)},
      {"tier_spill_on_stop", Bool("true: on stop, blocks still in the pool go to the tiers that lack them, so the disk tier keeps them across a restart (default true)", &DaemonConfig::tier_spill_on_stop)},
      {"tier_stop_ms", {"on stop, how long the tiers' queues may take to empty, ms (default 30000)",
                        [](const std::string& v, DaemonConfig* c) {
                          int64_t x;
                          if (!absl::SimpleAtoi(v, &x) || x < 0) return Bad(v, "a non-negative number of milliseconds");
                          c->tier_stop = absl::Milliseconds(x);
                          return absl::OkStatus();
                        }}},
      {"check_config", Bool("true: validate the settings, print how the capacity divides into blocks and tokens, and exit (0 valid, 2 not) without serving", &DaemonConfig::check_config)},
  };
  return *keys;
}

absl::Status Apply(const std::string& key, const std::string& value, DaemonConfig* c) {
  auto it = Keys().find(key);
  if (it == Keys().end()) return absl::InvalidArgumentError(absl::StrCat("unknown setting '", key, "' (see kvarnd --help)"));
  absl::Status s = it->second.set(value, c);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(key, ": ", s.message()));
  return s;
}

}  // namespace

uint64_t MessageLimitBytes(const DaemonConfig& c) {
  if (c.max_message_mb > 0) return static_cast<uint64_t>(c.max_message_mb) << 20;
  Preset p;
  const int tile = ParsePreset(c.core.model.preset, &p).ok() ? p.tile_tokens : 128;
  const uint64_t inline_tile = 2ull * tile * c.core.model.num_layers * c.core.model.num_kv_heads * c.core.model.head_dim * 4;
  const uint64_t prompt = 5ull * c.core.max_prompt_tokens;  // varint token ids
  return std::max(inline_tile, prompt) + (1ull << 20);
}

uint32_t ReadTokensPerCall(const DaemonConfig& c) {
  const uint64_t per_token = 8ull * c.core.model.num_kv_heads * std::max(1u, c.core.model.head_dim);  // keys + values, fp32
  const uint64_t by_bytes = std::max<uint64_t>(1, c.max_read_bytes / std::max<uint64_t>(1, per_token));
  return static_cast<uint32_t>(std::min<uint64_t>(c.core.max_read_tokens, by_bytes));
}

// The grammar (docs/daemon.md, "Configuration"): one `key = value` per line; `#` at the start
// of a line or after whitespace begins a comment to the end of the line (a `#` inside a value,
// with no space before it, is part of the value); blank lines are skipped; a key may appear
// once per file.
absl::Status ApplyConfigText(const std::string& text, DaemonConfig* c) {
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  std::map<std::string, int> seen;
  while (std::getline(in, line)) {
    ++lineno;
    absl::string_view l = line;
    for (size_t i = 0; i < l.size(); ++i) {
      if (l[i] == '#' && (i == 0 || l[i - 1] == ' ' || l[i - 1] == '\t')) {
        l = l.substr(0, i);
        break;
      }
    }
    l = absl::StripAsciiWhitespace(l);
    if (l.empty()) continue;
    const size_t eq = l.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("line ", lineno, ": expected key = value, got '", l, "'"));
    }
    const std::string key(absl::StripAsciiWhitespace(l.substr(0, eq)));
    const std::string value(absl::StripAsciiWhitespace(l.substr(eq + 1)));
    if (auto [at, fresh] = seen.emplace(key, lineno); !fresh) {
      return absl::InvalidArgumentError(absl::StrCat("line ", lineno, ": ", key, " is already set on line ", at->second));
    }
    if (absl::Status s = Apply(key, value, c); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("line ", lineno, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<DaemonConfig> ParseDaemonConfig(const std::vector<std::string>& args, bool* help) {
  DaemonConfig c;
  c.core.model.model_id = "model";
  c.core.model.num_layers = 8;
  c.core.model.num_kv_heads = 4;
  c.core.model.head_dim = 128;
  c.core.model.preset = "kvarn_k4v2_g128";
  c.core.model.sink_tokens = 128;
  c.core.capacity_bytes = 256ull << 20;
  *help = false;
  std::vector<std::pair<std::string, std::string>> flags;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i];
    if (a == "--help" || a == "-h") {
      *help = true;
      return c;
    }
    if (a.rfind("--", 0) != 0) return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", args[i], "'"));
    a = a.substr(2);
    std::string key = a, value;
    if (const size_t eq = a.find('='); eq != std::string::npos) {
      key = a.substr(0, eq);
      value = a.substr(eq + 1);
    } else if (key == "check_config" && (i + 1 == args.size() || args[i + 1].rfind("--", 0) == 0)) {
      value = "true";  // a bare --check_config
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--", key, " needs a value"));
    }
    std::replace(key.begin(), key.end(), '-', '_');
    flags.emplace_back(key, value);
  }
  for (const auto& [k, v] : flags) {
    if (k != "config") continue;
    std::ifstream f(v);
    if (!f) return absl::InvalidArgumentError(absl::StrCat("cannot read config file ", v));
    std::stringstream ss;
    ss << f.rdbuf();
    if (absl::Status s = ApplyConfigText(ss.str(), &c); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(v, ": ", s.message()));
    }
  }
  for (const auto& [k, v] : flags) {
    if (k == "config") continue;
    if (absl::Status s = Apply(k, v, &c); !s.ok()) return s;
  }
  if (c.backend != "host" && c.backend != "cuda" && c.backend != "auto") {
    return absl::InvalidArgumentError(absl::StrCat("backend: '", c.backend, "' is not host, cuda or auto"));
  }
  if (c.listen.empty() && c.tcp.empty()) return absl::InvalidArgumentError("listen and tcp are both empty: nothing to serve on");
  if (c.tls_cert.empty() != c.tls_key.empty()) return absl::InvalidArgumentError("tls_cert and tls_key go together");
  if (!c.tls_client_ca.empty() && c.tls_cert.empty()) return absl::InvalidArgumentError("tls_client_ca needs tls_cert and tls_key");
  // One Read reply stays within max_read_bytes: the core enforces the effective token limit.
  c.core.max_read_tokens = ReadTokensPerCall(c);
  if (!c.tenants_file.empty() && c.core.share_across_tenants) {
    return absl::InvalidArgumentError("share_across_tenants applies without a tenants file only; name a group in the tenants file");
  }
  return c;
}

std::string DaemonHelp() {
  std::string s =
      "kvarnd: a KV-cache memory manager for LLM inference. It owns a pool of KVarN-quantized\n"
      "KV blocks in shared memory, lends it to inference workers, and serves sequences,\n"
      "prefix sharing and eviction over gRPC (kvarn.v1.KvCache), with Prometheus metrics.\n\n"
      "usage: kvarnd [--config=FILE] [--key=value ...]\n\n"
      "Settings (also valid as `key = value` lines in the config file; flags win):\n";
  for (const auto& [k, v] : Keys()) absl::StrAppend(&s, "  --", k, "\n      ", v.help, "\n");
  absl::StrAppend(&s, "  --config\n      a file of key = value lines, read before the other flags\n");
  return s;
}

std::string DescribePlan(const DaemonConfig& c, const PoolPlan& plan) {
  const ModelConfig& m = c.core.model;
  const uint64_t tile = static_cast<uint64_t>(plan.layout.tile_tokens);
  const uint64_t qb = plan.layout.quant_block_bytes(), fb = plan.layout.fp16_block_bytes();
  const uint64_t pool = uint64_t{plan.quant_blocks} * qb + (uint64_t{plan.sink_blocks} + plan.tail_slots) * fb;
  std::string out = absl::StrCat("config ok\n", "model ", m.model_id, ": ", m.num_layers, " layers, ", m.num_kv_heads,
                                 " kv heads, head_dim ", m.head_dim, "; preset ", plan.preset.Name(), " (", tile,
                                 "-token tiles), sink_tokens ", m.sink_tokens, "\n");
  absl::StrAppend(&out, "capacity ", FormatBytes(static_cast<double>(c.core.capacity_bytes)), " configured, pool ",
                  FormatBytes(static_cast<double>(pool)), "\n");
  const auto row = [&](const char* name, uint64_t blocks, uint64_t bytes, const char* what) {
    absl::StrAppend(&out, "  ", name, std::string(7 - std::string(name).size(), ' '), blocks, " x ", FormatBytes(static_cast<double>(bytes)),
                    " = ", FormatBytes(static_cast<double>(blocks * bytes)), ", ", blocks * tile, " tokens (", what, ")\n");
  };
  row("quant", plan.quant_blocks, qb, "quantized tiles");
  row("sink", plan.sink_blocks, fb, "fp16 first tiles, shared");
  row("tail", plan.tail_slots, fb, "fp16 tail slots of open sequences");
  const double fp16_token = 2.0 * 2.0 * m.num_layers * m.num_kv_heads * m.head_dim;  // K and V, 2 bytes each
  absl::StrAppend(&out, "quantized tokens per GiB ", static_cast<uint64_t>(double(1ull << 30) / static_cast<double>(qb) * static_cast<double>(tile)),
                  " (fp16: ", static_cast<uint64_t>(double(1ull << 30) / fp16_token), ")\n");
  absl::StrAppend(&out, "listen ", c.listen.empty() ? "(none)" : c.listen, ", tcp ", c.tcp.empty() ? "(none)" : c.tcp, ", metrics ",
                  c.metrics.empty() ? "(none)" : c.metrics, ", backend ", c.backend, ", tenants ",
                  c.tenants_file.empty() ? "(one trust domain)" : c.tenants_file, "\n");
  return out;
}

}  // namespace kvarn
