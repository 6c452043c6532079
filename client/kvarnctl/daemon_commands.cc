#include "client/kvarnctl/daemon_commands.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvarn::ctl {

void DaemonFlags::Register(FlagSet* flags) {
  const char* env = std::getenv("KVARN_TARGET");
  target = env != nullptr ? env : "unix:/tmp/kvarnd.sock";
  flags->String("target", &target, "ADDR", "kvarnd address: unix:/path or host:port (default $KVARN_TARGET, else unix:/tmp/kvarnd.sock)");
  flags->String("tenant", &tenant, "NAME", "tenant of the session (default kvarnctl)");
  const char* token_env = std::getenv("KVARN_TENANT_TOKEN_FILE");
  tenant_token_file = token_env != nullptr ? token_env : "";
  flags->String("tenant-token-file", &tenant_token_file, "FILE",
                "file whose first line is the tenant's token, when kvarnd authenticates tenants (default $KVARN_TENANT_TOKEN_FILE)");
  flags->String("tls-ca", &tls_ca, "FILE", "TCP targets: connect with TLS, verifying kvarnd against this PEM CA");
  flags->String("tls-cert", &tls_cert, "FILE", "TCP targets: this client's PEM certificate (mutual TLS)");
  flags->String("tls-key", &tls_key, "FILE", "TCP targets: this client's PEM private key (mutual TLS)");
  flags->String("tls-server-name", &tls_server_name, "NAME", "TCP targets: the name kvarnd's certificate must carry");
  flags->String("admin-token", &admin_token, "TOKEN", "admin token, for operations across tenants");
  flags->String("admin-token-file", &admin_token_file, "FILE", "file holding the admin token (kvarnd's admin_token_file)");
}

std::string DaemonFlags::AdminToken() const {
  if (!admin_token.empty() || admin_token_file.empty()) return admin_token;
  std::ifstream f(admin_token_file);
  std::string line;
  std::getline(f, line);
  return line;
}

CodecStatus ToCli(const absl::Status& s) {
  if (s.ok()) return {};
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument: return InvalidArgument(std::string(s.message()));
    case absl::StatusCode::kFailedPrecondition: return CodecStatus(CodecCode::kFailedPrecondition, std::string(s.message()));
    case absl::StatusCode::kUnavailable: return CodecStatus(CodecCode::kUnavailable, std::string(s.message()));
    default: return CodecStatus(CodecCode::kInternal, absl::StrCat(absl::StatusCodeToString(s.code()), ": ", s.message()));
  }
}

namespace {

absl::StatusOr<std::string> ReadWhole(const std::string& path, const char* what) {
  std::ifstream f(path);
  if (!f) return absl::FailedPreconditionError(absl::StrCat("cannot read ", what, " ", path));
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

absl::StatusOr<Connection> Connect(const DaemonFlags& flags, bool observer, uint32_t max_sequences,
                                   const std::string& client_name) {
  Connection c;
  ClientOptions co;
  if (!flags.tls_ca.empty() || !flags.tls_cert.empty()) {
    co.tls = true;
    if (!flags.tls_ca.empty()) {
      auto ca = ReadWhole(flags.tls_ca, "--tls-ca");
      if (!ca.ok()) return ca.status();
      co.tls_root_certs = *ca;
    }
    if (flags.tls_cert.empty() != flags.tls_key.empty()) return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
    if (!flags.tls_cert.empty()) {
      auto cert = ReadWhole(flags.tls_cert, "--tls-cert");
      if (!cert.ok()) return cert.status();
      auto key = ReadWhole(flags.tls_key, "--tls-key");
      if (!key.ok()) return key.status();
      co.tls_cert_chain = *cert;
      co.tls_private_key = *key;
    }
    co.tls_server_name = flags.tls_server_name;
  }
  std::string tenant_token;
  if (!flags.tenant_token_file.empty()) {
    auto t = ReadWhole(flags.tenant_token_file, "--tenant-token-file");
    if (!t.ok()) return t.status();
    tenant_token = t->substr(0, t->find('\n'));
  }
  auto client = Client::Connect(flags.target, co, absl::Seconds(5));
  if (!client.ok()) return client.status();
  c.client = std::move(*client);
  auto d = c.client->Describe();
  if (!d.ok()) return d.status();
  c.daemon = *d;
  SessionOptions o;
  o.tenant = flags.tenant;
  o.tenant_token = tenant_token;
  o.layout = Client::LayoutOf(*d);
  o.observer = observer;
  o.max_sequences = max_sequences;
  o.admin_token = flags.AdminToken();
  o.client_name = client_name;
  auto s = c.client->OpenSession(o);
  if (!s.ok()) return s.status();
  c.session = std::move(*s);
  return c;
}

std::string HumanBytes(double b) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", b, kUnits[u]);
  return buf;
}

namespace {

// Parses flags; returns -1 to continue, else the exit code (help printed or bad usage).
int ParseOrExit(FlagSet& flags, std::span<const std::string> args, const CommandIo& io, const std::string& usage) {
  const CodecStatus s = flags.Parse(args);
  if (flags.help_requested()) {
    io.out << usage << "\nFlags:\n" << flags.Usage();
    return kExitOk;
  }
  if (!s.ok()) return ReportError(io, s);
  return -1;
}

std::string Pct(double x) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100 * x);
  return buf;
}

}  // namespace

int RunStatus(std::span<const std::string> args, const CommandIo& io) {
  FlagSet flags("status");
  DaemonFlags d;
  d.Register(&flags);
  bool json = false;
  flags.Bool("json", &json, "print the daemon's Stats reply as JSON-like text (protobuf text format)");
  if (int rc = ParseOrExit(flags, args, io,
                           "usage: kvarnctl status [flags]\n\nCapacity, usage by block state, prefix hit rate and sessions of a running kvarnd.");
      rc >= 0) {
    return rc;
  }
  auto c = Connect(d, /*observer=*/true, 0, "kvarnctl status");
  if (!c.ok()) return ReportError(io, ToCli(c.status()));
  auto st = c->session->Stats();
  if (!st.ok()) return ReportError(io, ToCli(st.status()));
  if (json) {
    io.out << st->DebugString();
    return kExitOk;
  }
  const v1::DescribeResponse& dd = c->daemon;
  const double cap = static_cast<double>(st->capacity_bytes());
  std::ostringstream o;
  o << "kvarnd " << dd.version() << " at " << d.target << "  (epoch " << dd.epoch() << ", " << dd.backend() << " backend)\n";
  o << "model   " << dd.layout().model_id() << ": " << dd.layout().num_layers() << " layers x " << dd.layout().num_kv_heads()
    << " kv-heads x " << dd.layout().head_dim() << ", preset " << dd.layout().preset() << ", sink " << dd.layout().sink_tokens()
    << " tokens\n\n";
  o << std::left << std::setw(22) << "memory" << std::right << std::setw(14) << "bytes" << std::setw(10) << "share" << "\n";
  const auto row = [&](const std::string& name, double bytes) {
    o << std::left << std::setw(22) << name << std::right << std::setw(14) << HumanBytes(bytes) << std::setw(10)
      << (cap > 0 ? Pct(bytes / cap) : "-") << "\n";
  };
  row("capacity", cap);
  row("  active (referenced)", static_cast<double>(st->active_bytes()));
  row("  cached (evictable)", static_cast<double>(st->cached_bytes()));
  row("  fp16 (sinks, tails)", static_cast<double>(st->fp16_bytes()));
  row("  free", static_cast<double>(st->free_bytes()));
  o << "\n" << std::left << std::setw(22) << "blocks" << std::right << std::setw(8) << "total" << std::setw(8) << "free"
    << std::setw(8) << "active" << std::setw(8) << "cached" << "\n";
  o << std::left << std::setw(22) << "  quantized" << std::right << std::setw(8) << st->quant_blocks_total() << std::setw(8)
    << st->quant_blocks_free() << std::setw(8) << st->quant_blocks_active() << std::setw(8) << st->quant_blocks_cached() << "\n";
  o << std::left << std::setw(22) << "  fp16 sink" << std::right << std::setw(8) << st->sink_blocks_total() << std::setw(8)
    << st->sink_blocks_free() << std::setw(8) << st->sink_blocks_active() << std::setw(8) << st->sink_blocks_cached() << "\n\n";
  const double q = static_cast<double>(st->prefix_queried_tokens());
  o << "prefix cache  " << st->prefix_hit_tokens() << " of " << st->prefix_queried_tokens() << " prompt tokens hit ("
    << (q > 0 ? Pct(st->prefix_hit_tokens() / q) : "n/a") << ")\n";
  o << "activity      " << st->seals() << " tiles sealed, " << st->evictions() << " blocks evicted\n";
  o << "sessions      " << st->sessions() << " open, " << st->sequences() << " sequences\n";
  if (st->session_info_size() > 0) {
    o << "\n" << std::left << std::setw(8) << "session" << std::setw(16) << "tenant" << std::setw(24) << "client" << std::right
      << std::setw(10) << "sequences" << std::setw(8) << "slots" << std::setw(11) << "connected" << "\n";
    for (const auto& s : st->session_info()) {
      o << std::left << std::setw(8) << s.session_id() << std::setw(16) << s.tenant() << std::setw(24) << s.client_name().substr(0, 23)
        << std::right << std::setw(10) << s.sequences() << std::setw(8) << s.tail_slots() << std::setw(11)
        << (s.connected() ? "yes" : "no") << "\n";
    }
  }
  io.out << o.str();
  return kExitOk;
}

int RunSequences(std::span<const std::string> args, const CommandIo& io) {
  FlagSet flags("sequences");
  DaemonFlags d;
  d.Register(&flags);
  if (int rc = ParseOrExit(flags, args, io,
                           "usage: kvarnctl sequences [flags]\n\nThe live sequences of your tenant (all tenants with the admin token).");
      rc >= 0) {
    return rc;
  }
  auto c = Connect(d, true, 0, "kvarnctl sequences");
  if (!c.ok()) return ReportError(io, ToCli(c.status()));
  auto r = c->session->ListSequences();
  if (!r.ok()) return ReportError(io, ToCli(r.status()));
  std::ostringstream o;
  o << std::left << std::setw(10) << "sequence" << std::setw(9) << "session" << std::setw(16) << "tenant" << std::right
    << std::setw(10) << "tokens" << std::setw(8) << "sink" << std::setw(10) << "quant" << std::setw(8) << "tail" << "\n";
  for (const auto& s : r->sequences()) {
    o << std::left << std::setw(10) << s.sequence_id() << std::setw(9) << s.session_id() << std::setw(16) << s.tenant()
      << std::right << std::setw(10) << s.tokens() << std::setw(8) << (s.has_sink() ? "yes" : "no") << std::setw(10)
      << s.quant_blocks() << std::setw(8) << s.tail_tokens() << "\n";
  }
  o << r->sequences_size() << " sequences\n";
  io.out << o.str();
  return kExitOk;
}

int RunEvict(std::span<const std::string> args, const CommandIo& io) {
  FlagSet flags("evict");
  DaemonFlags d;
  d.Register(&flags);
  std::string bytes;
  std::string of_tenant;
  bool all = false;
  flags.String("bytes", &bytes, "N", "evict at least N bytes of cached blocks, least recently used first (admin)");
  flags.String("of-tenant", &of_tenant, "NAME", "evict this tenant's cached blocks (yours by default; others need admin)");
  flags.Bool("all", &all, "evict every cached block (admin)");
  if (int rc = ParseOrExit(flags, args, io,
                           "usage: kvarnctl evict [--of-tenant NAME | --bytes N | --all] [flags]\n\n"
                           "Evicts unreferenced cached blocks; referenced blocks are never touched.");
      rc >= 0) {
    return rc;
  }
  if (static_cast<int>(!bytes.empty()) + static_cast<int>(all) + static_cast<int>(!of_tenant.empty()) > 1) {
    return ReportError(io, InvalidArgument("give one of --of-tenant, --bytes, --all"));
  }
  uint64_t n = 0;
  if (!bytes.empty()) {
    char* end = nullptr;
    n = std::strtoull(bytes.c_str(), &end, 10);
    if (end == bytes.c_str() || *end != '\0' || n == 0) return ReportError(io, InvalidArgument("--bytes must be a positive integer"));
  }
  auto c = Connect(d, true, 0, "kvarnctl evict");
  if (!c.ok()) return ReportError(io, ToCli(c.status()));
  const auto scope = all ? v1::EvictRequest::SCOPE_ALL : n > 0 ? v1::EvictRequest::SCOPE_BYTES : v1::EvictRequest::SCOPE_TENANT;
  auto r = c->session->Evict(scope, n, of_tenant);
  if (!r.ok()) return ReportError(io, ToCli(r.status()));
  io.out << "evicted " << r->blocks() << " blocks, " << HumanBytes(static_cast<double>(r->bytes())) << "\n";
  return kExitOk;
}

int RunWatch(std::span<const std::string> args, const CommandIo& io) {
  FlagSet flags("watch");
  DaemonFlags d;
  d.Register(&flags);
  int64_t count = 0;
  flags.Int("count", &count, 0, 1LL << 40, "N", "stop after N events (default: until interrupted)");
  if (int rc = ParseOrExit(flags, args, io,
                           "usage: kvarnctl watch [flags]\n\nStreams block stored/removed events (prefix hashes) as they happen.");
      rc >= 0) {
    return rc;
  }
  auto c = Connect(d, true, 0, "kvarnctl watch");
  if (!c.ok()) return ReportError(io, ToCli(c.status()));
  int64_t seen = 0;
  const absl::Status s = c->session->Watch([&](const v1::BlockEvent& e) {
    std::string hex;
    for (unsigned char b : e.hash().substr(0, 8)) absl::StrAppend(&hex, absl::Hex(b, absl::kZeroPad2));
    io.out << e.sequence_number() << " " << (e.kind() == v1::BlockEvent::KIND_STORED ? "stored " : "removed") << " "
           << (e.fp16() ? "sink " : "quant") << " block " << e.block() << " hash " << hex << "... tenant " << e.tenant() << "\n";
    io.out.flush();
    return count == 0 || ++seen < count;
  });
  if (!s.ok()) return ReportError(io, ToCli(s));
  return kExitOk;
}

}  // namespace kvarn::ctl
