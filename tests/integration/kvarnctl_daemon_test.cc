// kvarnctl's daemon commands against a live kvarnd: demo, status (the pool's partition and
// its shares), sequences, evict (sizes with units), watch, health; --json of each, checked
// with python's json module; admin tokens (wrong, unreadable, from a file, from the
// environment); $KVARN_TARGET.
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <fstream>
#include <regex>
#include <set>
#include <thread>

#include "tests/client/kvarnctl_test_util.h"
#include "tests/integration/fixture.h"

namespace kvarn::it {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using kvarn::testing::Json;
using kvarn::ctl::testing::StrictJson;
using kvarn::ctl::testing::StrictJsonValue;

struct CtlResult {
  int code = -1;
  std::string out, err;
};

// The environment every kvarnctl run starts from: none of kvarnctl's own variables.
const std::vector<std::string> kCleanEnv = {"KVARN_TARGET", "KVARN_ADMIN_TOKEN_FILE", "KVARN_TENANT_TOKEN_FILE"};

class KvarnctlTest : public IntegrationTest {
 protected:
  // Runs kvarnctl with `args`, its environment cleaned and then changed by `env`
  // ("NAME=value").
  CtlResult Ctl(std::vector<std::string> args, std::vector<std::string> env = {}) {
    std::vector<std::string> e = kCleanEnv;
    e.insert(e.end(), env.begin(), env.end());
    auto r = RunProcess(KVARN_IT_KVARNCTL, args, e);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {};
    return {WIFEXITED(r->status) ? WEXITSTATUS(r->status) : -1, r->out, r->err};
  }

  // A file holding `text`, in the test's scratch directory.
  std::string WriteFile(const std::string& name, const std::string& text) {
    const std::string path = scratch_.path() + "/" + name;
    std::ofstream(path) << text;
    return path;
  }

  // Opens `tenant`'s session and creates `n` sequences of one sink tile and one quantized
  // tile each; they stay live while the session does.
  std::unique_ptr<Session> LiveSequences(Client& client, const std::string& tenant, int n, std::vector<uint64_t>* ids) {
    SessionOptions o;
    o.tenant = tenant;
    o.layout = SmallLayout();
    o.max_sequences = static_cast<uint32_t>(n);
    auto s = client.OpenSession(o);
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return nullptr;
    for (int i = 0; i < n; ++i) {
      auto q = (*s)->CreateSequence({});
      EXPECT_TRUE(q.ok()) << q.status();
      if (!q.ok()) return nullptr;
      const std::vector<uint32_t> toks = Tokens(static_cast<uint32_t>(100000 * (i + 1)), 2 * kTile);
      EXPECT_TRUE(AppendTokens(**s, q->id, toks, 0, toks.size()).ok());
      ids->push_back(q->id);
    }
    return std::move(*s);
  }

  TempDir scratch_;
};

// The shares column of `kvarnctl status`'s pool table, in hundredths of a percent, and its
// total row's.
struct TextShares {
  std::vector<int64_t> rows;
  int64_t total = -1;
};
TextShares ParseShares(const std::string& status) {
  TextShares t;
  const std::regex row(R"(^  (quant|sink|tail|total) +[a-z]* +[0-9]+ +[0-9]+ +[0-9.]+ [KMGT]?i?B +[0-9]+ +([0-9]+)\.([0-9]{2})%$)");
  std::istringstream in(status);
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (!std::regex_match(line, m, row)) continue;
    const int64_t v = std::stoll(m[2]) * 100 + std::stoll(m[3]);
    if (m[1] == "total") {
      t.total = v;
    } else {
      t.rows.push_back(v);
    }
  }
  return t;
}

uint64_t U64(const Json& j) { return std::stoull(j.AsString()); }  // proto3 JSON's 64-bit integers

// Bytes of cached blocks, from the pool's partition.
uint64_t CachedBytes(const v1::StatsResponse& st) {
  uint64_t bytes = 0;
  for (const auto& row : st.pool()) {
    if (row.state() == "cached") bytes += row.bytes();
  }
  return bytes;
}

TEST_F(KvarnctlTest, DemoSharesSystemPromptsAndStatusReportsIt) {
  Daemon* d = StartDaemon();
  ASSERT_NE(d, nullptr);
  const std::string target = "--target=" + d->target();
  CtlResult r = Ctl({"demo", target, "--workers", "2", "--requests", "3", "--system-tokens", "128", "--user-min", "10",
                     "--user-max", "40", "--decode-tokens", "20"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("requests          6 in"));
  EXPECT_THAT(r.out, HasSubstr("prefix hit rate"));
  EXPECT_THAT(r.out, HasSubstr("x smaller"));
  // Every request after each worker's first reuses the shared system prompt's tiles (at least one).
  EXPECT_THAT(r.out, Not(HasSubstr("prefix hit rate   0.0%")));

  r = Ctl({"demo", target, "--workers", "2", "--requests", "2", "--system-tokens", "128", "--user-min", "10",
           "--user-max", "40", "--decode-tokens", "20", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const Json demo = StrictJsonValue(r.out);
  EXPECT_EQ(demo["target"].AsString(), d->target());
  EXPECT_EQ(demo["config"]["workers"].AsNumber(), 2);
  EXPECT_EQ(demo["requests"].AsNumber(), 4);
  EXPECT_EQ(demo["tokens_appended"].AsNumber(), demo["prefill_tokens"].AsNumber() + demo["decoded_tokens"].AsNumber());
  EXPECT_EQ(demo["decoded_tokens"].AsNumber(), 4 * 20);
  // The second run finds the first's system prompts cached.
  EXPECT_GT(demo["cached_tokens"].AsNumber(), 0);
  EXPECT_DOUBLE_EQ(demo["prefix_hit_ratio"].AsNumber(), demo["cached_tokens"].AsNumber() / demo["prompt_tokens"].AsNumber());
  EXPECT_EQ(demo["model"]["preset"].AsString(), "kvarn_k4v2_g64");

  r = Ctl({"status", target});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_THAT(r.out, HasSubstr("capacity"));
  EXPECT_THAT(r.out, HasSubstr("draining  no"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("prefix cache  [1-9][0-9]* of [0-9]+ prompt tokens hit"));
  EXPECT_THAT(r.out, HasSubstr("0 sequences"));
  // Eleven rows (quant and sink: free, sealing, active, cached; tail: free, reserved,
  // retained) whose printed shares add up to exactly 100.00%.
  const TextShares shares = ParseShares(r.out);
  ASSERT_EQ(shares.rows.size(), 11u) << r.out;
  int64_t sum = 0;
  for (int64_t s : shares.rows) sum += s;
  EXPECT_EQ(sum, 10000) << r.out;
  EXPECT_EQ(shares.total, 10000) << r.out;

  r = Ctl({"status", target, "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const Json st = StrictJsonValue(r.out);
  EXPECT_EQ(st["target"].AsString(), d->target());
  EXPECT_EQ(st["daemon"]["layout"]["model_id"].AsString(), "it-model");
  EXPECT_FALSE(st["draining"].AsBool());
  EXPECT_EQ(U64(st["stats"]["pool_bytes"]), static_cast<uint64_t>(st["pool_bytes"].AsNumber()));
  EXPECT_LE(st["pool_bytes"].AsNumber(), st["capacity_bytes"].AsNumber());
  double share_sum = 0, bytes_sum = 0;
  std::set<std::string> rows;
  for (const Json& row : st["pool"].AsArray()) {
    rows.insert(row["pool_class"].AsString() + "/" + row["state"].AsString());
    share_sum += row["share_percent"].AsNumber();
    bytes_sum += row["bytes"].AsNumber();
    EXPECT_EQ(row["tokens"].AsNumber(), row["blocks"].AsNumber() * st["tile_tokens"].AsNumber());
  }
  EXPECT_EQ(rows, (std::set<std::string>{"quant/free", "quant/sealing", "quant/active", "quant/cached", "sink/free",
                                         "sink/sealing", "sink/active", "sink/cached", "tail/free", "tail/reserved",
                                         "tail/retained"}));
  EXPECT_NEAR(share_sum, 100.0, 1e-9);
  EXPECT_EQ(bytes_sum, st["pool_bytes"].AsNumber());
  EXPECT_GT(st["prefix_hit_tokens"].AsNumber(), 0);
  EXPECT_DOUBLE_EQ(st["prefix_hit_ratio"].AsNumber(),
                   st["prefix_hit_tokens"].AsNumber() / st["prefix_queried_tokens"].AsNumber());
  for (const Json& w : st["whatif"].AsArray()) {
    EXPECT_DOUBLE_EQ(w["hit_ratio"].AsNumber(), w["hit_tokens"].AsNumber() / st["prefix_queried_tokens"].AsNumber());
  }
  EXPECT_EQ(st["sequences"].AsNumber(), 0);
}

TEST_F(KvarnctlTest, SequencesEvictAndWatch) {
  Daemon* d = StartDaemon();
  ASSERT_NE(d, nullptr);
  const std::string target = "--target=" + d->target();
  auto client = d->Connect();
  ASSERT_TRUE(client.ok());
  SessionOptions o;
  o.tenant = "team-w";
  o.layout = SmallLayout();
  o.max_sequences = 2;
  IT_ASSIGN_OR_FAIL(s, (*client)->OpenSession(o));
  IT_ASSIGN_OR_FAIL(q, s->CreateSequence(Tokens(1, 10)));

  // Watch (text, and JSON Lines) in the background while this session seals a sink and a
  // quantized tile per sequence, until both watchers have their two events (a stream may
  // start after the first sequence): any two consecutive events are one sink and one
  // quantized block.
  CtlResult watched, watched_json;
  std::atomic<int> done{0};
  std::thread watcher([&] {
    watched = Ctl({"watch", target, "--admin-token", kAdminToken, "--count", "2"});
    ++done;
  });
  std::thread json_watcher([&] {
    watched_json = Ctl({"watch", target, "--admin-token", kAdminToken, "--count", "2", "--json"});
    ++done;
  });
  const std::vector<uint32_t> ids = Tokens(1, 2 * 64);
  IT_ASSERT_OK(AppendTokens(*s, q.id, ids, 0, ids.size()).status());
  for (uint32_t i = 1; done.load() < 2 && i < 200; ++i) {
    const std::vector<uint32_t> more = Tokens(1000 * i, 2 * 64);
    IT_ASSIGN_OR_FAIL(extra, s->CreateSequence({}));
    IT_ASSERT_OK(AppendTokens(*s, extra.id, more, 0, more.size()).status());
    const uint64_t gone[] = {extra.id};
    IT_ASSERT_OK(s->Release(gone));
    for (const double t0 = NowMs(); done.load() < 2 && NowMs() - t0 < 100;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  watcher.join();
  json_watcher.join();
  EXPECT_EQ(watched.code, 0) << watched.err;
  EXPECT_THAT(watched.out, HasSubstr("stored  sink  block"));
  EXPECT_THAT(watched.out, HasSubstr("stored  quant block"));
  EXPECT_THAT(watched.out, HasSubstr("tenant team-w"));
  EXPECT_EQ(watched_json.code, 0) << watched_json.err;
  const std::vector<Json> events = StrictJson(watched_json.out, /*lines=*/true);
  ASSERT_EQ(events.size(), 2u) << watched_json.out;
  EXPECT_NE(events[0]["fp16"].AsBool(), events[1]["fp16"].AsBool());
  for (const Json& e : events) {
    EXPECT_EQ(e["kind"].AsString(), "KIND_STORED");
    EXPECT_EQ(e["tenant"].AsString(), "team-w");
    EXPECT_THAT(e["hash_hex"].AsString(), ::testing::MatchesRegex("[0-9a-f]{64}"));
    EXPECT_EQ(e["parent_hash_hex"].AsString().size() % 64, 0u);
    EXPECT_GT(U64(e["sequence_number"]), 0u);
  }
  EXPECT_LT(U64(events[0]["sequence_number"]), U64(events[1]["sequence_number"]));

  CtlResult r = Ctl({"sequences", target, "--tenant", "team-w"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::ContainsRegex(std::to_string(q.id) + " +[0-9]+ +team-w +128 +yes +1 +0"));
  EXPECT_THAT(r.out, HasSubstr("1 sequences of tenant team-w"));
  r = Ctl({"sequences", target, "--tenant", "someone-else"});
  EXPECT_THAT(r.out, HasSubstr("0 sequences of tenant someone-else"));
  r = Ctl({"sequences", target, "--tenant", "team-w", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  Json seqs = StrictJsonValue(r.out);
  EXPECT_FALSE(seqs["admin"].AsBool());
  EXPECT_EQ(seqs["tenant"].AsString(), "team-w");
  ASSERT_EQ(seqs["count"].AsNumber(), 1);
  ASSERT_EQ(seqs["sequences"].AsArray().size(), 1u);
  const Json& row = seqs["sequences"].AsArray()[0];
  EXPECT_EQ(U64(row["sequence_id"]), q.id);
  EXPECT_EQ(U64(row["tokens"]), 128u);
  EXPECT_EQ(row["tenant"].AsString(), "team-w");
  EXPECT_TRUE(row["has_sink"].AsBool());
  EXPECT_EQ(row["quant_blocks"].AsNumber(), 1);

  const uint64_t release[] = {q.id};
  IT_ASSERT_OK(s->Release(release));
  r = Ctl({"evict", target, "--all"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, HasSubstr("admin token"));
  IT_ASSIGN_OR_FAIL(st, s->Stats());
  const uint32_t cached = st.quant_blocks_cached() + st.sink_blocks_cached();
  EXPECT_GE(cached, 2u);
  r = Ctl({"evict", target, "--all", "--admin-token", kAdminToken, "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const Json ev = StrictJsonValue(r.out);
  EXPECT_EQ(ev["scope"].AsString(), "all");
  EXPECT_EQ(ev["requested_bytes"].kind(), Json::Kind::kNull);
  EXPECT_EQ(ev["blocks"].AsNumber(), cached);
  EXPECT_EQ(static_cast<uint64_t>(ev["bytes"].AsNumber()), CachedBytes(st));
}

TEST_F(KvarnctlTest, EvictBytesTakesUnitsLikeKvarnd) {
  Daemon* d = StartDaemon();
  ASSERT_NE(d, nullptr);
  const std::string target = "--target=" + d->target();
  auto client = Connect(*d);
  ASSERT_NE(client, nullptr);
  IT_ASSIGN_OR_FAIL(s, Open(*client, "team-e", 1));
  // One sequence of 100 tiles, released: a sink and 99 quantized blocks cached, more than
  // the 1 MiB to evict.
  IT_ASSIGN_OR_FAIL(q, s->CreateSequence({}));
  const std::vector<uint32_t> ids = Tokens(7, 100 * kTile);
  IT_ASSERT_OK(AppendTokens(*s, q.id, ids, 0, ids.size(), /*mixed=*/false).status());
  const uint64_t release[] = {q.id};
  IT_ASSERT_OK(s->Release(release));
  IT_ASSIGN_OR_FAIL(before, s->Stats());
  ASSERT_GT(CachedBytes(before), 1u << 20);
  const uint64_t largest_block = std::max(before.quant_capacity_bytes() / std::max(1u, before.quant_blocks_total()),
                                          before.fp16_capacity_bytes() / std::max(1u, before.sink_blocks_total()));

  // A unit kvarnd does not know: refused before anything is evicted.
  CtlResult r = Ctl({"evict", target, "--bytes", "1XB", "--admin-token", kAdminToken});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, HasSubstr("unknown unit 'XB'"));
  IT_ASSIGN_OR_FAIL(unchanged, s->Stats());
  EXPECT_EQ(CachedBytes(unchanged), CachedBytes(before));

  r = Ctl({"evict", target, "--bytes", "1MiB", "--admin-token", kAdminToken, "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const Json ev = StrictJsonValue(r.out);
  EXPECT_EQ(ev["scope"].AsString(), "bytes");
  EXPECT_EQ(ev["requested_bytes"].AsNumber(), 1 << 20);
  const uint64_t evicted = static_cast<uint64_t>(ev["bytes"].AsNumber());
  EXPECT_GE(evicted, 1u << 20);
  EXPECT_LT(evicted, (1u << 20) + largest_block);
  IT_ASSIGN_OR_FAIL(after, s->Stats());
  EXPECT_EQ(CachedBytes(after), CachedBytes(before) - evicted);

  r = Ctl({"evict", target, "--bytes=512KiB", "--admin-token", kAdminToken});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::ContainsRegex("evicted [1-9][0-9]* blocks"));
}

TEST_F(KvarnctlTest, AWrongAdminTokenIsRefusedNeverATenantView) {
  Daemon* d = StartDaemon();
  ASSERT_NE(d, nullptr);
  const std::string target = "--target=" + d->target();
  auto client = Connect(*d);
  ASSERT_NE(client, nullptr);
  std::vector<uint64_t> ids;
  std::unique_ptr<Session> live = LiveSequences(*client, "team-x", 4, &ids);
  ASSERT_NE(live, nullptr);

  for (const char* command : {"sequences", "status", "watch", "evict"}) {
    CtlResult r = Ctl({command, target, "--admin-token", "not-the-token", "--json"});
    EXPECT_EQ(r.code, 1) << command;
    EXPECT_EQ(r.out, "") << command;
    EXPECT_EQ(r.err, "kvarnctl: error: the admin token was refused by kvarnd at " + d->target() +
                         " (the admin token does not match this kvarnd's)\n")
        << command;
  }
  const std::string wrong = WriteFile("wrong", "not-the-token\n");
  CtlResult r = Ctl({"sequences", target, "--admin-token-file", wrong});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, HasSubstr("the admin token was refused by kvarnd at " + d->target()));

  // The right token, from a file alone, and from $KVARN_ADMIN_TOKEN_FILE: all four.
  const std::string right = WriteFile("right", std::string(kAdminToken) + "\n");
  for (const std::vector<std::string>& how :
       {std::vector<std::string>{"--admin-token", kAdminToken}, std::vector<std::string>{"--admin-token-file", right}}) {
    std::vector<std::string> args = {"sequences", target, "--json"};
    args.insert(args.end(), how.begin(), how.end());
    r = Ctl(args);
    ASSERT_EQ(r.code, 0) << r.err;
    const Json j = StrictJsonValue(r.out);
    EXPECT_TRUE(j["admin"].AsBool());
    EXPECT_EQ(j["tenant"].kind(), Json::Kind::kNull);
    EXPECT_EQ(j["count"].AsNumber(), 4);
  }
  r = Ctl({"sequences", target}, {"KVARN_ADMIN_TOKEN_FILE=" + right});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("4 sequences, all tenants"));
  for (uint64_t id : ids) EXPECT_THAT(r.out, ::testing::ContainsRegex("(^|\n)" + std::to_string(id) + " +[0-9]+ +team-x"));

  // Unusable files: usage errors (exit 2) naming the file and the reason, daemon or not.
  r = Ctl({"sequences", target, "--admin-token-file", scratch_.path() + "/absent"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "kvarnctl: error: --admin-token-file: cannot read " + scratch_.path() +
                       "/absent: No such file or directory\n");
  r = Ctl({"status", target, "--admin-token-file", WriteFile("empty", "")});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, HasSubstr("holds no token"));
  r = Ctl({"status", target}, {"KVARN_ADMIN_TOKEN_FILE=" + scratch_.path()});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("$KVARN_ADMIN_TOKEN_FILE: cannot read " + scratch_.path() + ": Is a directory"));

  // Without any admin token: the tenant's own view, said to be one.
  r = Ctl({"sequences", target});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("0 sequences of tenant kvarnctl (the admin token lists every tenant's)"));
}

TEST_F(KvarnctlTest, EveryCommandHonoursKvarnTarget) {
  Daemon* d = StartDaemon();
  ASSERT_NE(d, nullptr);
  const std::vector<std::string> env = {"KVARN_TARGET=" + d->target()};
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"status", "--json"}, std::vector<std::string>{"sequences", "--json"},
        std::vector<std::string>{"evict", "--json"}, std::vector<std::string>{"health", "--json"},
        std::vector<std::string>{"demo", "--workers", "1", "--requests", "1", "--system-tokens", "64", "--user-min",
                                 "70", "--user-max", "70", "--decode-tokens", "0", "--json"}}) {
    const CtlResult r = Ctl(args, env);
    ASSERT_EQ(r.code, 0) << args[0] << ": " << r.err;
    EXPECT_EQ(StrictJsonValue(r.out)["target"].AsString(), d->target()) << args[0];
  }
  // watch: its first event arrives once this session seals a tile.
  auto client = Connect(*d);
  ASSERT_NE(client, nullptr);
  IT_ASSIGN_OR_FAIL(s, Open(*client, "kvarnctl", 1));
  CtlResult watched;
  std::atomic<bool> done{false};
  std::thread watcher([&] {
    watched = Ctl({"watch", "--count", "1", "--json"}, env);
    done.store(true);
  });
  for (uint32_t i = 1; !done.load() && i < 200; ++i) {
    IT_ASSIGN_OR_FAIL(q, s->CreateSequence({}));
    const std::vector<uint32_t> toks = Tokens(5000 * i, kTile);
    IT_ASSERT_OK(AppendTokens(*s, q.id, toks, 0, toks.size()).status());
    const uint64_t gone[] = {q.id};
    IT_ASSERT_OK(s->Release(gone));
    for (const double t0 = NowMs(); !done.load() && NowMs() - t0 < 100;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  watcher.join();
  ASSERT_EQ(watched.code, 0) << watched.err;
  EXPECT_EQ(StrictJson(watched.out, /*lines=*/true).size(), 1u);
  // --target overrides the variable.
  const CtlResult r = Ctl({"health", "--target=" + d->target()}, {"KVARN_TARGET=unix:/nonexistent/kvarnd.sock"});
  EXPECT_EQ(r.code, 0) << r.err;
}

TEST_F(KvarnctlTest, HealthIsServingThenFailsWithinItsDeadline) {
  Daemon* d = StartDaemon();
  ASSERT_NE(d, nullptr);
  const std::string target = "--target=" + d->target();
  CtlResult r = Ctl({"health", target});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "SERVING\n");
  EXPECT_EQ(r.err, "");
  r = Ctl({"health", target, "--service", "kvarn.v1.KvCache", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const Json h = StrictJsonValue(r.out);
  EXPECT_EQ(h["status"].AsString(), "SERVING");
  EXPECT_EQ(h["service"].AsString(), "kvarn.v1.KvCache");
  EXPECT_EQ(h["target"].AsString(), d->target());
  r = Ctl({"health", target, "--service", "no.such.Service"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, HasSubstr("has no health status for service 'no.such.Service'"));

  // A daemon that takes the connection but never answers (stopped): the deadline ends it.
  ASSERT_EQ(kill(d->pid(), SIGSTOP), 0);
  double t0 = NowMs();
  r = Ctl({"health", target, "--timeout", "500ms"});
  double ms = NowMs() - t0;
  ASSERT_EQ(kill(d->pid(), SIGCONT), 0);
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, HasSubstr("kvarnd at " + d->target() + " did not answer within 500ms"));
  Report(absl::StrCat("kvarnctl health --timeout 500ms against a stopped kvarnd returned in ", ms, " ms"));
  r = Ctl({"health", target});
  EXPECT_EQ(r.code, 0) << r.err;

  // A socket path nobody listens on: unreachable, at once.
  t0 = NowMs();
  r = Ctl({"health", "--target=unix:" + d->dir() + "/gone.sock", "--timeout", "2s"});
  ms = NowMs() - t0;
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, HasSubstr("health: kvarnd at unix:" + d->dir() + "/gone.sock is not reachable"));
  Report(absl::StrCat("kvarnctl health against a dead socket path returned in ", ms, " ms"));
}

TEST_F(KvarnctlTest, UnreachableDaemonIsAClearFailure) {
  const CtlResult r = Ctl({"status", "--target=unix:/nonexistent/kvarnd.sock"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, HasSubstr("not reachable"));
}

}  // namespace
}  // namespace kvarn::it
