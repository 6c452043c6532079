// Sessions and leases, on a fake clock.
#include <gtest/gtest.h>

#include "tests/daemon/core/core_fixture.h"

namespace kvarn::testing {
namespace {

class LeaseTest : public CoreTest {
 protected:
  void SetUp() override {
    CoreConfig c;
    c.keepalive_interval = absl::Seconds(1);
    c.lease_ttl = absl::Seconds(10);
    c.grace = absl::Seconds(2);
    MakeCore(8, 8, SmallModel(), c);
  }
  uint32_t ActiveBlocks() {
    auto st = core_->Stats(std::nullopt);
    return st->quant_active + st->sink_active;
  }
};

TEST_F(LeaseTest, BrokenStreamReleasesSequencesAfterGrace) {
  SessionRef s = Open("a");
  ASSERT_TRUE(core_->AttachStream(s).ok());
  auto q = core_->CreateSequence(s, std::vector<uint32_t>{});
  AppendAll(s, q->sequence, Tokens(0, 3 * 64), 0);
  EXPECT_EQ(ActiveBlocks(), 3u);
  core_->DetachStream(s.session);
  clock_.Advance(absl::Milliseconds(1999));
  EXPECT_EQ(core_->ExpireSessions(), 0);
  EXPECT_EQ(ActiveBlocks(), 3u);
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_EQ(core_->ExpireSessions(), 1);
  EXPECT_EQ(ActiveBlocks(), 0u);
  auto st = core_->Stats(std::nullopt);
  EXPECT_EQ(st->sessions, 0u);
  EXPECT_EQ(st->sequences, 0u);
  EXPECT_EQ(st->tail_slots_reserved, 0u);
  EXPECT_EQ(st->quant_cached, 2u);  // sealed blocks stay cached for later prefix hits
  EXPECT_EQ(core_->KeepAlive(s).code(), absl::StatusCode::kNotFound);
}

TEST_F(LeaseTest, ReconnectWithinGraceKeepsTheSession) {
  SessionRef s = Open("a");
  ASSERT_TRUE(core_->AttachStream(s).ok());
  auto q = core_->CreateSequence(s, std::vector<uint32_t>{});
  core_->DetachStream(s.session);
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(core_->AttachStream(s).ok());
  clock_.Advance(absl::Seconds(5));
  ASSERT_TRUE(core_->KeepAlive(s).ok());
  EXPECT_EQ(core_->ExpireSessions(), 0);
  EXPECT_TRUE(core_->Table(s, q->sequence).ok());
}

TEST_F(LeaseTest, SilentSessionExpiresAfterTtlEvenWithStreamOpen) {
  SessionRef s = Open("a");
  ASSERT_TRUE(core_->AttachStream(s).ok());
  auto q = core_->CreateSequence(s, std::vector<uint32_t>{});
  clock_.Advance(absl::Seconds(9));
  ASSERT_TRUE(core_->KeepAlive(s).ok());  // heartbeat resets the TTL
  clock_.Advance(absl::Seconds(9));
  EXPECT_EQ(core_->ExpireSessions(), 0);
  clock_.Advance(absl::Seconds(1));  // 10 s of silence: a hung (SIGSTOPped) client
  EXPECT_EQ(core_->ExpireSessions(), 1);
  // Its later calls are all rejected.
  EXPECT_EQ(core_->Append(s, q->sequence, std::vector<uint32_t>{1}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->CreateSequence(s, std::vector<uint32_t>{}).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(LeaseTest, SessionThatNeverStreamsExpiresByTtl) {
  SessionRef s = Open("a");
  clock_.Advance(absl::Seconds(10));
  EXPECT_EQ(core_->ExpireSessions(), 1);
  EXPECT_EQ(core_->KeepAlive(s).code(), absl::StatusCode::kNotFound);
}

TEST_F(LeaseTest, CloseSessionReleasesEverythingAtOnce) {
  SessionRef s = Open("a", 3);
  for (int i = 0; i < 3; ++i) {
    auto q = core_->CreateSequence(s, std::vector<uint32_t>{});
    AppendAll(s, q->sequence, Tokens(100 * i, 100), 0);
  }
  auto n = core_->CloseSession(s);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 3u);
  EXPECT_EQ(ActiveBlocks(), 0u);
  EXPECT_EQ(core_->CloseSession(s).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(LeaseTest, OtherSessionsSurviveOneExpiring) {
  SessionRef a = Open("a");
  SessionRef b = Open("b");
  ASSERT_TRUE(core_->AttachStream(a).ok());
  ASSERT_TRUE(core_->AttachStream(b).ok());
  auto qb = core_->CreateSequence(b, std::vector<uint32_t>{});
  AppendAll(b, qb->sequence, Tokens(0, 70), 0);
  core_->DetachStream(a.session);
  clock_.Advance(absl::Seconds(3));
  ASSERT_TRUE(core_->KeepAlive(b).ok());
  EXPECT_EQ(core_->ExpireSessions(), 1);
  EXPECT_EQ(core_->Table(b, qb->sequence)->tokens, 70u);
}

}  // namespace
}  // namespace kvarn::testing
