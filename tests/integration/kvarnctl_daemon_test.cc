// kvarnctl's daemon commands against a live kvarnd: demo, status, sequences, evict, watch.
#include <atomic>
#include <sys/wait.h>

#include <thread>

#include "tests/integration/fixture.h"

namespace kvarn::it {
namespace {

using ::testing::HasSubstr;

class KvarnctlTest : public IntegrationTest {
 protected:
  // Runs kvarnctl; returns (exit code, output).
  std::pair<int, std::string> Ctl(std::vector<std::string> args) {
    auto r = RunWithInput(KVARN_IT_KVARNCTL, args, "");
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {-1, ""};
    const int code = WIFEXITED(r->first) ? WEXITSTATUS(r->first) : -1;
    return {code, r->second};
  }
};

TEST_F(KvarnctlTest, DemoSharesSystemPromptsAndStatusReportsIt) {
  Daemon* d = StartDaemon();
  ASSERT_NE(d, nullptr);
  const std::string target = "--target=" + d->target();
  auto [code, out] = Ctl({"demo", target, "--workers", "2", "--requests", "3", "--system-tokens", "128", "--user-min",
                          "10", "--user-max", "40", "--decode-tokens", "20"});
  ASSERT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("requests          6 in"));
  EXPECT_THAT(out, HasSubstr("prefix hit rate"));
  EXPECT_THAT(out, HasSubstr("x smaller"));
  // Every request after each worker's first reuses the shared system prompt's tiles (at least one).
  EXPECT_THAT(out, ::testing::Not(HasSubstr("prefix hit rate   0.0%")));
  std::tie(code, out) = Ctl({"status", target});
  ASSERT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("capacity"));
  EXPECT_THAT(out, HasSubstr("quantized"));
  EXPECT_THAT(out, ::testing::ContainsRegex("prefix cache  [1-9][0-9]* of [0-9]+ prompt tokens hit"));
  EXPECT_THAT(out, HasSubstr("0 sequences"));
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

  // Watch in the background while this session seals a sink and a quantized tile per
  // sequence, until the watcher has its two events (its stream may start after the first
  // sequence): any two consecutive events are one sink and one quantized block.
  std::pair<int, std::string> watched;
  std::atomic<bool> done{false};
  std::thread watcher([&] {
    watched = Ctl({"watch", target, "--admin-token", kAdminToken, "--count", "2"});
    done.store(true);
  });
  const std::vector<uint32_t> ids = Tokens(1, 2 * 64);
  IT_ASSERT_OK(AppendTokens(*s, q.id, ids, 0, ids.size()).status());
  for (uint32_t i = 1; !done.load() && i < 200; ++i) {
    const std::vector<uint32_t> more = Tokens(1000 * i, 2 * 64);
    IT_ASSIGN_OR_FAIL(extra, s->CreateSequence({}));
    IT_ASSERT_OK(AppendTokens(*s, extra.id, more, 0, more.size()).status());
    const uint64_t gone[] = {extra.id};
    IT_ASSERT_OK(s->Release(gone));
    for (const double t0 = NowMs(); !done.load() && NowMs() - t0 < 100;) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  watcher.join();
  EXPECT_EQ(watched.first, 0) << watched.second;
  EXPECT_THAT(watched.second, HasSubstr("stored  sink  block"));
  EXPECT_THAT(watched.second, HasSubstr("stored  quant block"));
  EXPECT_THAT(watched.second, HasSubstr("tenant team-w"));

  auto [code, out] = Ctl({"sequences", target, "--tenant", "team-w"});
  ASSERT_EQ(code, 0) << out;
  EXPECT_THAT(out, ::testing::ContainsRegex(std::to_string(q.id) + " +[0-9]+ +team-w +128 +yes +1 +0"));
  std::tie(code, out) = Ctl({"sequences", target, "--tenant", "someone-else"});
  EXPECT_THAT(out, HasSubstr("0 sequences"));

  const uint64_t release[] = {q.id};
  IT_ASSERT_OK(s->Release(release));
  std::tie(code, out) = Ctl({"evict", target, "--all"});
  EXPECT_NE(code, 0);
  EXPECT_THAT(out, HasSubstr("admin token"));
  IT_ASSIGN_OR_FAIL(st, s->Stats());
  const uint32_t cached = st.quant_blocks_cached() + st.sink_blocks_cached();
  EXPECT_GE(cached, 2u);
  std::tie(code, out) = Ctl({"evict", target, "--all", "--admin-token", kAdminToken});
  ASSERT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("evicted ", cached, " blocks")));
}

TEST_F(KvarnctlTest, UnreachableDaemonIsAClearFailure) {
  auto [code, out] = Ctl({"status", "--target=unix:/nonexistent/kvarnd.sock"});
  EXPECT_EQ(code, 1);
  EXPECT_THAT(out, HasSubstr("not reachable"));
}

}  // namespace
}  // namespace kvarn::it
