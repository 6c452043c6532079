// `kvarnctl sequences`, `evict` and `watch`.
#include "client/kvarnctl/daemon_commands.h"

#include <iomanip>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "client/kvarnctl/json.h"

namespace kvarn::ctl {
namespace {

std::string Hex(const std::string& bytes) {
  std::string hex;
  for (unsigned char b : bytes) absl::StrAppend(&hex, absl::Hex(b, absl::kZeroPad2));
  return hex;
}

const char* ScopeName(v1::EvictRequest::Scope s) {
  switch (s) {
    case v1::EvictRequest::SCOPE_TENANT: return "tenant";
    case v1::EvictRequest::SCOPE_BYTES: return "bytes";
    case v1::EvictRequest::SCOPE_ALL: return "all";
    default: return "unspecified";
  }
}

}  // namespace

int RunSequences(std::span<const std::string> args, const CommandIo& io) {
  FlagSet flags("sequences");
  DaemonFlags d;
  d.Register(&flags);
  bool json = false;
  flags.Bool("json", &json, "print one JSON object: target, admin, tenant, count, sequences (docs/kvarnctl.md)");
  if (int rc = ParseOrExit(flags, args, io,
                           "usage: kvarnctl sequences [flags]\n\n"
                           "The live sequences of your tenant (--tenant), or of every tenant with the admin token.\n"
                           "A wrong admin token is an error, never a tenant's view.");
      rc >= 0) {
    return rc;
  }
  auto c = Connect(d, true, 0, "kvarnctl sequences");
  if (!c.ok()) return ReportError(io, ToCli(c.status()));
  auto r = c->session->ListSequences();
  if (!r.ok()) return ReportError(io, ToCli(r.status()));
  if (json) {
    JsonWriter j;
    j.BeginObject().Field("target", d.target).Field("admin", c->admin);
    if (c->admin) {
      j.Key("tenant").Null();
    } else {
      j.Field("tenant", d.tenant);
    }
    j.Field("count", r->sequences_size());
    j.Key("sequences").BeginArray();
    for (const auto& s : r->sequences()) j.Raw(ProtoJson(s));
    j.EndArray().EndObject();
    io.out << j.str() << "\n";
    return kExitOk;
  }
  std::ostringstream o;
  o << std::left << std::setw(10) << "sequence" << std::setw(9) << "session" << std::setw(16) << "tenant" << std::right
    << std::setw(10) << "tokens" << std::setw(8) << "sink" << std::setw(10) << "quant" << std::setw(8) << "tail" << "\n";
  for (const auto& s : r->sequences()) {
    o << std::left << std::setw(10) << s.sequence_id() << std::setw(9) << s.session_id() << std::setw(16) << s.tenant()
      << std::right << std::setw(10) << s.tokens() << std::setw(8) << (s.has_sink() ? "yes" : "no") << std::setw(10)
      << s.quant_blocks() << std::setw(8) << s.tail_tokens() << "\n";
  }
  o << r->sequences_size() << " sequences"
    << (c->admin ? ", all tenants" : " of tenant " + d.tenant + " (the admin token lists every tenant's)") << "\n";
  io.out << o.str();
  return kExitOk;
}

int RunEvict(std::span<const std::string> args, const CommandIo& io) {
  FlagSet flags("evict");
  DaemonFlags d;
  d.Register(&flags);
  uint64_t bytes = 0;
  std::string of_tenant;
  bool all = false, json = false;
  flags.Bytes("bytes", &bytes, "SIZE", "evict at least SIZE of cached blocks, least recently used first (admin)");
  flags.String("of-tenant", &of_tenant, "NAME", "evict this tenant's cached blocks (yours by default; others need admin)");
  flags.Bool("all", &all, "evict every cached block (admin)");
  flags.Bool("json", &json, "print one JSON object: target, scope, requested_bytes, tenant, blocks, bytes");
  if (int rc = ParseOrExit(flags, args, io,
                           "usage: kvarnctl evict [--of-tenant NAME | --bytes SIZE | --all] [flags]\n\n"
                           "Evicts unreferenced cached blocks; referenced blocks are never touched. Without a scope,\n"
                           "your tenant's cached blocks. SIZE takes units as kvarnd's configuration does: 1MiB,\n"
                           "512KiB, 2GiB, 1.5GB, or plain bytes.");
      rc >= 0) {
    return rc;
  }
  const bool by_bytes = flags.Seen("bytes");
  if (static_cast<int>(by_bytes) + static_cast<int>(all) + static_cast<int>(!of_tenant.empty()) > 1) {
    return ReportError(io, InvalidArgument("evict: give one of --of-tenant, --bytes, --all"));
  }
  auto c = Connect(d, true, 0, "kvarnctl evict");
  if (!c.ok()) return ReportError(io, ToCli(c.status()));
  const auto scope = all        ? v1::EvictRequest::SCOPE_ALL
                     : by_bytes ? v1::EvictRequest::SCOPE_BYTES
                                : v1::EvictRequest::SCOPE_TENANT;
  auto r = c->session->Evict(scope, bytes, of_tenant);
  if (!r.ok()) return ReportError(io, ToCli(r.status()));
  if (json) {
    JsonWriter j;
    j.BeginObject().Field("target", d.target).Field("scope", ScopeName(scope));
    if (by_bytes) {
      j.Field("requested_bytes", bytes);
    } else {
      j.Key("requested_bytes").Null();
    }
    if (scope == v1::EvictRequest::SCOPE_TENANT) {
      j.Field("tenant", of_tenant.empty() ? d.tenant : of_tenant);
    } else {
      j.Key("tenant").Null();
    }
    j.Field("blocks", static_cast<uint64_t>(r->blocks())).Field("bytes", static_cast<uint64_t>(r->bytes())).EndObject();
    io.out << j.str() << "\n";
    return kExitOk;
  }
  io.out << "evicted " << r->blocks() << " blocks, " << HumanBytes(static_cast<double>(r->bytes())) << " ("
         << r->bytes() << " bytes)\n";
  return kExitOk;
}

int RunWatch(std::span<const std::string> args, const CommandIo& io) {
  FlagSet flags("watch");
  DaemonFlags d;
  d.Register(&flags);
  int64_t count = 0;
  bool json = false;
  flags.Int("count", &count, 0, 1LL << 40, "N", "stop after N events (default: until interrupted)");
  flags.Bool("json", &json, "JSON Lines: one object per event, flushed as it arrives (docs/kvarnctl.md)");
  if (int rc = ParseOrExit(flags, args, io,
                           "usage: kvarnctl watch [flags]\n\n"
                           "Streams block stored/removed events (prefix hashes) as they happen: your tenant's, every\n"
                           "tenant's with the admin token.");
      rc >= 0) {
    return rc;
  }
  auto c = Connect(d, true, 0, "kvarnctl watch");
  if (!c.ok()) return ReportError(io, ToCli(c.status()));
  int64_t seen = 0;
  const absl::Status s = c->session->Watch([&](const v1::BlockEvent& e) {
    if (json) {
      JsonWriter j;
      j.BeginObject()
          .RawMembers(ProtoJson(e))
          .Field("hash_hex", Hex(e.hash()))
          .Field("parent_hash_hex", Hex(e.parent_hash()))
          .EndObject();
      io.out << j.str() << "\n";
    } else {
      io.out << e.sequence_number() << " " << (e.kind() == v1::BlockEvent::KIND_STORED ? "stored " : "removed") << " "
             << (e.fp16() ? "sink " : "quant") << " block " << e.block() << " hash " << Hex(e.hash().substr(0, 8))
             << "... tenant " << e.tenant() << "\n";
    }
    io.out.flush();
    return count == 0 || ++seen < count;
  });
  if (!s.ok()) return ReportError(io, ToCli(s));
  return kExitOk;
}

}  // namespace kvarn::ctl
