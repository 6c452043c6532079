// `kvarnctl status`: the daemon's identity, the pool's exact partition by class and state
// (StatsResponse.pool: each byte of pool_bytes in exactly one row, so the shares add up to
// 100%), draining, the prefix cache and its what-if estimates, sessions.
//
// The older summary fields of StatsResponse (free/active/cached/fp16 bytes, 4..7) overlap
// and are not used here.
#include <cstdio>
#include <iomanip>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/kvarnctl/daemon_commands.h"
#include "client/kvarnctl/json.h"
#include "client/kvarnctl/shares.h"

namespace kvarn::ctl {
namespace {

constexpr int kShareDecimals = 2;

// hit / queried, or a negative value when nothing was queried.
double Ratio(uint64_t hit, uint64_t queried) {
  return queried > 0 ? static_cast<double>(hit) / static_cast<double>(queried) : -1;
}

std::string Pct(double ratio) {
  if (ratio < 0) return "n/a";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%%", 100 * ratio);
  return buf;
}

uint64_t PartitionSum(const v1::StatsResponse& st) {
  uint64_t sum = 0;
  for (const auto& r : st.pool()) sum += r.bytes();
  return sum;
}

std::string StatusJson(const std::string& target, const v1::DescribeResponse& d, const v1::StatsResponse& st) {
  JsonWriter j;
  j.BeginObject();
  j.Field("target", target);
  j.Key("daemon").Raw(ProtoJson(d));
  j.Key("stats").Raw(ProtoJson(st));
  j.Field("capacity_bytes", st.capacity_bytes());
  j.Field("pool_bytes", st.pool_bytes());
  j.Field("tile_tokens", st.tile_tokens());
  j.Field("draining", st.draining());
  j.Key("pool").BeginArray();
  for (const auto& r : st.pool()) {
    j.BeginObject();
    j.Field("pool_class", r.pool_class());
    j.Field("state", r.state());
    j.Field("blocks", r.blocks());
    j.Field("bytes", r.bytes());
    j.Field("tokens", r.tokens());
    if (st.pool_bytes() > 0) {
      j.Field("share_percent", 100.0 * static_cast<double>(r.bytes()) / static_cast<double>(st.pool_bytes()));
    } else {
      j.Key("share_percent").Null();
    }
    j.EndObject();
  }
  j.EndArray();
  j.Field("prefix_queried_tokens", st.prefix_queried_tokens());
  j.Field("prefix_hit_tokens", st.prefix_hit_tokens());
  const double hit = Ratio(st.prefix_hit_tokens(), st.prefix_queried_tokens());
  if (hit >= 0) {
    j.Field("prefix_hit_ratio", hit);
  } else {
    j.Key("prefix_hit_ratio").Null();
  }
  j.Key("whatif").BeginArray();
  for (const auto& w : st.whatif()) {
    j.BeginObject();
    j.Field("capacity_scale", w.capacity_scale());
    j.Field("hit_tokens", w.hit_tokens());
    const double r = Ratio(w.hit_tokens(), st.prefix_queried_tokens());
    if (r >= 0) {
      j.Field("hit_ratio", r);
    } else {
      j.Key("hit_ratio").Null();
    }
    j.EndObject();
  }
  j.EndArray();
  j.Key("tiers").BeginArray();
  for (const auto& t : st.tiers()) {
    j.BeginObject();
    j.Field("name", t.name());
    j.Field("write", t.write());
    j.Field("blocks", t.blocks());
    j.Field("bytes", t.bytes());
    j.Field("capacity_bytes", t.capacity_bytes());
    j.Field("hits", t.hits());
    j.Field("misses", t.misses());
    const double r = Ratio(t.hits(), t.hits() + t.misses());
    if (r >= 0) {
      j.Field("hit_ratio", r);
    } else {
      j.Key("hit_ratio").Null();
    }
    j.Field("onboarded_blocks", t.onboarded_blocks());
    j.Field("hit_tokens", t.hit_tokens());
    j.Field("queued_blocks", t.queued_blocks());
    j.Field("dropped_writes", t.dropped_writes());
    j.Field("errors", t.errors());
    uint64_t rejected = 0;
    for (const auto& [reason, n] : t.rejected()) rejected += n;
    j.Field("rejected_blocks", rejected);
    j.EndObject();
  }
  j.EndArray();
  j.Field("sessions", st.sessions());
  j.Field("sequences", st.sequences());
  j.EndObject();
  return j.str();
}

// The tiers below the pool, one row each (docs/tiers.md).
void TierTable(const v1::StatsResponse& st, std::ostream& o) {
  if (st.tiers_size() == 0) {
    o << "tiers         none (no disk_tier_dir or memcached_servers configured)\n";
    return;
  }
  o << "tiers         below the pool, in lookup order:\n";
  o << "  " << std::left << std::setw(11) << "tier" << std::setw(7) << "write" << std::right << std::setw(10) << "blocks"
    << std::setw(12) << "bytes" << std::setw(12) << "bound" << std::setw(11) << "hit ratio" << std::setw(11)
    << "onboarded" << std::setw(8) << "queued" << std::setw(9) << "dropped" << std::setw(9) << "rejected" << std::setw(8)
    << "errors" << "\n";
  for (const auto& t : st.tiers()) {
    uint64_t rejected = 0;
    for (const auto& [reason, n] : t.rejected()) rejected += n;
    o << "  " << std::left << std::setw(11) << t.name() << std::setw(7) << t.write() << std::right << std::setw(10)
      << t.blocks() << std::setw(12) << HumanBytes(static_cast<double>(t.bytes())) << std::setw(12)
      << (t.capacity_bytes() > 0 ? HumanBytes(static_cast<double>(t.capacity_bytes())) : std::string("servers'"))
      << std::setw(11) << Pct(Ratio(t.hits(), t.hits() + t.misses())) << std::setw(11) << t.onboarded_blocks()
      << std::setw(8) << t.queued_blocks() << std::setw(9) << t.dropped_writes() << std::setw(9) << rejected
      << std::setw(8) << t.errors() << "\n";
  }
}

void PoolTable(const v1::StatsResponse& st, std::ostream& o, std::ostream& warnings) {
  const uint64_t sum = PartitionSum(st);
  if (st.pool_size() == 0) {
    warnings << "kvarnctl: warning: this kvarnd reports no pool partition (StatsResponse.pool); "
                "it is older than this kvarnctl, so no shares are shown\n";
    return;
  }
  if (sum != st.pool_bytes()) {
    warnings << "kvarnctl: warning: kvarnd's pool rows add up to " << sum << " bytes, not its pool_bytes "
             << st.pool_bytes() << "; shares are of pool_bytes and may not add up to 100%\n";
  }
  std::vector<uint64_t> parts;
  for (const auto& r : st.pool()) parts.push_back(r.bytes());
  const std::vector<int64_t> shares =
      st.pool_bytes() > 0 ? PercentShares(parts, st.pool_bytes(), kShareDecimals) : std::vector<int64_t>();
  const auto row = [&](const std::string& cls, const std::string& state, uint64_t blocks, uint64_t bytes,
                       uint64_t tokens, const std::string& share) {
    o << "  " << std::left << std::setw(7) << cls << std::setw(10) << state << std::right << std::setw(10) << blocks
      << std::setw(14) << bytes << std::setw(12) << HumanBytes(static_cast<double>(bytes)) << std::setw(12) << tokens
      << std::setw(10) << share << "\n";
  };
  o << "  " << std::left << std::setw(7) << "class" << std::setw(10) << "state" << std::right << std::setw(10)
    << "blocks" << std::setw(14) << "bytes" << std::setw(12) << "size" << std::setw(12) << "tokens" << std::setw(10)
    << "share" << "\n";
  uint64_t blocks = 0, tokens = 0;
  int64_t share_sum = 0;
  for (int i = 0; i < st.pool_size(); ++i) {
    const auto& r = st.pool(i);
    blocks += r.blocks();
    tokens += r.tokens();
    const std::string share = shares.empty() ? "-" : FormatShare(shares[static_cast<size_t>(i)], kShareDecimals);
    if (!shares.empty()) share_sum += shares[static_cast<size_t>(i)];
    row(r.pool_class(), r.state(), r.blocks(), r.bytes(), r.tokens(), share);
  }
  row("total", "", blocks, sum, tokens, shares.empty() ? "-" : FormatShare(share_sum, kShareDecimals));
}

std::string StatusText(const std::string& target, const v1::DescribeResponse& d, const v1::StatsResponse& st,
                       std::ostream& warnings) {
  std::ostringstream o;
  o << "kvarnd " << d.version() << " at " << target << "  (epoch " << d.epoch() << ", " << d.backend()
    << " backend)\n";
  o << "model     " << d.layout().model_id() << ": " << d.layout().num_layers() << " layers x "
    << d.layout().num_kv_heads() << " kv-heads x " << d.layout().head_dim() << ", preset " << d.layout().preset()
    << ", sink " << d.layout().sink_tokens() << " tokens\n";
  o << "draining  "
    << (st.draining() ? "YES: kvarnd is shutting down (SIGTERM); no new sessions, open ones are still served"
                      : "no")
    << "\n\n";
  o << "pool      " << HumanBytes(static_cast<double>(st.pool_bytes())) << " (" << st.pool_bytes() << " bytes) of "
    << HumanBytes(static_cast<double>(st.capacity_bytes())) << " capacity (the rest fits no block), "
    << st.tile_tokens() << "-token blocks; shares are of the pool\n";
  PoolTable(st, o, warnings);
  const uint64_t queried = st.prefix_queried_tokens();
  o << "\nprefix cache  " << st.prefix_hit_tokens() << " of " << queried << " prompt tokens hit ("
    << Pct(Ratio(st.prefix_hit_tokens(), queried)) << ")\n";
  if (st.whatif_size() > 0) {
    o << "what-if       prompt tokens that would have hit with the quantized pool scaled (ghost cache):\n";
    o << "  " << std::right << std::setw(8) << "scale" << std::setw(14) << "hit tokens" << std::setw(12) << "hit ratio"
      << "\n";
    for (const auto& w : st.whatif()) {
      char scale[32];
      std::snprintf(scale, sizeof scale, "%.2fx", w.capacity_scale());
      o << "  " << std::setw(8) << scale << std::setw(14) << w.hit_tokens() << std::setw(12)
        << Pct(Ratio(w.hit_tokens(), queried)) << "\n";
    }
  }
  TierTable(st, o);
  o << "activity      " << st.seals() << " tiles sealed, " << st.evictions() << " blocks evicted\n";
  o << "sessions      " << st.sessions() << " open, " << st.sequences() << " sequences\n";
  if (st.session_info_size() > 0) {
    o << "\n" << std::left << std::setw(8) << "session" << std::setw(16) << "tenant" << std::setw(24) << "client"
      << std::right << std::setw(10) << "sequences" << std::setw(8) << "slots" << std::setw(11) << "connected"
      << "\n";
    for (const auto& s : st.session_info()) {
      o << std::left << std::setw(8) << s.session_id() << std::setw(16) << s.tenant() << std::setw(24)
        << s.client_name().substr(0, 23) << std::right << std::setw(10) << s.sequences() << std::setw(8)
        << s.tail_slots() << std::setw(11) << (s.connected() ? "yes" : "no") << "\n";
    }
  }
  return o.str();
}

}  // namespace

int RunStatus(std::span<const std::string> args, const CommandIo& io) {
  FlagSet flags("status");
  DaemonFlags d;
  d.Register(&flags);
  bool json = false;
  flags.Bool("json", &json, "print one JSON object (docs/kvarnctl.md: target, daemon, stats, pool with shares, ...)");
  if (int rc = ParseOrExit(flags, args, io,
                           "usage: kvarnctl status [flags]\n\n"
                           "A running kvarnd: its identity; the pool's exact partition by class (quant, sink, tail)\n"
                           "and state, in blocks, bytes, tokens and shares of the pool that add up to 100%;\n"
                           "whether it is draining; the prefix cache's hit ratio and, when kvarnd reports them,\n"
                           "what-if rows (the hit ratio a pool scaled by capacity_scale would have had:\n"
                           "hit_tokens / prefix_queried_tokens); the tiers below the pool (disk, memcached:\n"
                           "blocks, bytes, hit ratio, onboarded blocks, write-behind queue, rejected records);\n"
                           "sessions. Other tenants' sessions show with the\n"
                           "admin token.");
      rc >= 0) {
    return rc;
  }
  auto c = Connect(d, /*observer=*/true, 0, "kvarnctl status");
  if (!c.ok()) return ReportError(io, ToCli(c.status()));
  auto st = c->session->Stats();
  if (!st.ok()) return ReportError(io, ToCli(st.status()));
  if (json) {
    io.out << StatusJson(d.target, c->daemon, *st) << "\n";
    return kExitOk;
  }
  io.out << StatusText(d.target, c->daemon, *st, io.err);
  return kExitOk;
}

}  // namespace kvarn::ctl
