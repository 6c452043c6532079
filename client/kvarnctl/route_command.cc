// `kvarnctl route`: ranks kvarnd endpoints by how much of a prompt each has cached, by tier,
// with kvarn::Router (client/lib/router.h, docs/router.md). A one-shot process has no Watch
// history, so its answers come from Lookup unless an endpoint's index is already complete
// (a daemon that has logged nothing yet); the table says which source answered.
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/kvarnctl/daemon_commands.h"
#include "client/kvarnctl/json.h"
#include "client/lib/router.h"

namespace kvarn::ctl {
namespace {

constexpr size_t kMaxPromptBytes = 64u << 20;

// Whitespace-separated decimal token ids from `path` ("-": stdin).
absl::StatusOr<std::vector<uint32_t>> ReadPrompt(const std::string& path) {
  std::string text;
  if (path == "-") {
    std::ostringstream s;
    s << std::cin.rdbuf();
    text = s.str();
  } else {
    std::ifstream f(path, std::ios::binary);
    if (!f)
      return absl::InvalidArgumentError(
          absl::StrCat("--prompt-file: cannot read ", path, ": ", std::strerror(errno)));
    std::ostringstream s;
    s << f.rdbuf();
    if (f.bad())
      return absl::InvalidArgumentError(absl::StrCat("--prompt-file: cannot read ", path));
    text = s.str();
  }
  if (text.size() > kMaxPromptBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prompt-file: ", path, " is larger than 64 MiB"));
  }
  std::vector<uint32_t> ids;
  std::istringstream in(text);
  std::string word;
  while (in >> word) {
    uint64_t v = 0;
    bool ok = !word.empty() && word.size() <= 10;
    for (char c : word) {
      if (c < '0' || c > '9') {
        ok = false;
        break;
      }
      v = v * 10 + static_cast<uint64_t>(c - '0');
    }
    if (!ok || v > UINT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat("--prompt-file: ", path, ": word ", ids.size() + 1, " '", word.substr(0, 32),
                       "' is not a token id (a decimal integer 0..4294967295)"));
    }
    ids.push_back(static_cast<uint32_t>(v));
  }
  if (ids.empty())
    return absl::InvalidArgumentError(absl::StrCat("--prompt-file: ", path, " holds no token ids"));
  return ids;
}

std::string Score(double s) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(1) << s;
  return o.str();
}

std::string RouteJson(size_t prompt_tokens, const std::vector<RouteResult>& ranked) {
  JsonWriter j;
  j.BeginObject();
  j.Field("prompt_tokens", static_cast<uint64_t>(prompt_tokens));
  j.Key("results").BeginArray();
  for (size_t i = 0; i < ranked.size(); ++i) {
    const RouteResult& r = ranked[i];
    j.BeginObject();
    j.Field("rank", static_cast<uint64_t>(i + 1));
    j.Field("endpoint", r.endpoint);
    j.Field("ok", r.status.ok());
    j.Field("source", RouteSourceName(r.source));
    j.Field("cached_tokens", r.cached_tokens);
    j.Field("pool_tokens", r.tokens.pool);
    j.Field("disk_tokens", r.tokens.disk);
    j.Field("remote_tokens", r.tokens.remote);
    j.Field("score", r.score);
    j.Field("epoch", r.epoch);
    if (r.status.ok()) {
      j.Key("error").Null();
    } else {
      j.Field("error", std::string(r.status.message()));
    }
    j.EndObject();
  }
  j.EndArray();
  j.EndObject();
  return j.str();
}

std::string RouteText(size_t prompt_tokens, const std::vector<RouteResult>& ranked) {
  std::ostringstream o;
  size_t width = 8;
  for (const RouteResult& r : ranked) width = std::max(width, r.endpoint.size());
  o << "prompt: " << prompt_tokens << " tokens; score = pool + 0.9 x disk + 0.5 x remote\n";
  o << std::left << std::setw(6) << "rank" << std::setw(static_cast<int>(width) + 2) << "endpoint"
    << std::right << std::setw(8) << "cached" << std::setw(8) << "pool" << std::setw(8) << "disk"
    << std::setw(8) << "remote" << std::setw(10) << "score"
    << "  " << std::left << "source\n";
  for (size_t i = 0; i < ranked.size(); ++i) {
    const RouteResult& r = ranked[i];
    o << std::left << std::setw(6) << (i + 1) << std::setw(static_cast<int>(width) + 2)
      << r.endpoint << std::right;
    if (r.status.ok()) {
      o << std::setw(8) << r.cached_tokens << std::setw(8) << r.tokens.pool << std::setw(8)
        << r.tokens.disk << std::setw(8) << r.tokens.remote << std::setw(10) << Score(r.score)
        << "  " << RouteSourceName(r.source) << "\n";
    } else {
      o << std::setw(8) << "-" << std::setw(8) << "-" << std::setw(8) << "-" << std::setw(8) << "-"
        << std::setw(10) << "-"
        << "  error: " << r.status.message() << "\n";
    }
  }
  return o.str();
}

}  // namespace

int RunRoute(std::span<const std::string> args, const CommandIo& io) {
  FlagSet flags("route");
  DaemonFlags d;
  std::vector<std::string> endpoints;
  std::string prompt_file;
  bool json = false, verify = false;
  absl::Duration timeout = absl::Seconds(2), connect_timeout = absl::Seconds(2);
  flags.StringList("endpoint", &endpoints, "ADDR",
                   "a kvarnd to rank, unix:/path or host:port (repeat: one per node)",
                   /*required=*/true);
  flags.String("prompt-file", &prompt_file, "FILE",
               "the prompt: whitespace-separated token ids ('-': stdin)",
               /*required=*/true);
  // The tenant and credential flags every daemon command takes (DaemonFlags::Register less
  // --target, which --endpoint replaces).
  flags.String("tenant", &d.tenant, "NAME",
               absl::StrCat("tenant whose cache is ranked (default ", d.tenant, ")"));
  if (const char* v = std::getenv("KVARN_TENANT_TOKEN_FILE")) d.tenant_token_file = v;
  flags.String("tenant-token-file", &d.tenant_token_file, "FILE",
               "file whose first line is the tenant's token (default $KVARN_TENANT_TOKEN_FILE)");
  flags.String("admin-token", &d.admin_token, "TOKEN",
               "admin token (visible to other users in ps; prefer the file)");
  if (const char* v = std::getenv("KVARN_ADMIN_TOKEN_FILE")) d.admin_token_file_env = v;
  d.admin_token_file = d.admin_token_file_env;
  flags.String("admin-token-file", &d.admin_token_file, "FILE",
               "file whose first line is the admin token (default $KVARN_ADMIN_TOKEN_FILE)");
  flags.String("tls-ca", &d.tls_ca, "FILE",
               "TCP endpoints: connect with TLS, verifying kvarnd against this PEM CA");
  flags.String("tls-cert", &d.tls_cert, "FILE",
               "TCP endpoints: this client's PEM certificate (mutual TLS)");
  flags.String("tls-key", &d.tls_key, "FILE",
               "TCP endpoints: this client's PEM private key (mutual TLS)");
  flags.String("tls-server-name", &d.tls_server_name, "NAME",
               "TCP endpoints: the name kvarnd's certificates carry");
  flags.Bool("verify", &verify,
             "answer every endpoint by Lookup, whatever the router's index knows");
  flags.Duration("timeout", &timeout, "DURATION", "deadline of the ranking's Lookups (default 2s)");
  flags.Duration("connect-timeout", &connect_timeout, "DURATION",
                 "deadline of connecting to each endpoint (default 2s)");
  flags.Bool("json", &json,
             "print one JSON object: prompt_tokens, results [{rank, endpoint, ok, source, ...}]");
  const CodecStatus parsed = flags.Parse(args);
  if (flags.help_requested()) {
    io.out
        << "usage: kvarnctl route --endpoint ADDR [--endpoint ADDR ...] --prompt-file FILE "
           "[flags]\n\n"
           "Ranks kvarnd endpoints by how much of the prompt each has cached: the tokens it would\n"
           "adopt, by tier (pool, disk, remote), best first by score = pool + 0.9 x disk + 0.5 x\n"
           "remote; ties in the order given; unreachable endpoints last with their error. The\n"
           "source column says whether the router's Watch index or a Lookup answered\n"
           "(docs/router.md).\n\nFlags:\n"
        << flags.Usage()
        << "\nEnvironment: KVARN_TENANT_TOKEN_FILE, KVARN_ADMIN_TOKEN_FILE (defaults of\n"
           "--tenant-token-file, --admin-token-file; a flag overrides its variable).\n"
           "Exit status: 0 at least one endpoint ranked; 1 none could be (each row has its "
           "error);\n"
           "2 bad flags, or a prompt, token or TLS file that cannot be read or is not valid.\n";
    return kExitOk;
  }
  if (!parsed.ok()) return ReportError(io, parsed);
  auto prompt = ReadPrompt(prompt_file);
  if (!prompt.ok()) return ReportError(io, ToCli(prompt.status()));
  auto co = d.Options();
  if (!co.ok()) return ReportError(io, ToCli(co.status()));
  auto admin_token = d.AdminToken();
  if (!admin_token.ok()) return ReportError(io, ToCli(admin_token.status()));
  auto tenant_token = d.TenantToken();
  if (!tenant_token.ok()) return ReportError(io, ToCli(tenant_token.status()));

  RouterOptions ro;
  ro.endpoints = endpoints;
  ro.tenant = d.tenant;
  ro.tenant_token = *tenant_token;
  ro.admin_token = *admin_token;
  ro.client_name = "kvarnctl route";
  ro.client = *co;
  ro.connect_timeout = connect_timeout;
  ro.rank_timeout = timeout;
  auto router = Router::Create(ro);
  if (!router.ok()) return ReportError(io, ToCli(router.status()));
  const std::vector<RouteResult> ranked = (*router)->Rank(*prompt, RankOptions{.verify = verify});
  if (json) {
    io.out << RouteJson(prompt->size(), ranked) << "\n";
  } else {
    io.out << RouteText(prompt->size(), ranked);
  }
  for (const RouteResult& r : ranked) {
    if (r.status.ok()) return kExitOk;
  }
  io.err << "kvarnctl: error: no endpoint could be ranked (every one failed; see the table)\n";
  return kExitFailure;
}

}  // namespace kvarn::ctl
