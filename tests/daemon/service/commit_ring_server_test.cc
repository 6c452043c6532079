// The commit ring server in-process (service_harness.h with rings): records written by hand
// into a ring taken from the descriptor channel (raw_ring.h), against the AppendBatch RPC on
// a twin session. Promises: the same codes and messages as AppendBatch, garbage and a
// rejected commit change nothing, a scribbled tail closes only that ring, a session ending
// mid-batch leaves nothing half-applied, stopping closes every ring with UNAVAILABLE. The
// watch and the thread's placement: commit_ring_watch_test.cc.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "absl/strings/str_replace.h"
#include "client/lib/descriptor_client.h"
#include "common/commit_ring.h"
#include "tests/daemon/service/raw_ring.h"
#include "tests/daemon/service/service_harness.h"

namespace kvarn::testing {
namespace {

using Code = absl::StatusCode;

class CommitRingServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServiceHarness::Options o = ServiceHarness::WithRings();
    o.core.check_commits = true;
    ASSERT_TRUE(h_.Start(o).ok());
  }
  void TearDown() override {
    if (h_.started()) {
      EXPECT_TRUE(h_.core().CheckInvariants().ok()) << h_.core().CheckInvariants();
    }
  }

  // The session's memory (binding it to this process), then its ring.
  absl::StatusOr<RawRing> OpenRing(const v1::SessionRef& ref) {
    auto mem = FetchSessionMemory(h_.descriptor_socket(), ref);
    if (!mem.ok()) return mem.status();
    return RingOnly(ref);
  }
  absl::StatusOr<RawRing> RingOnly(const v1::SessionRef& ref) {
    return TakeRing(h_.descriptor_socket(), ref);
  }

  // The AppendBatch RPC for the same records.
  grpc::Status Batch(const v1::SessionRef& ref, const std::vector<ring::Record>& records,
                     v1::AppendBatchResponse* resp) {
    v1::AppendBatchRequest req;
    *req.mutable_session() = ref;
    for (const ring::Record& r : records) {
      auto* item = req.add_items();
      item->set_sequence_id(r.sequence);
      for (uint32_t i = 0; i < r.tokens; ++i) item->add_token_ids(r.ids[i]);
    }
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    return h_.stub().AppendBatch(&ctx, req, resp);
  }

  ServiceHarness h_;
};

TEST_F(CommitRingServerTest, RingGivesAppendBatchsCodesMessagesAndTables) {
  const auto a_open = h_.Open("a", 4), b_open = h_.Open("b", 4);
  const v1::SessionRef a = ServiceHarness::RefOf(a_open), b = ServiceHarness::RefOf(b_open);
  auto ring = OpenRing(b);
  ASSERT_TRUE(ring.ok()) << ring.status();
  EXPECT_EQ(ring->capacity, 4u);  // the session's 4 tail slots
  std::vector<uint64_t> sa, sb;
  for (int i = 0; i < 3; ++i) {
    sa.push_back(h_.CreateSequence(a));
    sb.push_back(h_.CreateSequence(b));
  }
  // Batches of (sequence index, ids); index 7 is an unknown id, 8 the other session's.
  using Item = std::pair<int, std::vector<uint32_t>>;
  const std::vector<std::vector<Item>> script = {
      {{0, {1}}, {1, {2, 3}}},
      {{0, {}}},                          // 0 tokens
      {{2, TokenIds(10, 28)}, {2, {5}}},  // the second finds the sequence busy
      {{2, TokenIds(40, 28)}, {1, TokenIds(70, 28)}},
      {{2, TokenIds(100, 20)}},           // past the tail: 8 positions left
      {{2, TokenIds(120, 8)}, {0, {9}}},  // fills the tail: a seal (the sink tile)
      {{7, {1}}, {8, {1}}, {1, {4}}},
  };
  const auto id = [](const std::vector<uint64_t>& own, const std::vector<uint64_t>& other,
                     int i) -> uint64_t {
    return i == 7 ? 99999 : i == 8 ? other[0] : own[static_cast<size_t>(i)];
  };
  const auto normalize = [](std::string m, const std::vector<uint64_t>& own,
                            const std::vector<uint64_t>& other) {
    for (size_t i = 0; i < own.size(); ++i)
      m = absl::StrReplaceAll(m,
                              {{absl::StrCat("sequence ", own[i]), absl::StrCat("sequence S", i)}});
    return absl::StrReplaceAll(
        m, {{absl::StrCat("sequence ", other[0]), "sequence F"}, {"sequence 99999", "sequence U"}});
  };
  for (size_t n = 0; n < script.size(); ++n) {
    std::vector<ring::Record> ra, rb;
    for (const Item& it : script[n]) {
      ra.push_back(Rec(id(sa, sb, it.first), it.second));
      rb.push_back(Rec(id(sb, sa, it.first), it.second));
    }
    v1::AppendBatchResponse want;
    ASSERT_TRUE(Batch(a, ra, &want).ok());
    const std::vector<ring::Completion> got = ring->Commit(rb);
    ASSERT_EQ(got.size(), rb.size()) << "batch " << n << ": no completions";
    ASSERT_EQ(want.items_size(), static_cast<int>(got.size()));
    for (size_t i = 0; i < got.size(); ++i) {
      const auto& w = want.items(static_cast<int>(i));
      SCOPED_TRACE(absl::StrCat("batch ", n, " item ", i, ": ", w.message()));
      EXPECT_EQ(got[i].code, w.code());
      EXPECT_EQ(got[i].call, 0u);
      EXPECT_EQ(normalize(Message(got[i]), sb, sa), normalize(w.message(), sa, sb));
      if (w.code() == 0) {
        EXPECT_EQ(got[i].tokens, w.result().table().tokens());
        EXPECT_EQ(got[i].tail_tokens, w.result().table().tail_tokens());
        EXPECT_EQ(got[i].sealed != 0, w.result().sealed());
        EXPECT_EQ(got[i].has_sink != 0, w.result().table().has_sink());
      }
    }
  }
  // The seal happened on both sides, as the sink tile.
  EXPECT_EQ(h_.core().Table(CoreRef(b), sb[2])->has_sink, true);
  // A record of more tokens than a ring record carries: refused by the ring alone.
  ring::Record big = Rec(sb[0], {1});
  big.tokens = ring::kRecordTokens + 1;
  const auto refused = ring->Commit({big});
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0].code, static_cast<int>(Code::kInvalidArgument));
  // The session's own errors are the call's, as AppendBatch's outer status.
  ASSERT_TRUE(h_.CloseSession(a).ok());
  ASSERT_TRUE(h_.CloseSession(b).ok());
  v1::AppendBatchResponse closed;
  const grpc::Status outer = Batch(a, {Rec(sa[0], {1})}, &closed);
  const auto gone = ring->Commit({Rec(sb[0], {1})});
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0].code, static_cast<int>(outer.error_code()));
  EXPECT_EQ(gone[0].call, 1u);
  EXPECT_EQ(absl::StrReplaceAll(Message(gone[0]),
                                {{absl::StrCat("session ", b.session_id()), "session X"}}),
            absl::StrReplaceAll(outer.error_message(),
                                {{absl::StrCat("session ", a.session_id()), "session X"}}));
}

TEST_F(CommitRingServerTest, GarbageRecordsGetErrorsAndChangeNothing) {
  const v1::SessionRef ref = ServiceHarness::RefOf(h_.Open("a", 8));
  auto ring = OpenRing(ref);
  ASSERT_TRUE(ring.ok()) << ring.status();
  const uint64_t seq = h_.CreateSequence(ref);
  ASSERT_TRUE(h_.Commit(ref, seq, {1, 2, 3}).ok());
  std::mt19937_64 rng(7);
  for (int round = 0; round < 50; ++round) {
    std::vector<ring::Record> junk(ring->capacity);
    for (auto& r : junk) {
      auto* w = reinterpret_cast<uint64_t*>(&r);
      for (size_t i = 0; i < sizeof(r) / 8; ++i) w[i] = rng();
    }
    const auto got = ring->Commit(junk);
    ASSERT_EQ(got.size(), junk.size());
    for (const auto& c : got) EXPECT_NE(c.code, 0);
  }
  EXPECT_EQ(h_.core().Table(CoreRef(ref), seq)->tokens, 3u);
  EXPECT_TRUE(h_.core().CheckInvariants().ok());
  const auto ok = ring->Commit({Rec(seq, {4})});
  ASSERT_EQ(ok.size(), 1u);
  EXPECT_EQ(ok[0].code, 0) << Message(ok[0]);
  EXPECT_EQ(ok[0].tokens, 4u);
}

TEST_F(CommitRingServerTest, ATailOutOfBoundsClosesOnlyThatRing) {
  const v1::SessionRef x = ServiceHarness::RefOf(h_.Open("x", 2)),
                       y = ServiceHarness::RefOf(h_.Open("y", 2));
  auto rx = OpenRing(x);
  auto ry = OpenRing(y);
  ASSERT_TRUE(rx.ok() && ry.ok());
  const uint64_t qx = h_.CreateSequence(x), qy = h_.CreateSequence(y);
  rx->h()->tail.store(rx->h()->done.load() + rx->capacity + 1);
  rx->Ring();
  ASSERT_TRUE(WaitFor([&] { return rx->h()->broken.load() != 0; }));
  EXPECT_EQ(rx->h()->broken.load(), static_cast<uint32_t>(Code::kFailedPrecondition));
  EXPECT_NE(std::string(rx->h()->broken_message).find("past the daemon's head"), std::string::npos);
  EXPECT_EQ(h_.rings()->broken(), 1u);
  // The neighbour's ring, and the scribbler's own RPCs, still work.
  const auto got = ry->Commit({Rec(qy, {1})});
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].code, 0);
  EXPECT_TRUE(h_.Commit(x, qx, {1}).ok());
  // Doorbells of a closed ring are not even read.
  for (int i = 0; i < 100; ++i) rx->Ring();
  EXPECT_EQ(ry->Commit({Rec(qy, {2})}).size(), 1u);
}

TEST_F(CommitRingServerTest, RingGoesToTheSessionsProcessOnce) {
  const v1::SessionRef ref = ServiceHarness::RefOf(h_.Open("a", 2));
  EXPECT_EQ(RingOnly(ref).status().code(), Code::kFailedPrecondition);  // memory not lent yet
  v1::SessionRef wrong = ref;
  wrong.set_secret(std::string(wrong.secret().size(), 'x'));
  EXPECT_EQ(OpenRing(wrong).status().code(), Code::kNotFound);
  ASSERT_TRUE(OpenRing(ref).ok());
  EXPECT_EQ(RingOnly(ref).status().code(), Code::kAlreadyExists);
  // An observer session has no tail slots, hence nothing to commit.
  const v1::SessionRef obs = [&] {
    v1::OpenSessionRequest req;
    req.set_tenant("a");
    *req.mutable_layout() = LayoutProto(h_.options().core.model);
    req.set_observer(true);
    req.set_fp16_layout(v1::FP16_LAYOUT_TOKEN_MAJOR);
    v1::OpenSessionResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    EXPECT_TRUE(h_.stub().OpenSession(&ctx, req, &resp).ok());
    return ServiceHarness::RefOf(resp);
  }();
  EXPECT_EQ(OpenRing(obs).status().code(), Code::kFailedPrecondition);
}

TEST(CommitRingServerAbsent, DescriptorChannelWithoutRingsSaysUnimplemented) {
  ServiceHarness h;
  ServiceHarness::Options o;
  o.descriptors = true;
  ASSERT_TRUE(h.Start(o).ok());
  const v1::SessionRef ref = ServiceHarness::RefOf(h.Open("a", 2));
  ASSERT_TRUE(FetchSessionMemory(h.descriptor_socket(), ref).ok());
  EXPECT_EQ(FetchCommitRing(h.descriptor_socket(), ref).status().code(), Code::kUnimplemented);
}

TEST_F(CommitRingServerTest, SessionEndingMidBatchLeavesNothingHalfApplied) {
  for (int round = 0; round < 20; ++round) {
    const v1::SessionRef ref = ServiceHarness::RefOf(h_.Open("a", 4));
    auto ring = OpenRing(ref);
    ASSERT_TRUE(ring.ok()) << ring.status();
    std::vector<uint64_t> seqs;
    for (int i = 0; i < 4; ++i) seqs.push_back(h_.CreateSequence(ref));
    ASSERT_TRUE(h_.Commit(ref, seqs[0], TokenIds(0, 60)).ok());
    // A batch that seals one sequence, published while the session closes.
    const std::vector<ring::Record> batch = {Rec(seqs[0], TokenIds(60, 4)), Rec(seqs[1], {1}),
                                             Rec(seqs[2], {2}), Rec(seqs[3], TokenIds(3, 28))};
    for (size_t i = 0; i < batch.size(); ++i) *ring->record(static_cast<uint32_t>(i)) = batch[i];
    std::thread closer([&] { h_.CloseSession(ref).IgnoreError(); });
    ring->h()->tail.store(static_cast<uint32_t>(batch.size()), std::memory_order_release);
    ring->Ring();
    closer.join();
    // Either the batch ran (completions) or the ring closed with the session.
    ASSERT_TRUE(WaitFor(
        [&] { return ring->h()->done.load() == batch.size() || ring->h()->broken.load() != 0; }));
    ASSERT_TRUE(h_.core().CheckInvariants().ok()) << h_.core().CheckInvariants();
  }
  const auto stats = h_.core().Stats(std::nullopt);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->sequences, 0u);
  EXPECT_EQ(stats->quant_active + stats->sink_active, 0u);
  EXPECT_TRUE(WaitFor([&] { return h_.rings()->rings() == 0; }))
      << "the rings of ended sessions are dropped";
}

TEST_F(CommitRingServerTest, StopClosesRingsWithUnavailable) {
  const v1::SessionRef ref = ServiceHarness::RefOf(h_.Open("a", 2));
  auto ring = OpenRing(ref);
  ASSERT_TRUE(ring.ok());
  h_.rings()->Stop();
  EXPECT_EQ(ring->h()->broken.load(), static_cast<uint32_t>(Code::kUnavailable));
  EXPECT_EQ(RingOnly(ref).status().code(), Code::kUnavailable);
}

}  // namespace
}  // namespace kvarn::testing
