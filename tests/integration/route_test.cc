// kvarn::Router (client/lib/router.h) over real kvarnd processes: two nodes, each prefilled
// with its own prompt, ranked from the router's Watch indexes; a node restarted (its stream
// ends, Lookup answers until the new daemon's index is proven complete again); a node's
// disk tier surviving its restart (answered by Lookup, by tier); two nodes sharing memcached
// (a block either wrote there counts as remote for both); an endpoint where nothing listens
// (ranked last with its error); and the kvarnctl route binary.
#include <sys/wait.h>

#include <fstream>

#include "client/lib/router.h"
#include "tests/common/memcached_servers.h"
#include "tests/integration/fixture.h"

namespace kvarn::it {
namespace {

using ::testing::HasSubstr;

constexpr char kTenant[] = "team-route";
constexpr size_t kPromptLen = 8 * kTile + 1;  // adopts floor((len - 1) / 64) = 8 blocks
constexpr uint64_t kFull = 8 * kTile;
constexpr absl::Duration kWait = absl::Seconds(20);

class RouteTest : public IntegrationTest {
 protected:
  // Appends `prompt` through a session of kTenant on `d`, then releases it: its tiles stay
  // in the pool, cached.
  void Prefill(const Daemon& d, const std::vector<uint32_t>& prompt) {
    auto client = Connect(d);
    ASSERT_NE(client, nullptr);
    IT_ASSIGN_OR_FAIL(s, Open(*client, kTenant, 2));
    IT_ASSIGN_OR_FAIL(seq, s->CreateSequence(prompt));
    IT_ASSIGN_OR_FAIL(table, AppendTokens(*s, seq.id, prompt, 0, prompt.size()));
    ASSERT_EQ(table.tokens, prompt.size());
    const uint64_t ids[] = {seq.id};
    IT_ASSERT_OK(s->Release(ids));
  }

  std::unique_ptr<Router> MakeRouter(std::vector<std::string> endpoints) {
    RouterOptions o;
    o.endpoints = std::move(endpoints);
    o.tenant = kTenant;
    o.admin_token = kAdminToken;  // sees every event, as a router should
    o.connect_timeout = absl::Seconds(1);
    o.backoff_max = absl::Milliseconds(400);
    auto r = Router::Create(o);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? std::move(*r) : nullptr;
  }

  // Waits until endpoint `i`'s index is complete and matches `tokens` of `prompt` in the pool.
  bool AwaitIndexed(const Router& r, size_t i, const std::vector<uint32_t>& prompt,
                    uint64_t tokens) {
    return r.Await(
        [&] {
          if (r.Info(i).state != IndexState::kComplete) return false;
          auto m = r.IndexMatch(i, prompt);
          return m.ok() && m->pool == tokens;
        },
        absl::Now() + kWait);
  }

  // Waits until the streams of endpoints 0 and 1 are open, then prefills p1 on `a` and p2 on
  // `b` and waits until each index holds its prompt whole.
  void PrefillBothIndexed(Router& router, Daemon& a, Daemon& b, const std::vector<uint32_t>& p1,
                          const std::vector<uint32_t>& p2) {
    ASSERT_TRUE(router.Await(
        [&] {
          return router.Info(0).state != IndexState::kDisconnected &&
                 router.Info(1).state != IndexState::kDisconnected;
        },
        absl::Now() + kWait));
    Prefill(a, p1);
    Prefill(b, p2);
    ASSERT_TRUE(AwaitIndexed(router, 0, p1, kFull)) << IndexStateName(router.Info(0).state);
    ASSERT_TRUE(AwaitIndexed(router, 1, p2, kFull)) << IndexStateName(router.Info(1).state);
  }

  static const RouteResult& Of(const std::vector<RouteResult>& ranked, size_t endpoint) {
    for (const RouteResult& r : ranked) {
      if (r.endpoint_index == endpoint) return r;
    }
    ADD_FAILURE() << "endpoint " << endpoint << " missing from the ranking";
    return ranked.front();
  }
};

std::vector<uint32_t> Concat(std::vector<uint32_t> a, const std::vector<uint32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST_F(RouteTest, RanksEachPromptsNodeFirstFromTheWatchIndexAndRecoversAfterARestart) {
  TempDir b_dir;
  const std::string b_instance = UniqueInstance();
  const std::string b_socket = b_dir.path() + "/kvarnd.sock";
  Daemon* a = StartDaemon();
  Daemon* b = StartDaemon({}, b_instance, b_socket);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const std::string absent = "unix:" + b_dir.path() + "/nobody-listens.sock";
  auto router = MakeRouter({a->target(), b->target(), absent});
  ASSERT_NE(router, nullptr);
  // Both streams open before anything is stored: each index will see its daemon's event 1.
  const std::vector<uint32_t> p1 = Tokens(10000, kPromptLen);
  const std::vector<uint32_t> p2 = Tokens(50000, kPromptLen);
  PrefillBothIndexed(*router, *a, *b, p1, p2);
  if (HasFatalFailure()) return;

  // P1: A first with the whole adoptable prefix, from the index; B has none of it; the
  // endpoint where nothing listens comes last, with its error.
  std::vector<RouteResult> ranked = router->Rank(p1);
  ASSERT_EQ(ranked.size(), 3u);
  EXPECT_EQ(ranked[0].endpoint, a->target());
  EXPECT_EQ(ranked[0].source, RouteSource::kWatchIndex);
  EXPECT_EQ(ranked[0].cached_tokens, kFull);
  EXPECT_EQ(ranked[0].tokens.pool, kFull);
  EXPECT_EQ(ranked[0].score, static_cast<double>(kFull));
  EXPECT_EQ(ranked[0].epoch, a->epoch());
  EXPECT_EQ(ranked[1].endpoint, b->target());
  EXPECT_EQ(ranked[1].source, RouteSource::kWatchIndex);
  EXPECT_EQ(ranked[1].cached_tokens, 0u);
  EXPECT_EQ(ranked[2].endpoint, absent);
  EXPECT_FALSE(ranked[2].status.ok());
  EXPECT_EQ(ranked[2].source, RouteSource::kNone);
  EXPECT_EQ(ranked[2].cached_tokens, 0u);

  // P2: B first.
  ranked = router->Rank(p2);
  EXPECT_EQ(ranked[0].endpoint, b->target());
  EXPECT_EQ(ranked[0].cached_tokens, kFull);
  EXPECT_EQ(ranked[0].source, RouteSource::kWatchIndex);
  EXPECT_EQ(Of(ranked, 0).cached_tokens, 0u);

  // A prompt sharing P1's first half: A has half.
  const std::vector<uint32_t> half(p1.begin(), p1.begin() + 4 * kTile);
  const std::vector<uint32_t> p3 = Concat(half, Tokens(70000, 4 * kTile + 1));
  ranked = router->Rank(p3);
  EXPECT_EQ(ranked[0].endpoint, a->target());
  EXPECT_EQ(ranked[0].cached_tokens, 4 * kTile);
  EXPECT_EQ(ranked[0].tokens.pool, 4 * kTile);

  // verify: every endpoint by Lookup, which agrees with the index.
  ranked = router->Rank(p1, RankOptions{.verify = true});
  EXPECT_EQ(ranked[0].endpoint, a->target());
  EXPECT_EQ(ranked[0].source, RouteSource::kLookup);
  EXPECT_EQ(ranked[0].cached_tokens, kFull);
  EXPECT_EQ(Of(ranked, 1).source, RouteSource::kLookup);
  EXPECT_EQ(Of(ranked, 1).cached_tokens, 0u);

  // B restarts: its stream ends, the index is dropped, and while B is down it is ranked
  // behind A with its error.
  const uint64_t old_epoch = b->epoch();
  const uint64_t streams_before = router->Info(1).streams;
  StopCleanly(b);
  ASSERT_TRUE(router->Await([&] { return router->Info(1).state == IndexState::kDisconnected; },
                            absl::Now() + kWait));
  ranked = router->Rank(p2);
  EXPECT_EQ(ranked[0].endpoint, a->target());
  EXPECT_FALSE(Of(ranked, 1).status.ok());
  EXPECT_EQ(Of(ranked, 1).source, RouteSource::kNone);

  // The new B (same socket, new epoch): the router reconnects by itself. Nothing is proven
  // about the new index until its first event, so Lookup answers (the new daemon is empty).
  Daemon* b2 = StartDaemon({}, b_instance, b_socket);
  ASSERT_NE(b2, nullptr);
  ASSERT_NE(b2->epoch(), old_epoch);
  ASSERT_TRUE(router->Await(
      [&] {
        const EndpointInfo info = router->Info(1);
        return info.epoch == b2->epoch() && info.state == IndexState::kPartial;
      },
      absl::Now() + kWait));
  EXPECT_GT(router->Info(1).streams, streams_before);
  ranked = router->Rank(p2);
  EXPECT_TRUE(Of(ranked, 1).status.ok()) << Of(ranked, 1).status;
  EXPECT_EQ(Of(ranked, 1).source, RouteSource::kLookup);
  EXPECT_EQ(Of(ranked, 1).cached_tokens, 0u);
  EXPECT_EQ(Of(ranked, 1).epoch, b2->epoch());

  // P2 prefilled again on the new B: its index sees event 1, is complete, and answers.
  Prefill(*b2, p2);
  ASSERT_TRUE(AwaitIndexed(*router, 1, p2, kFull)) << IndexStateName(router->Info(1).state);
  ranked = router->Rank(p2);
  EXPECT_EQ(ranked[0].endpoint, b2->target());
  EXPECT_EQ(ranked[0].source, RouteSource::kWatchIndex);
  EXPECT_EQ(ranked[0].cached_tokens, kFull);
  EXPECT_EQ(ranked[0].epoch, b2->epoch());
  Report(absl::StrCat("router: endpoint B streams opened ", router->Info(1).streams,
                      ", events applied ", router->Info(1).events, ", indexed blocks ",
                      router->Info(1).indexed_blocks));
}

TEST_F(RouteTest, DiskTierThatSurvivesARestartIsAnsweredByLookupByTier) {
  TempDir tier_dir, b_dir;
  const std::string b_instance = UniqueInstance();
  const std::string b_socket = b_dir.path() + "/kvarnd.sock";
  const std::vector<std::string> disk = {"--disk_tier_dir=" + tier_dir.path() + "/tier"};
  Daemon* a = StartDaemon();
  Daemon* b = StartDaemon(disk, b_instance, b_socket);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const std::vector<uint32_t> p2 = Tokens(50000, kPromptLen);
  Prefill(*b, p2);
  // kvarnd spills its pool to the disk tier when it stops; the new daemon finds the records.
  StopCleanly(b);
  Daemon* b2 = StartDaemon(disk, b_instance, b_socket);
  ASSERT_NE(b2, nullptr);

  auto router = MakeRouter({a->target(), b2->target()});
  ASSERT_NE(router, nullptr);
  ASSERT_TRUE(router->Await([&] { return router->Info(1).state != IndexState::kDisconnected; },
                            absl::Now() + kWait));
  // Records found at start come with no event: the index cannot know them, so it is never
  // complete, and B is answered by Lookup, from its disk tier.
  std::vector<RouteResult> ranked = router->Rank(p2);
  EXPECT_EQ(ranked[0].endpoint, b2->target());
  EXPECT_EQ(ranked[0].source, RouteSource::kLookup);
  EXPECT_EQ(ranked[0].cached_tokens, kFull);
  EXPECT_EQ(ranked[0].tokens.pool, 0u);
  EXPECT_EQ(ranked[0].tokens.disk, kFull);
  EXPECT_DOUBLE_EQ(ranked[0].score, 0.9 * kFull);
  EXPECT_EQ(router->Info(1).state, IndexState::kPartial);
}

TEST_F(RouteTest, BlocksInSharedMemcachedCountAsRemoteForEveryNode) {
  kvarn::testing::MemcachedServerOptions mo;
  mo.count = 1;
  auto servers = kvarn::testing::MemcachedServers::Start(mo);
  ASSERT_TRUE(servers.ok()) << servers.status();
  const std::vector<std::string> mc = {"--memcached_servers=" + (*servers)->address(0)};
  Daemon* a = StartDaemon(mc);
  Daemon* b = StartDaemon(mc);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto router = MakeRouter({a->target(), b->target()});
  ASSERT_NE(router, nullptr);
  // Each node seals its prompt's tiles, and writes them to memcached as they seal.
  const std::vector<uint32_t> p1 = Tokens(10000, kPromptLen);
  const std::vector<uint32_t> p2 = Tokens(50000, kPromptLen);
  PrefillBothIndexed(*router, *a, *b, p1, p2);
  if (HasFatalFailure()) return;
  // B's own index has none of P1; A saw P1's blocks stored in memcached, which B reads too.
  std::vector<RouteResult> ranked;
  ASSERT_TRUE(router->Await(
      [&] {
        ranked = router->Rank(p1);
        return Of(ranked, 1).tokens.remote == kFull;
      },
      absl::Now() + kWait))
      << "B's remote tokens for P1: " << Of(ranked, 1).tokens.remote;
  EXPECT_EQ(ranked[0].endpoint, a->target());
  EXPECT_EQ(ranked[0].tokens.pool, kFull);
  EXPECT_EQ(ranked[0].source, RouteSource::kWatchIndex);
  EXPECT_EQ(ranked[1].endpoint, b->target());
  EXPECT_EQ(ranked[1].source, RouteSource::kWatchIndex);
  EXPECT_EQ(ranked[1].tokens.pool, 0u);
  EXPECT_EQ(ranked[1].cached_tokens, kFull);
  EXPECT_DOUBLE_EQ(ranked[1].score, 0.5 * kFull);
  // B's own Lookup agrees: it would fetch P1's blocks from memcached.
  ranked = router->Rank(p1, RankOptions{.verify = true});
  EXPECT_EQ(Of(ranked, 1).source, RouteSource::kLookup);
  EXPECT_EQ(Of(ranked, 1).tokens.remote, kFull);
  EXPECT_EQ(Of(ranked, 1).tokens.pool, 0u);
  // And the other way round for P2.
  ASSERT_TRUE(router->Await(
      [&] {
        ranked = router->Rank(p2);
        return Of(ranked, 0).tokens.remote == kFull;
      },
      absl::Now() + kWait));
  EXPECT_EQ(ranked[0].endpoint, b->target());
  EXPECT_EQ(ranked[0].tokens.pool, kFull);
}

TEST_F(RouteTest, KvarnctlRoutePrintsTheRankingAndFailsClearly) {
  Daemon* a = StartDaemon();
  Daemon* b = StartDaemon();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const std::vector<uint32_t> p2 = Tokens(50000, kPromptLen);
  Prefill(*b, p2);
  TempDir dir;
  const std::string prompt_file = dir.path() + "/prompt.txt";
  {
    std::ofstream f(prompt_file);
    for (uint32_t t : p2) f << t << (t % 16 == 0 ? "\n" : " ");
  }
  const std::vector<std::string> env = {"KVARN_TARGET", "KVARN_ADMIN_TOKEN_FILE",
                                        "KVARN_TENANT_TOKEN_FILE"};
  const std::vector<std::string> base = {"route",      "--endpoint",    a->target(),
                                         "--endpoint", b->target(),     "--tenant",
                                         kTenant,      "--admin-token", kAdminToken};

  std::vector<std::string> args = base;
  args.insert(args.end(), {"--prompt-file", prompt_file});
  IT_ASSIGN_OR_FAIL(text, RunProcess(KVARN_IT_KVARNCTL, args, env));
  ASSERT_TRUE(WIFEXITED(text.status) && WEXITSTATUS(text.status) == 0) << text.out << text.err;
  // Rank 1 is B with the whole prefix in its pool; A has nothing. A one-shot process has no
  // Watch history (both daemons logged events before it started): Lookup answered.
  const size_t row_b = text.out.find("\n1     " + b->target());
  const size_t row_a = text.out.find("\n2     " + a->target());
  ASSERT_NE(row_b, std::string::npos) << text.out;
  ASSERT_NE(row_a, std::string::npos) << text.out;
  const std::string line_b = text.out.substr(row_b + 1, text.out.find('\n', row_b + 1) - row_b - 1);
  EXPECT_THAT(line_b, HasSubstr(absl::StrCat(" ", kFull, "     ", kFull, "       0       0     ",
                                             kFull, ".0  lookup")))
      << text.out;

  args = base;
  args.insert(args.end(), {"--prompt-file", "-", "--json"});
  IT_ASSIGN_OR_FAIL(json, RunWithInput(KVARN_IT_KVARNCTL, args, "1 2 3\n4 5"));
  EXPECT_TRUE(WIFEXITED(json.first) && WEXITSTATUS(json.first) == 0) << json.second;
  EXPECT_THAT(json.second, HasSubstr("\"prompt_tokens\": 5"));
  EXPECT_THAT(json.second, HasSubstr(absl::StrCat("\"rank\": 1, \"endpoint\": \"", a->target(),
                                                  "\", \"ok\": true")));

  // Bad input: exit 2 with the reason; no endpoint answering: exit 1.
  args = base;
  args.insert(args.end(), {"--prompt-file", dir.path() + "/missing.txt"});
  IT_ASSIGN_OR_FAIL(missing, RunProcess(KVARN_IT_KVARNCTL, args, env));
  EXPECT_EQ(WEXITSTATUS(missing.status), 2);
  EXPECT_THAT(missing.err, HasSubstr("cannot read " + dir.path() + "/missing.txt"));
  args = base;
  args.insert(args.end(), {"--prompt-file", "-"});
  IT_ASSIGN_OR_FAIL(bad, RunWithInput(KVARN_IT_KVARNCTL, args, "12 x7 9"));
  EXPECT_TRUE(WIFEXITED(bad.first) && WEXITSTATUS(bad.first) == 2) << bad.second;
  EXPECT_THAT(bad.second, HasSubstr("word 2 'x7' is not a token id"));
  IT_ASSIGN_OR_FAIL(none,
                    RunProcess(KVARN_IT_KVARNCTL, {"route", "--prompt-file", prompt_file}, env));
  EXPECT_EQ(WEXITSTATUS(none.status), 2);
  EXPECT_THAT(none.err, HasSubstr("--endpoint"));
  IT_ASSIGN_OR_FAIL(down, RunProcess(KVARN_IT_KVARNCTL,
                                     {"route", "--endpoint", "unix:" + dir.path() + "/nobody.sock",
                                      "--prompt-file", prompt_file, "--connect-timeout", "300ms"},
                                     env));
  EXPECT_EQ(WEXITSTATUS(down.status), 1) << down.out << down.err;
  EXPECT_THAT(down.out, HasSubstr("error:"));
}

}  // namespace
}  // namespace kvarn::it
