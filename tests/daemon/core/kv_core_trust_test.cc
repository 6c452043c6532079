// Credentials, leases that reads cannot bend, authenticated tenants, quotas and caps.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "daemon/core/tenants.h"
#include "tests/daemon/core/core_fixture.h"

namespace kvarn::testing {
namespace {

using ::testing::HasSubstr;

std::string TokenLine(const std::string& name, const std::string& token, const std::string& extra = "") {
  const TokenHash h = HashToken(token);
  std::string hex;
  static const char* d = "0123456789abcdef";
  for (uint8_t b : h) {
    hex += d[b >> 4];
    hex += d[b & 15];
  }
  return name + " token_sha256=" + hex + (extra.empty() ? "" : " " + extra) + "\n";
}

TEST_F(CoreTest, IdsWithoutTheSecretGrantNothing) {
  MakeCore(8, 8);
  SessionRef a = Open("alice");
  auto q = core_->CreateSequence(a, Tokens(0, 3 * 64 + 1));
  ASSERT_TRUE(q.ok());
  AppendAll(a, q->sequence, Tokens(0, 3 * 64 + 1), 0);
  SessionRef forged = a;
  forged.secret[7] ^= 1;
  const SessionRef unknown{a.session + 100, a.epoch, a.secret};
  const std::string unknown_msg(core_->KeepAlive(unknown).message());
  // Every call answers a wrong secret exactly as an unknown session.
  EXPECT_EQ(core_->KeepAlive(forged).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->KeepAlive(forged).message(), absl::StrCat("no session ", a.session));
  EXPECT_THAT(unknown_msg, HasSubstr("no session"));
  EXPECT_EQ(core_->AttachStream(forged).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->CloseSession(forged).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->CreateSequence(forged, Tokens(0, 3 * 64 + 1)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->Lookup(forged, Tokens(0, 3 * 64 + 1)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->Append(forged, q->sequence, Tokens(9, 1)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->Fork(forged, q->sequence).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->Release(forged, std::vector<SequenceId>{q->sequence}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->Table(forged, q->sequence).status().code(), absl::StatusCode::kNotFound);
  std::vector<float> k(64 * 2 * 64), v(k.size());
  EXPECT_EQ(core_->Read(forged, q->sequence, 0, 0, 1, k.data(), v.data()).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->Evict(forged, EvictScope::kTenant, 0, "").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->Stats(forged).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->ListSequences(forged).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->AcquireWatcher(forged).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->LendMemory(forged, 1234).status().code(), absl::StatusCode::kNotFound);
  auto batch = core_->AppendBatch(forged, {});
  EXPECT_EQ(batch.status().code(), absl::StatusCode::kNotFound);
  // Nothing changed for the owner.
  EXPECT_EQ(core_->Table(a, q->sequence)->tokens, 3u * 64 + 1);
  EXPECT_TRUE(core_->KeepAlive(a).ok());
}

TEST_F(CoreTest, SecretsAreDistinctAndUnpredictablePerSession) {
  MakeCore(8, 8);
  SessionRef a = Open("a"), b = Open("a");
  EXPECT_NE(a.secret, b.secret);
  EXPECT_NE(a.secret, SessionSecret{});
}

class ReadsDoNotRenewTest : public CoreTest {
 protected:
  void SetUp() override {
    CoreConfig c;
    c.keepalive_interval = absl::Seconds(1);
    c.lease_ttl = absl::Seconds(10);
    MakeCore(8, 8, SmallModel(), c);
  }
};

TEST_F(ReadsDoNotRenewTest, StatsListLookupTableReadAndWatchLeaveTheLeaseAlone) {
  SessionRef s = Open("a");
  auto q = core_->CreateSequence(s, std::vector<uint32_t>{});
  AppendAll(s, q->sequence, Tokens(0, 70), 0);
  auto w = core_->AcquireWatcher(s);
  ASSERT_TRUE(w.ok());
  std::vector<float> k(2 * 64), v(k.size());
  for (int second = 0; second < 10; ++second) {
    clock_.Advance(absl::Seconds(1));
    ASSERT_TRUE(core_->Stats(s).ok());
    ASSERT_TRUE(core_->ListSequences(s).ok());
    ASSERT_TRUE(core_->Lookup(s, Tokens(0, 70)).ok());
    ASSERT_TRUE(core_->Table(s, q->sequence).ok());
    ASSERT_TRUE(core_->Read(s, q->sequence, 0, 0, 1, k.data(), v.data()).ok());
    ASSERT_TRUE(core_->CheckSession(s).ok());
    if (second < 9) {
      ASSERT_EQ(core_->ExpireSessions(), 0);
    }
  }
  EXPECT_EQ(core_->ExpireSessions(), 1) << "ten seconds of reads only: the lease ran out";
  EXPECT_EQ(core_->CheckSession(s).code(), absl::StatusCode::kNotFound);
  core_->ReleaseWatcher(s.session);  // the stream notices and lets go: a no-op by now
}

TEST_F(ReadsDoNotRenewTest, MutatingCallsRenew) {
  SessionRef s = Open("a", 3);
  auto q = core_->CreateSequence(s, std::vector<uint32_t>{});
  for (int i = 0; i < 5; ++i) {
    clock_.Advance(absl::Seconds(9));
    std::vector<float> k = Kv(1, i), v = Kv(1, i + 1);
    ASSERT_TRUE(core_->AppendInline(s, q->sequence, Tokens(i, 1), k.data(), v.data(), DType::kF32).ok());
    ASSERT_EQ(core_->ExpireSessions(), 0);
  }
  clock_.Advance(absl::Seconds(9));
  ASSERT_TRUE(core_->Fork(s, q->sequence).ok());
  clock_.Advance(absl::Seconds(9));
  ASSERT_TRUE(core_->CreateSequence(s, {}).ok());
  clock_.Advance(absl::Seconds(9));
  EXPECT_EQ(core_->ExpireSessions(), 0);
}

class TenantsTest : public CoreTest {
 protected:
  void Configure(const std::string& text) {
    auto specs = ParseTenants(text);
    ASSERT_TRUE(specs.ok()) << specs.status();
    ASSERT_TRUE(core_->ConfigureTenants(*specs).ok());
  }
};

TEST_F(TenantsTest, ParserRejectsWhatItCannotUnderstand) {
  EXPECT_TRUE(ParseTenants("# nothing\n\n").ok());
  EXPECT_EQ(ParseTenants("a\n").status().code(), absl::StatusCode::kInvalidArgument);  // no token
  EXPECT_THAT(ParseTenants("a token_sha256=abc\n").status().message(), HasSubstr("line 1"));
  const std::string ok = TokenLine("a", "t");
  EXPECT_TRUE(ParseTenants(ok).ok());
  EXPECT_THAT(ParseTenants(ok + ok).status().message(), HasSubstr("listed twice"));
  EXPECT_THAT(ParseTenants(TokenLine("a", "t", "colour=blue")).status().message(), HasSubstr("unknown key"));
  EXPECT_THAT(ParseTenants(TokenLine("a", "t", "cache=lots")).status().message(), HasSubstr("bad value for cache"));
  EXPECT_THAT(ParseTenants(TokenLine("a/b", "t")).status().message(), HasSubstr("tenant name"));
  auto full = ParseTenants(TokenLine("a", "t", "sessions=3 tail_slots=5 cache=1MiB watchers=2 group=g  # trailing"));
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ((*full)[0].max_sessions, 3u);
  EXPECT_EQ((*full)[0].max_tail_slots, 5u);
  EXPECT_EQ((*full)[0].max_cache_bytes, 1u << 20);
  EXPECT_EQ((*full)[0].max_watchers, 2u);
  EXPECT_EQ((*full)[0].group, "g");
}

TEST_F(TenantsTest, ConfiguredTenantsMustPresentTheirToken) {
  MakeCore(8, 8);
  Configure(TokenLine("alice", "a-token") + TokenLine("bob", "b-token"));
  OpenParams p;
  p.layout = model_;
  p.tenant = "alice";
  p.tenant_token = "b-token";
  auto wrong = core_->OpenSession(p);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kUnauthenticated);
  p.tenant = "mallory";
  p.tenant_token = "a-token";
  auto unknown = core_->OpenSession(p);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(wrong.status().message(), unknown.status().message()) << "which part was wrong is not said";
  p.tenant = "alice";
  p.tenant_token = "a-token";
  EXPECT_TRUE(core_->OpenSession(p).ok());
  EXPECT_EQ(core_->Stats(std::nullopt)->sessions, 1u);
}

TEST_F(TenantsTest, PrefixesAreSharedOnlyWithinAGroup) {
  MakeCore(8, 8);
  Configure(TokenLine("a", "ta", "group=team") + TokenLine("b", "tb", "group=team") + TokenLine("c", "tc"));
  SessionRef a = Open("a", 2, "ta"), b = Open("b", 2, "tb"), c = Open("c", 2, "tc");
  const std::vector<uint32_t> prompt = Tokens(3, 2 * 64 + 1);
  auto q = core_->CreateSequence(a, prompt);
  AppendAll(a, q->sequence, prompt, 0);
  EXPECT_EQ(core_->Lookup(b, prompt).value().total_tokens(), 128u);
  EXPECT_EQ(core_->Lookup(c, prompt).value().total_tokens(), 0u);
}

TEST_F(TenantsTest, ReloadEndsSessionsOfRevokedTenantsOnly) {
  MakeCore(8, 8);
  Configure(TokenLine("a", "ta") + TokenLine("b", "tb") + TokenLine("c", "tc"));
  SessionRef a = Open("a", 2, "ta"), b = Open("b", 2, "tb"), c = Open("c", 2, "tc");
  auto qa = core_->CreateSequence(a, {});
  AppendAll(a, qa->sequence, Tokens(0, 100), 0);
  // b's token rotates, c is removed, a stays.
  Configure(TokenLine("a", "ta") + TokenLine("b", "tb2"));
  EXPECT_TRUE(core_->KeepAlive(a).ok());
  EXPECT_EQ(core_->KeepAlive(b).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->KeepAlive(c).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->Table(a, qa->sequence)->tokens, 100u);
  OpenParams p;
  p.layout = model_;
  p.tenant = "b";
  p.tenant_token = "tb";
  EXPECT_EQ(core_->OpenSession(p).status().code(), absl::StatusCode::kUnauthenticated);
  p.tenant_token = "tb2";
  EXPECT_TRUE(core_->OpenSession(p).ok());
  p.tenant = "c";
  p.tenant_token = "tc";
  EXPECT_EQ(core_->OpenSession(p).status().code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(TenantsTest, SessionAndTailSlotQuotasProtectOtherTenants) {
  MakeCore(8, 8, SmallModel(), CoreConfig(), /*tail_slots=*/16);
  Configure(TokenLine("hog", "th", "sessions=3 tail_slots=8") + TokenLine("meek", "tm"));
  OpenParams p;
  p.layout = model_;
  p.tenant = "hog";
  p.tenant_token = "th";
  p.max_sequences = 4;
  ASSERT_TRUE(core_->OpenSession(p).ok());
  ASSERT_TRUE(core_->OpenSession(p).ok());
  auto over = core_->OpenSession(p);  // 12 > 8 slots
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.status().message(), HasSubstr("tail_slots quota"));
  p.max_sequences = 0;
  p.observer = true;
  ASSERT_TRUE(core_->OpenSession(p).ok());  // third session, no slots
  auto fourth = core_->OpenSession(p);
  EXPECT_THAT(fourth.status().message(), HasSubstr("sessions quota"));
  // The other tenant's default share (16 / 2) is untouched.
  p.tenant = "meek";
  p.tenant_token = "tm";
  p.observer = false;
  p.max_sequences = 8;
  EXPECT_TRUE(core_->OpenSession(p).ok());
  const std::vector<TenantReport> reports = core_->TenantReports();
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[0].name, "hog");
  EXPECT_EQ(reports[0].usage.tail_slots, 8u);
  EXPECT_EQ(reports[0].usage.rejected[static_cast<int>(QuotaLimit::kTailSlots)], 1u);
  EXPECT_EQ(reports[0].usage.rejected[static_cast<int>(QuotaLimit::kSessions)], 1u);
  EXPECT_EQ(reports[1].quota.max_tail_slots, 8u);
}

TEST_F(TenantsTest, CacheQuotaEvictsTheTenantsOwnBlocksThenRefuses) {
  MakeCore(16, 8);
  // Room for the sink and two quantized blocks of this model.
  Configure(TokenLine("t", "tt", absl::StrCat("cache=", fbytes_ + 2 * qbytes_, "B")) + TokenLine("u", "tu"));
  SessionRef t = Open("t", 2, "tt"), u = Open("u", 2, "tu");
  auto other = core_->CreateSequence(u, {});
  AppendAll(u, other->sequence, Tokens(50000, 2 * 64), 0);
  auto a = core_->CreateSequence(t, {});
  AppendAll(t, a->sequence, Tokens(0, 3 * 64), 0);  // sink + 2 quantized: at the quota
  ASSERT_TRUE(core_->Release(t, std::vector<SequenceId>{a->sequence}).ok());
  // A new chain: its sink needs room; t's own cached blocks go, not u's.
  auto b = core_->CreateSequence(t, {});
  AppendAll(t, b->sequence, Tokens(1000, 2 * 64), 0);
  auto st = core_->Stats(std::nullopt);
  EXPECT_GE(st->evictions[static_cast<int>(EvictReason::kQuota)], 2u);
  EXPECT_EQ(core_->Table(u, other->sequence)->quant_blocks.size(), 1u);
  // Holding sink + 1 quantized, one more seal fits; then the quota refuses (nothing of t's is cached).
  std::vector<float> k = Kv(64, 3), v = Kv(64, 4);
  ASSERT_TRUE(core_->AppendInline(t, b->sequence, Tokens(2000, 64), k.data(), v.data(), DType::kF32).ok());
  auto refused = core_->AppendInline(t, b->sequence, Tokens(3000, 64), k.data(), v.data(), DType::kF32);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("cache quota"));
  EXPECT_EQ(core_->Table(t, b->sequence)->tokens, 3u * 64) << "a refused append changes nothing";
}

TEST_F(TenantsTest, WatchersAndObserversAreCapped) {
  CoreConfig c;
  c.max_watchers = 3;
  c.max_observer_sessions = 2;
  MakeCore(8, 8, SmallModel(), c);
  Configure(TokenLine("a", "ta", "watchers=2") + TokenLine("b", "tb"));
  SessionRef a = Open("a", 1, "ta"), b = Open("b", 1, "tb");
  ASSERT_TRUE(core_->AcquireWatcher(a).ok());
  ASSERT_TRUE(core_->AcquireWatcher(a).ok());
  auto third = core_->AcquireWatcher(a);
  EXPECT_THAT(third.status().message(), HasSubstr("watchers quota"));
  ASSERT_TRUE(core_->AcquireWatcher(b).ok());
  auto cap = core_->AcquireWatcher(b);
  EXPECT_THAT(cap.status().message(), HasSubstr("max_watchers"));
  core_->ReleaseWatcher(a.session);
  EXPECT_TRUE(core_->AcquireWatcher(b).ok());
  ASSERT_TRUE(core_->CloseSession(a).ok());  // its last grant goes with it
  EXPECT_TRUE(core_->AcquireWatcher(b).ok());
  OpenParams p;
  p.layout = model_;
  p.tenant = "b";
  p.tenant_token = "tb";
  p.observer = true;
  ASSERT_TRUE(core_->OpenSession(p).ok());
  ASSERT_TRUE(core_->OpenSession(p).ok());
  auto o = core_->OpenSession(p);
  EXPECT_THAT(o.status().message(), HasSubstr("max_observer_sessions"));
}

TEST_F(CoreTest, MemoryIsLentToOneProcessOnly) {
  MakeCore(8, 8);
  SessionRef s = Open("a");
  auto first = core_->LendMemory(s, 4242);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->size(), 3u);
  EXPECT_EQ((*first)[0].kind, RegionKind::kQuant);
  EXPECT_FALSE((*first)[0].writable);
  EXPECT_EQ((*first)[1].kind, RegionKind::kSink);
  EXPECT_FALSE((*first)[1].writable);
  EXPECT_EQ((*first)[2].kind, RegionKind::kTail);
  EXPECT_TRUE((*first)[2].writable);
  EXPECT_TRUE(core_->LendMemory(s, 4242).ok()) << "the same process may ask again";
  EXPECT_EQ(core_->LendMemory(s, 4243).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(core_->LendMemory(s, 0).status().code(), absl::StatusCode::kPermissionDenied)
      << "bound to a visible process: a foreign peer is another process";
}

// A peer in another PID namespace (pid 0): lent to by a backend that needs no importer pid,
// bound as the one foreign peer; refused, naming the fix, by one that does (CUDA).
TEST_F(CoreTest, APeerWithoutAPidIsLentToOnlyByBackendsThatNeedNone) {
  MakeCore(8, 8);
  SessionRef s = Open("a");
  ASSERT_TRUE(core_->LendMemory(s, 0).ok());
  EXPECT_TRUE(core_->LendMemory(s, 0).ok());
  EXPECT_EQ(core_->LendMemory(s, 4242).status().code(), absl::StatusCode::kPermissionDenied);
  backend_.needs_importer_pid = true;
  SessionRef t = Open("b");
  auto refused = core_->LendMemory(t, 0);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.status().message(), HasSubstr("another PID namespace"));
  EXPECT_THAT(refused.status().message(), HasSubstr("shareProcessNamespace"));
  EXPECT_TRUE(core_->LendMemory(t, 4242).ok()) << "refused without binding the session";
}

}  // namespace
}  // namespace kvarn::testing
