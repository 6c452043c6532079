// kvarn::CommitRing (client/lib/commit_ring.h) against an in-process daemon serving rings:
// the ring commits the same state as CommitBatch, gives its errors with the same codes and
// messages, refuses what it cannot carry before writing anything, and stops once the session
// or the ring is gone; its commits tell the daemon which CPU they come from.
#include "client/lib/commit_ring.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/lib/client.h"
#include "kernels/fp16.h"
#include "tests/client/lib/in_process_daemon.h"
#include "tests/common/wait_for.h"

namespace kvarn::testing {
namespace {

using Code = absl::StatusCode;
using Items = std::vector<std::pair<uint64_t, std::vector<uint32_t>>>;

class CommitRingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    h_ = std::make_unique<InProcessDaemon>();
    ASSERT_TRUE(h_->Start({}).ok());
    auto c = Client::Connect(h_->target(), {}, absl::Seconds(10));
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
  }
  void TearDown() override {
    sessions_.clear();
    client_.reset();
    others_.clear();
    EXPECT_TRUE(h_->CheckInvariants().ok()) << h_->CheckInvariants();
  }
  // A session of the fixture's client, or of a client of its own with `options` (and no
  // mapped pool unless `map`).
  Session* Open(const std::string& tenant, uint32_t slots = 4, bool map = true,
                const ClientOptions* options = nullptr) {
    Client* c = client_.get();
    if (!map || options != nullptr) {
      ClientOptions o = options != nullptr ? *options : ClientOptions{};
      o.map_pool = map;
      auto other = Client::Connect(h_->target(), o, absl::Seconds(10));
      EXPECT_TRUE(other.ok());
      others_.push_back(std::move(*other));
      c = others_.back().get();
    }
    auto d = c->Describe();
    EXPECT_TRUE(d.ok());
    SessionOptions o;
    o.tenant = tenant;
    o.layout = Client::LayoutOf(*d);
    o.max_sequences = slots;
    auto s = c->OpenSession(o);
    EXPECT_TRUE(s.ok()) << s.status();
    sessions_.push_back(std::move(*s));
    return sessions_.back().get();
  }
  std::vector<uint64_t> Sequences(Session* s, int n) {
    std::vector<uint64_t> out;
    for (int i = 0; i < n; ++i) out.push_back(s->CreateSequence({})->id);
    return out;
  }

  // s's ring and one new sequence with one token staged (a null ring on failure).
  std::pair<std::unique_ptr<CommitRing>, uint64_t> RingWithOneStagedToken(Session* s) {
    auto ring = s->OpenCommitRing();
    EXPECT_TRUE(ring.ok()) << ring.status();
    if (!ring.ok()) return {};
    const uint64_t q = Sequences(s, 1)[0];
    const std::vector<float> kv = TestKv(1, 3);
    EXPECT_TRUE(s->Stage(q, 1, kv.data(), kv.data(), DType::kF32).ok());
    return {std::move(*ring), q};
  }

  void SameStateAsCommitBatch(bool pipelined);

  // q's last ring commit has an unknown outcome: every call that would touch q (Publish too,
  // when `ring` is still usable), CommitBatch included, is FAILED_PRECONDITION naming it and
  // changes nothing in kvarnd; Release frees q.
  void ExpectUnknownUntilRelease(Session* s, CommitRing* ring, bool ring_usable, uint64_t q) {
    const absl::StatusOr<uint64_t> before = h_->SequenceTokens(s->Ref(), q);
    ASSERT_TRUE(before.ok()) << before.status();
    const std::vector<float> kv = TestKv(1, 8);
    const auto unknown = [&](const absl::Status& st, const char* what) {
      EXPECT_EQ(st.code(), Code::kFailedPrecondition) << what << ": " << st;
      EXPECT_NE(st.message().find("unknown outcome"), std::string::npos) << what << ": " << st;
    };
    unknown(s->Stage(q, 1, kv.data(), kv.data(), DType::kF32), "Stage");
    unknown(s->MarkStaged(q, 1), "MarkStaged");
    unknown(s->TailSlot(q).status(), "TailSlot");
    unknown(s->Commit(q, std::vector<uint32_t>{1}).status(), "Commit");
    unknown(s->AppendInline(q, std::vector<uint32_t>{1}, kv.data(), kv.data(), DType::kF32).status(),
            "AppendInline");
    unknown(s->Fork(q).status(), "Fork");
    if (ring_usable) unknown(ring->Publish(q, std::vector<uint32_t>{1}), "Publish");
    auto batch = s->CommitBatch({{q, {1}}});
    ASSERT_TRUE(batch.ok()) << batch.status();
    unknown((*batch)[0].status(), "CommitBatch");
    EXPECT_EQ(*h_->SequenceTokens(s->Ref(), q), *before) << "CommitBatch appended nothing";
    ASSERT_TRUE(s->Release(std::vector<uint64_t>{q}).ok());
    EXPECT_EQ(s->Table(q).status().code(), Code::kNotFound);
  }

  std::unique_ptr<InProcessDaemon> h_;
  std::unique_ptr<Client> client_;
  std::vector<std::unique_ptr<Client>> others_;  // clients of their own options (Open)
  std::vector<std::unique_ptr<Session>> sessions_;
};

// Two tenants (so no block is shared between them) append the same K/V, one by CommitBatch,
// one by its ring (Commit, or Publish after each Stage and Collect when `pipelined`), in steps
// of 1 and 3 tokens over two tiles and a part: every result, every sealed block's bytes and
// every Read agree.
void CommitRingTest::SameStateAsCommitBatch(bool pipelined) {
  Session* a = Open("tenant-a");
  Session* b = Open("tenant-b");
  auto ring = b->OpenCommitRing();
  ASSERT_TRUE(ring.ok()) << ring.status();
  const std::vector<uint64_t> qa = Sequences(a, 3), qb = Sequences(b, 3);
  const int g = a->block_layout().tile_tokens;
  uint32_t token = 0;
  for (int step = 0; token < static_cast<uint32_t>(2 * g + 20); ++step) {
    Items ia, ib;
    for (size_t i = 0; i < qa.size(); ++i) {
      // Sequence 1 commits 3 tokens a step where its tail has room, the others 1.
      const int room = g - static_cast<int>(a->Table(qa[i])->tail_tokens);
      const int n = (i == 1 && room >= 3) ? 3 : 1;
      const std::vector<float> kv = TestKv(n, 1000 * step + static_cast<uint32_t>(i));
      const std::vector<uint32_t> ids = TestTokenIds(token, n);
      ASSERT_TRUE(a->Stage(qa[i], n, kv.data(), kv.data(), DType::kF32).ok());
      ASSERT_TRUE(b->Stage(qb[i], n, kv.data(), kv.data(), DType::kF32).ok());
      if (pipelined) {
        ASSERT_TRUE((*ring)->Publish(qb[i], ids).ok());
      }
      ia.push_back({qa[i], ids});
      ib.push_back({qb[i], ids});
    }
    token += 1;
    auto ra = a->CommitBatch(ia);
    auto rb = pipelined ? (*ring)->Collect() : (*ring)->Commit(ib);
    ASSERT_TRUE(ra.ok() && rb.ok()) << ra.status() << " " << rb.status();
    for (size_t i = 0; i < qa.size(); ++i) {
      ASSERT_TRUE((*ra)[i].ok() && (*rb)[i].ok()) << (*ra)[i].status() << " " << (*rb)[i].status();
      EXPECT_EQ((*ra)[i]->sealed, (*rb)[i]->sealed);
      EXPECT_EQ((*ra)[i]->table.tokens, (*rb)[i]->table.tokens);
      EXPECT_EQ((*ra)[i]->table.tail_tokens, (*rb)[i]->table.tail_tokens);
      EXPECT_EQ((*ra)[i]->table.quant_blocks.size(), (*rb)[i]->table.quant_blocks.size());
      EXPECT_EQ((*ra)[i]->table.has_sink, (*rb)[i]->table.has_sink);
    }
  }
  const BlockLayout& l = a->block_layout();
  for (size_t i = 0; i < qa.size(); ++i) {
    const SequenceTable ta = *a->Table(qa[i]), tb = *b->Table(qb[i]);
    ASSERT_EQ(ta.quant_blocks.size(), tb.quant_blocks.size());
    ASSERT_GE(ta.quant_blocks.size(), 1u);
    for (size_t k = 0; k < ta.quant_blocks.size(); ++k) {
      EXPECT_NE(ta.quant_blocks[k], tb.quant_blocks[k]) << "tenants share no blocks";
      EXPECT_EQ(std::memcmp(a->QuantBlock(ta.quant_blocks[k]), b->QuantBlock(tb.quant_blocks[k]), l.quant_block_bytes()), 0)
          << "sequence " << i << " block " << k;
    }
    ASSERT_TRUE(ta.has_sink && tb.has_sink);
    EXPECT_EQ(std::memcmp(a->SinkBlock(ta.sink_block), b->SinkBlock(tb.sink_block), l.fp16_block_bytes()), 0);
    for (int layer = 0; layer < l.num_layers; ++layer) {
      std::vector<float> ka, va, kb, vb;
      ASSERT_TRUE(a->Read(qa[i], layer, 0, static_cast<uint32_t>(ta.tokens), &ka, &va).ok());
      ASSERT_TRUE(b->Read(qb[i], layer, 0, static_cast<uint32_t>(tb.tokens), &kb, &vb).ok());
      EXPECT_EQ(ka, kb);
      EXPECT_EQ(va, vb);
    }
  }
  EXPECT_EQ(h_->calls("AppendBatch"), static_cast<int>(token));  // the ring took no RPC
}

TEST_F(CommitRingTest, RingCommitsTheSameStateAsCommitBatch) { SameStateAsCommitBatch(false); }
TEST_F(CommitRingTest, PipelinedCommitsGiveTheSameStateAsCommitBatch) {
  SameStateAsCommitBatch(true);
}

// Without the drain thread's watch, Publish rings the doorbell only when kvarnd has completed
// the records of its last one (kvarnd looks at the tail again after each batch): many steps
// of pipelined commits, every one collected; the first Publish of each step rings (kvarnd
// finished the last step's records), no Publish rings twice. (How many later ones skip
// the doorbell depends on timing: the daemon bench reports it.)
TEST(CommitRingUnwatchedTest, PipelinedCommitsAllCompleteWithoutTheWatch) {
  InProcessDaemon h;
  InProcessDaemon::Options o;
  o.ring_watch = absl::ZeroDuration();
  ASSERT_TRUE(h.Start(o).ok());
  auto c = Client::Connect(h.target(), {}, absl::Seconds(10));
  ASSERT_TRUE(c.ok()) << c.status();
  auto d = (*c)->Describe();
  ASSERT_TRUE(d.ok());
  SessionOptions so;
  so.tenant = "a";
  so.layout = Client::LayoutOf(*d);
  so.max_sequences = 8;  // the pool's 8 sink blocks: every sequence seals its first tile
  auto s = (*c)->OpenSession(so);
  ASSERT_TRUE(s.ok()) << s.status();
  auto ring = (*s)->OpenCommitRing();
  ASSERT_TRUE(ring.ok()) << ring.status();
  std::vector<uint64_t> q;
  for (int i = 0; i < 8; ++i) q.push_back((*s)->CreateSequence({})->id);
  const std::vector<float> kv = TestKv(1, 4);
  constexpr int kSteps = 100;
  for (int step = 0; step < kSteps; ++step) {
    for (size_t i = 0; i < q.size(); ++i) {
      ASSERT_TRUE((*s)->Stage(q[i], 1, kv.data(), kv.data(), DType::kF32).ok());
      ASSERT_TRUE(
          (*ring)->Publish(q[i], std::vector<uint32_t>{static_cast<uint32_t>(step * 8 + i)}).ok());
    }
    auto got = (*ring)->Collect();
    ASSERT_TRUE(got.ok()) << "step " << step << ": " << got.status();
    for (const auto& r : *got) ASSERT_TRUE(r.ok()) << "step " << step << ": " << r.status();
  }
  for (uint64_t seq : q)
    EXPECT_EQ(*h.SequenceTokens((*s)->Ref(), seq), static_cast<uint64_t>(kSteps));
  EXPECT_GE((*ring)->doorbells(),
            static_cast<uint64_t>(kSteps));  // the first Publish of a step rings
  EXPECT_LE((*ring)->doorbells(), static_cast<uint64_t>(kSteps * q.size()));
  ring->reset();
  s->reset();
}

// Publish refuses what Commit refuses, with the same codes and messages, and a sequence
// whose commit is in flight; Collect answers every Publish in order; between the two the
// sequence cannot be staged, marked, located, or committed another way.
TEST_F(CommitRingTest, PublishRefusesWhatCommitRefusesAndASequenceInFlight) {
  Session* s = Open("tenant-a");
  auto ring = s->OpenCommitRing();
  ASSERT_TRUE(ring.ok());
  const std::vector<uint64_t> q = Sequences(s, 3);
  const std::vector<float> kv = TestKv(1, 5);
  auto batch = s->CommitBatch({{424242, {1}}, {q[0], {1, 2}}});
  ASSERT_TRUE(batch.ok());
  const absl::Status unknown = (*ring)->Publish(424242, std::vector<uint32_t>{1});
  const absl::Status mismatch = (*ring)->Publish(q[0], std::vector<uint32_t>{1, 2});
  EXPECT_EQ(unknown.code(), (*batch)[0].status().code());
  EXPECT_EQ(unknown.message(), (*batch)[0].status().message());
  EXPECT_EQ(mismatch.code(), (*batch)[1].status().code());
  EXPECT_EQ(mismatch.message(), (*batch)[1].status().message());

  ASSERT_TRUE(s->Stage(q[1], 1, kv.data(), kv.data(), DType::kF32).ok());
  ASSERT_TRUE((*ring)->Publish(q[1], std::vector<uint32_t>{7}).ok());
  const auto in_flight = [&](const absl::Status& st, const char* what) {
    EXPECT_EQ(st.code(), Code::kFailedPrecondition) << what << ": " << st;
    EXPECT_NE(st.message().find("in flight"), std::string::npos) << what << ": " << st;
  };
  in_flight((*ring)->Publish(q[1], std::vector<uint32_t>{7}), "Publish");
  in_flight(s->Stage(q[1], 1, kv.data(), kv.data(), DType::kF32), "Stage");
  in_flight(s->MarkStaged(q[1], 1), "MarkStaged");
  in_flight(s->TailSlot(q[1]).status(), "TailSlot");
  in_flight(s->Commit(q[1], std::vector<uint32_t>{7}).status(), "Commit");
  in_flight(
      s->AppendInline(q[1], std::vector<uint32_t>{7}, kv.data(), kv.data(), DType::kF32).status(),
      "AppendInline");
  in_flight(s->Fork(q[1]).status(), "Fork");
  auto other = s->CommitBatch({{q[1], {7}}});
  ASSERT_TRUE(other.ok());
  in_flight((*other)[0].status(), "CommitBatch");
  auto ring_commit = (*ring)->Commit({{q[2], {1}}});
  EXPECT_EQ(ring_commit.status().code(), Code::kFailedPrecondition) << "Commit before Collect";
  // Another sequence is free meanwhile.
  ASSERT_TRUE(s->Stage(q[2], 1, kv.data(), kv.data(), DType::kF32).ok());
  ASSERT_TRUE((*ring)->Publish(q[2], std::vector<uint32_t>{9}).ok());

  auto got = (*ring)->Collect();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 5u);
  EXPECT_EQ((*got)[0].status(), unknown);
  EXPECT_EQ((*got)[1].status(), mismatch);
  ASSERT_TRUE((*got)[2].ok()) << (*got)[2].status();
  EXPECT_EQ((*got)[2]->table.tokens, 1u);
  EXPECT_EQ((*got)[3].status().code(), Code::kFailedPrecondition);
  ASSERT_TRUE((*got)[4].ok()) << (*got)[4].status();
  EXPECT_EQ((*got)[4]->table.tokens, 1u);
  EXPECT_EQ(*h_->SequenceTokens(s->Ref(), q[1]), 1u);
  // Collected: the sequence is free again, and its table is the commit's.
  EXPECT_EQ(s->Table(q[1])->tokens, 1u);
  ASSERT_TRUE(s->Stage(q[1], 1, kv.data(), kv.data(), DType::kF32).ok());
  auto next = (*ring)->Commit({{q[1], {8}}});
  ASSERT_TRUE(next.ok() && (*next)[0].ok());
  EXPECT_EQ((*next)[0]->table.tokens, 2u);
  // Nothing published: Collect answers nothing.
  auto none = (*ring)->Collect();
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

// A published commit kvarnd rejects (NaN the worker wrote itself) comes back from Collect
// with CommitBatch's code and message, changes nothing, and frees the sequence.
TEST_F(CommitRingTest, APublishedCommitKvarndRejectsChangesNothing) {
  Session* s = Open("tenant-a");
  auto ring = s->OpenCommitRing();
  ASSERT_TRUE(ring.ok());
  const uint64_t q = Sequences(s, 1)[0];
  auto slot = s->TailSlot(q);
  ASSERT_TRUE(slot.ok());
  const BlockLayout& l = s->block_layout();
  const uint16_t nan = 0x7E00;
  std::memcpy(slot->first + l.Fp16ValuesOffset(1, 0) +
                  static_cast<size_t>(slot->second) * l.fp16_token_bytes() + 6,
              &nan, 2);
  ASSERT_TRUE(s->MarkStaged(q, 1).ok());
  auto want = s->CommitBatch({{q, {3}}});
  ASSERT_TRUE(want.ok());
  ASSERT_EQ((*want)[0].status().code(), Code::kInvalidArgument);
  ASSERT_TRUE((*ring)->Publish(q, std::vector<uint32_t>{3}).ok());
  auto got = (*ring)->Collect();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 1u);
  EXPECT_EQ((*got)[0].status(), (*want)[0].status());
  EXPECT_EQ(*h_->SequenceTokens(s->Ref(), q), 0u) << "a rejected commit changes nothing";
  // The token stays staged (as after CommitBatch's refusal) and the sequence is free.
  EXPECT_TRUE(s->TailSlot(q).ok());
  const uint16_t one = 0x3C00;
  std::memcpy(slot->first + l.Fp16ValuesOffset(1, 0) +
                  static_cast<size_t>(slot->second) * l.fp16_token_bytes() + 6,
              &one, 2);
  ASSERT_TRUE((*ring)->Publish(q, std::vector<uint32_t>{3}).ok());
  auto fixed = (*ring)->Collect();
  ASSERT_TRUE(fixed.ok() && (*fixed)[0].ok()) << fixed.status();
  EXPECT_EQ(*h_->SequenceTokens(s->Ref(), q), 1u);
}

// The session ending between Publish and Collect: Publish cannot know (its checks are the
// client's), and Collect's status is CommitBatch's NOT_FOUND, whether kvarnd answered the
// record (the call's status in its completion) or closed the ring first (its verdict).
TEST_F(CommitRingTest, ASessionEndingBeforeCollectIsItsNotFound) {
  Session* s = Open("tenant-a");
  auto [ring, q] = RingWithOneStagedToken(s);
  ASSERT_NE(ring, nullptr);
  ASSERT_TRUE(h_->CloseSession(s->Ref()).ok());
  ASSERT_TRUE(ring->Publish(q, std::vector<uint32_t>{1}).ok());
  auto got = ring->Collect();
  EXPECT_EQ(got.status().code(), Code::kNotFound) << got.status();
  // Then: NOT_FOUND again from kvarnd, or the closed ring's FAILED_PRECONDITION (unusable),
  // by the same race; never a commit.
  auto again = ring->Commit({{q, {1}}});
  EXPECT_TRUE(again.status().code() == Code::kNotFound ||
              again.status().code() == Code::kFailedPrecondition)
      << again.status();
}

// A ring dropped with Publishes not yet collected collects them: the sequence's table is the
// commit's and the sequence is free for the next commit by CommitBatch.
TEST_F(CommitRingTest, ADroppedRingCollectsWhatWasPublished) {
  Session* s = Open("tenant-a");
  auto [ring, q] = RingWithOneStagedToken(s);
  ASSERT_NE(ring, nullptr);
  ASSERT_TRUE(ring->Publish(q, std::vector<uint32_t>{1}).ok());
  ring.reset();
  EXPECT_EQ(*h_->SequenceTokens(s->Ref(), q), 1u);
  EXPECT_EQ(s->Table(q)->tokens, 1u);
  const std::vector<float> kv = TestKv(1, 6);
  ASSERT_TRUE(s->Stage(q, 1, kv.data(), kv.data(), DType::kF32).ok());
  auto next = s->CommitBatch({{q, {2}}});
  ASSERT_TRUE(next.ok() && (*next)[0].ok()) << next.status();
  EXPECT_EQ((*next)[0]->table.tokens, 2u);
}

// A ring kvarnd closes under a published commit (here: this process moved its tail out of
// bounds first): kvarnd applies nothing after its verdict, so the commit was not applied and
// its sequence is free, its token still staged, for CommitBatch; the ring's calls give
// FAILED_PRECONDITION naming the failure from then on.
TEST_F(CommitRingTest, AClosedRingFreesWhatItDidNotApplyAndRefusesItsCalls) {
  Session* s = Open("tenant-a");
  auto [ring, q] = RingWithOneStagedToken(s);
  ASSERT_NE(ring, nullptr);
  const uint64_t other = Sequences(s, 1)[0];
  const std::vector<float> kv = TestKv(1, 7);
  ASSERT_TRUE(s->Stage(other, 1, kv.data(), kv.data(), DType::kF32).ok());
  // This process breaks its own ring: a tail out of bounds, and the doorbell.
  auto* header = reinterpret_cast<ring::Header*>(ring->raw_memory());
  header->tail.store(4 * ring->capacity(), std::memory_order_release);
  const uint64_t one = 1;
  ASSERT_EQ(write(ring->doorbell_fd(), &one, sizeof(one)), static_cast<ssize_t>(sizeof(one)));
  ASSERT_TRUE(WaitFor([&] { return header->broken.load(std::memory_order_acquire) != 0; }));
  ASSERT_EQ(header->broken.load(), static_cast<uint32_t>(Code::kFailedPrecondition));
  // The client has not noticed: the record goes in, and Collect finds the ring closed.
  ASSERT_TRUE(ring->Publish(q, std::vector<uint32_t>{1}).ok());
  auto got = ring->Collect();
  EXPECT_EQ(got.status().code(), Code::kFailedPrecondition) << got.status();
  EXPECT_NE(got.status().message().find("closed"), std::string::npos) << got.status();
  EXPECT_EQ(*h_->SequenceTokens(s->Ref(), q), 0u);
  // The ring's calls, from now on.
  const auto unusable = [&](const absl::Status& st, const char* what) {
    EXPECT_EQ(st.code(), Code::kFailedPrecondition) << what << ": " << st;
    EXPECT_NE(st.message().find("unusable (FAILED_PRECONDITION: the commit ring is closed"),
              std::string::npos)
        << what << ": " << st;
  };
  unusable(ring->Publish(other, std::vector<uint32_t>{2}), "Publish");
  unusable(ring->Collect().status(), "Collect");
  unusable(ring->Commit({{other, {2}}}).status(), "Commit");
  // Both sequences go on by CommitBatch, each with its staged token.
  auto fine = s->CommitBatch({{q, {1}}, {other, {2}}});
  ASSERT_TRUE(fine.ok()) << fine.status();
  ASSERT_TRUE((*fine)[0].ok() && (*fine)[1].ok()) << (*fine)[0].status() << (*fine)[1].status();
  EXPECT_EQ((*fine)[0]->table.tokens, 1u);
  EXPECT_EQ((*fine)[1]->table.tokens, 1u);
}

// A completion this process wrote over before Collect read it is no answer from kvarnd, which
// did apply the commit: the item is INTERNAL and its sequence of unknown outcome (a
// CommitBatch of its staged token would append it twice).
TEST_F(CommitRingTest, ACompletionThisProcessOverwroteLeavesItsSequenceUnknown) {
  Session* s = Open("tenant-a");
  auto [ring, q] = RingWithOneStagedToken(s);
  ASSERT_NE(ring, nullptr);
  ASSERT_TRUE(ring->Publish(q, std::vector<uint32_t>{1}).ok());
  auto* header = reinterpret_cast<ring::Header*>(ring->raw_memory());
  ASSERT_TRUE(WaitFor([&] { return header->done.load(std::memory_order_acquire) == 1; }))
      << "kvarnd never completed the record";
  auto* completion = reinterpret_cast<ring::Completion*>(ring->raw_memory() +
                                                         ring::CompletionsOffset(ring->capacity()));
  completion->position = 777;
  auto got = ring->Collect();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 1u);
  EXPECT_EQ((*got)[0].status().code(), Code::kInternal) << (*got)[0].status();
  EXPECT_EQ(*h_->SequenceTokens(s->Ref(), q), 1u) << "kvarnd applied it";
  ExpectUnknownUntilRelease(s, ring.get(), /*ring_usable=*/true, q);
}

// A commit kvarnd does not answer within the client's rpc_timeout (here its doorbell rings an
// eventfd kvarnd does not watch, so kvarnd never looks) is DEADLINE_EXCEEDED and of unknown
// outcome: kvarnd may still apply it, so its sequence is blocked until Release, and the ring's
// calls name the timeout from then on.
TEST_F(CommitRingTest, ACommitKvarndDoesNotAnswerInTimeLeavesItsSequenceUnknown) {
  ClientOptions o;
  o.rpc_timeout = absl::Milliseconds(300);
  Session* s = Open("tenant-a", 4, true, &o);
  auto [ring, q] = RingWithOneStagedToken(s);
  ASSERT_NE(ring, nullptr);
  const int quiet = eventfd(0, EFD_CLOEXEC);
  ASSERT_GE(quiet, 0);
  ASSERT_EQ(dup2(quiet, ring->doorbell_fd()), ring->doorbell_fd());
  close(quiet);
  auto got = ring->Commit({{q, {1}}});
  EXPECT_EQ(got.status().code(), Code::kDeadlineExceeded) << got.status();
  EXPECT_NE(got.status().message().find("outcome is unknown"), std::string::npos) << got.status();
  const auto unusable = [&](const absl::Status& st, const char* what) {
    EXPECT_EQ(st.code(), Code::kFailedPrecondition) << what << ": " << st;
    EXPECT_NE(st.message().find("unusable (DEADLINE_EXCEEDED"), std::string::npos) << what << ": " << st;
  };
  unusable(ring->Collect().status(), "Collect");
  const uint64_t other = Sequences(s, 1)[0];
  const std::vector<float> kv = TestKv(1, 9);
  ASSERT_TRUE(s->Stage(other, 1, kv.data(), kv.data(), DType::kF32).ok());
  unusable(ring->Commit({{other, {2}}}).status(), "Commit");
  ExpectUnknownUntilRelease(s, ring.get(), /*ring_usable=*/false, q);
}

// A Publish whose doorbell write fails (here the descriptor is /dev/null, read-only) has put
// its record in the ring, where kvarnd may still find it: the Publish is INTERNAL, Collect
// names the failure, and the sequence is of unknown outcome until Release.
TEST_F(CommitRingTest, AFailedDoorbellLeavesWhatItPublishedUnknown) {
  Session* s = Open("tenant-a");
  auto [ring, q] = RingWithOneStagedToken(s);
  ASSERT_NE(ring, nullptr);
  const int read_only = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(read_only, 0);
  ASSERT_EQ(dup2(read_only, ring->doorbell_fd()), ring->doorbell_fd());
  close(read_only);
  const absl::Status published = ring->Publish(q, std::vector<uint32_t>{1});
  EXPECT_EQ(published.code(), Code::kInternal) << published;
  EXPECT_NE(published.message().find("doorbell failed"), std::string::npos) << published;
  auto got = ring->Collect();
  EXPECT_EQ(got.status().code(), Code::kFailedPrecondition) << got.status();
  EXPECT_NE(got.status().message().find("unusable (INTERNAL: the ring's doorbell failed"), std::string::npos)
      << got.status();
  ExpectUnknownUntilRelease(s, ring.get(), /*ring_usable=*/false, q);
}

TEST_F(CommitRingTest, ErrorsComeBackWithCommitBatchsCodesAndMessages) {
  Session* s = Open("tenant-a");
  auto ring = s->OpenCommitRing();
  ASSERT_TRUE(ring.ok());
  const std::vector<uint64_t> q = Sequences(s, 3);
  const std::vector<float> kv = TestKv(1, 5);
  const auto both = [&](const Items& items) {
    auto rb = s->CommitBatch(items);
    auto rr = (*ring)->Commit(items);
    ASSERT_EQ(rb.ok(), rr.ok());
    ASSERT_TRUE(rb.ok());
    ASSERT_EQ(rb->size(), rr->size());
    for (size_t i = 0; i < rb->size(); ++i) {
      EXPECT_EQ((*rb)[i].status().code(), (*rr)[i].status().code()) << i;
      EXPECT_EQ((*rb)[i].status().message(), (*rr)[i].status().message()) << i;
    }
  };
  // Client-side: an unknown sequence, ids that do not match the staged count.
  both({{424242, {1}}, {q[0], {1, 2}}});
  // Daemon-side: one sequence twice in a batch (busy), after a NaN the worker wrote itself.
  ASSERT_TRUE(s->Stage(q[1], 1, kv.data(), kv.data(), DType::kF32).ok());
  {
    auto rb = s->CommitBatch({{q[1], {7}}, {q[1], {7}}});
    ASSERT_TRUE(rb.ok());
    EXPECT_TRUE((*rb)[0].ok());
    EXPECT_EQ((*rb)[1].status().code(), Code::kFailedPrecondition);
    ASSERT_TRUE(s->Stage(q[1], 1, kv.data(), kv.data(), DType::kF32).ok());
    auto rr = (*ring)->Commit({{q[1], {8}}, {q[1], {8}}});
    ASSERT_TRUE(rr.ok());
    EXPECT_TRUE((*rr)[0].ok());
    EXPECT_EQ((*rr)[1].status().code(), Code::kFailedPrecondition);
    EXPECT_EQ((*rr)[1].status().message(), (*rb)[1].status().message());
  }
  auto slot = s->TailSlot(q[2]);
  ASSERT_TRUE(slot.ok());
  const BlockLayout& l = s->block_layout();
  const uint16_t nan = 0x7E00;
  std::memcpy(slot->first + l.Fp16KeysOffset(0, 0) +
                  static_cast<size_t>(slot->second) * l.fp16_token_bytes(),
              &nan, 2);
  ASSERT_TRUE(s->MarkStaged(q[2], 1).ok());
  auto rb = s->CommitBatch({{q[2], {9}}});
  auto rr = (*ring)->Commit({{q[2], {9}}});
  ASSERT_TRUE(rb.ok() && rr.ok());
  EXPECT_EQ((*rb)[0].status().code(), Code::kInvalidArgument);
  EXPECT_EQ((*rr)[0].status().code(), Code::kInvalidArgument);
  EXPECT_EQ((*rb)[0].status().message(), (*rr)[0].status().message());
  EXPECT_EQ(*h_->SequenceTokens(s->Ref(), q[2]), 0u) << "a rejected commit changes nothing";
}

TEST_F(CommitRingTest, ABatchBeyondTheRingIsRefusedBeforeAnythingIsWritten) {
  Session* s = Open("tenant-a", 3);
  auto ring = s->OpenCommitRing();
  ASSERT_TRUE(ring.ok());
  EXPECT_EQ((*ring)->capacity(), 4u);  // 3 tail slots, rounded up
  const uint64_t q = Sequences(s, 1)[0];
  const std::vector<float> kv = TestKv(1, 1);
  ASSERT_TRUE(s->Stage(q, 1, kv.data(), kv.data(), DType::kF32).ok());
  const Items five(5, {q, {1}});
  auto r = (*ring)->Commit(five);
  EXPECT_EQ(r.status().code(), Code::kResourceExhausted) << r.status();
  EXPECT_NE(r.status().message().find("exceeds the ring's 4 records"), std::string::npos) << r.status();
  EXPECT_EQ(*h_->SequenceTokens(s->Ref(), q), 0u);
  // The staged token is still staged; the ring still serves.
  auto ok = (*ring)->Commit({{q, {1}}});
  ASSERT_TRUE(ok.ok() && (*ok)[0].ok()) << ok.status();
  EXPECT_EQ((*ok)[0]->table.tokens, 1u);
}

TEST_F(CommitRingTest, MoreTokensThanARecordCarriesGoByCommitBatch) {
  Session* s = Open("tenant-a");
  auto ring = s->OpenCommitRing();
  ASSERT_TRUE(ring.ok());
  const uint64_t q = Sequences(s, 1)[0];
  const int n = static_cast<int>(ring::kRecordTokens) + 1;
  const std::vector<float> kv = TestKv(n, 2);
  ASSERT_TRUE(s->Stage(q, n, kv.data(), kv.data(), DType::kF32).ok());
  auto r = (*ring)->Commit({{q, TestTokenIds(0, n)}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)[0].status().code(), Code::kInvalidArgument);
  EXPECT_EQ(*h_->SequenceTokens(s->Ref(), q), 0u);
  auto b = s->CommitBatch({{q, TestTokenIds(0, n)}});
  ASSERT_TRUE(b.ok() && (*b)[0].ok());
}

// The library tells the daemon the CPU it commits from; the daemon's drain thread (whose mask
// is this process's) moves there before the batch.
TEST_F(CommitRingTest, CommitsCarryTheClientsCpuAndTheDrainFollowsIt) {
  Session* s = Open("tenant-a");
  auto [ring, q] = RingWithOneStagedToken(s);
  ASSERT_NE(ring, nullptr);
  auto r = ring->Commit({{q, TestTokenIds(0, 1)}});
  ASSERT_TRUE(r.ok() && (*r)[0].ok());
  EXPECT_GE(h_->ring_cpu_moves(), 1u);
  // kvarnd says where it drained the batch: the CPU the commit named (this process's mask
  // is kvarnd's), which the client's next wait reads to decide whether to spin.
  const auto* header = reinterpret_cast<const ring::Header*>(ring->raw_memory());
  EXPECT_NE(header->drained_on.load(), 0u);
  EXPECT_EQ(header->drained_on.load(), header->cpu.load());
}

TEST_F(CommitRingTest, OneRingPerSessionAndNoneWithoutSharedMemory) {
  Session* s = Open("tenant-a");
  ASSERT_TRUE(s->OpenCommitRing().ok());
  EXPECT_EQ(s->OpenCommitRing().status().code(), Code::kAlreadyExists);
  Session* remote = Open("tenant-a", 2, /*map=*/false);
  EXPECT_EQ(remote->OpenCommitRing().status().code(), Code::kFailedPrecondition);
}

TEST_F(CommitRingTest, EndedSessionIsTheCallsNotFoundAndClosesTheRing) {
  Session* s = Open("tenant-a");
  auto [ring, q] = RingWithOneStagedToken(s);
  ASSERT_NE(ring, nullptr);
  ASSERT_TRUE(h_->CloseSession(s->Ref()).ok());
  auto batch = s->CommitBatch({{q, {1}}});
  auto r = ring->Commit({{q, {1}}});
  EXPECT_EQ(batch.status().code(), Code::kNotFound);
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  // The ring is closed for good.
  auto again = ring->Commit({{q, {1}}});
  EXPECT_FALSE(again.ok());
  EXPECT_EQ(h_->rings_broken(), 1u);
}

}  // namespace
}  // namespace kvarn::testing

namespace kvarn::testing {
namespace {

// BlockIds, the table's list of quantized block ids: copies share one array, changes build a
// new one and leave the other copies as they were.
TEST(BlockIdsTest, CopiesShareTheArrayAndChangesLeaveOtherCopiesAlone) {
  const BlockIds none;
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none.size(), 0u);
  EXPECT_EQ(none, std::vector<uint32_t>{});
  EXPECT_EQ(BlockIds(std::vector<uint32_t>{}), none);

  BlockIds a = {4, 9, 2};
  const BlockIds b = a;
  EXPECT_EQ(b.data(), a.data()) << "a copy shares the array";
  a.push_back(7);
  EXPECT_NE(a.data(), b.data());
  EXPECT_EQ(a, (std::vector<uint32_t>{4, 9, 2, 7}));
  EXPECT_EQ(b, (std::vector<uint32_t>{4, 9, 2})) << "the other copy keeps what it held";
  EXPECT_EQ(b.front(), 4u);
  EXPECT_EQ(b.back(), 2u);
  EXPECT_EQ(b[1], 9u);
  const std::vector<uint32_t>& v = b;
  EXPECT_EQ(v.data(), b.data());
  std::vector<uint32_t> seen(b.begin(), b.end());
  EXPECT_EQ(seen, b.vector());

  const std::vector<uint32_t> src = {1, 2};
  BlockIds c = b;
  c.assign(src.begin(), src.end());
  EXPECT_EQ(c, src);
  EXPECT_EQ(b.size(), 3u);
  c.assign(src.begin(), src.begin());
  EXPECT_TRUE(c.empty());
  EXPECT_FALSE(c == b);
}

// A commit that seals nothing hands back the session's own array of block ids, by ring or by
// CommitBatch (no copy of the table per decode step); a table returned earlier keeps its ids
// when a later seal adds one.
TEST_F(CommitRingTest, CommitsShareTheTablesBlockIdsAndEarlierResultsKeepTheirs) {
  Session* s = Open("tenant-a");
  auto ring = s->OpenCommitRing();
  ASSERT_TRUE(ring.ok()) << ring.status();
  const uint64_t q = Sequences(s, 1)[0];
  uint32_t token = 0;
  // Commits one staged token through the ring (or CommitBatch) and returns its result.
  const auto step = [&](bool by_ring) -> absl::StatusOr<AppendInfo> {
    const std::vector<float> kv = TestKv(1, token);
    if (absl::Status st = s->Stage(q, 1, kv.data(), kv.data(), DType::kF32); !st.ok()) return st;
    const Items items = {{q, TestTokenIds(token++, 1)}};
    auto r = by_ring ? (*ring)->Commit(items) : s->CommitBatch(items);
    if (!r.ok()) return r.status();
    return (*r)[0];
  };
  absl::StatusOr<AppendInfo> first = absl::UnknownError("no seal");
  for (int i = 0; i < 4 * s->block_layout().tile_tokens; ++i) {
    auto r = step(true);
    ASSERT_TRUE(r.ok()) << r.status();
    if (!r->table.quant_blocks.empty()) {
      first = *r;
      break;
    }
  }
  ASSERT_TRUE(first.ok()) << "a quantized block was sealed";
  ASSERT_EQ(first->table.quant_blocks.size(), 1u);
  for (bool by_ring : {true, false}) {
    auto r = step(by_ring);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_FALSE(r->sealed);
    EXPECT_EQ(r->table.quant_blocks.data(), first->table.quant_blocks.data())
        << (by_ring ? "ring" : "CommitBatch");
    EXPECT_EQ(s->Table(q)->quant_blocks.data(), first->table.quant_blocks.data());
  }
  absl::StatusOr<AppendInfo> second = absl::UnknownError("no second seal");
  for (int i = 0; i < 2 * s->block_layout().tile_tokens; ++i) {
    auto r = step(true);
    ASSERT_TRUE(r.ok()) << r.status();
    if (r->sealed) {
      second = *r;
      break;
    }
  }
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(second->table.quant_blocks.size(), 2u);
  EXPECT_EQ(second->table.quant_blocks[0], first->table.quant_blocks[0]);
  EXPECT_EQ(first->table.quant_blocks.size(), 1u) << "an earlier result keeps its ids";
  EXPECT_EQ(s->Table(q)->quant_blocks.data(), second->table.quant_blocks.data());
}

}  // namespace
}  // namespace kvarn::testing
