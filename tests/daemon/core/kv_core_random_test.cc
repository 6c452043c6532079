// Random sequences of API actions against the core, checked after every action against the
// invariant checker and a small model of what each sequence must hold (RocksDB-style
// expected state kept outside the system under test). Also run from several threads at once.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <thread>

#include "tests/daemon/core/core_fixture.h"

namespace kvarn::testing {
namespace {

struct ModelSeq {
  SessionRef session;
  uint64_t tokens = 0;
};

class RandomActionsTest : public CoreTest, public ::testing::WithParamInterface<uint32_t> {};

TEST_P(RandomActionsTest, InvariantsAndModelHoldAfterEveryAction) {
  CoreConfig c;
  c.lease_ttl = absl::Seconds(5);
  c.grace = absl::Seconds(1);
  MakeCore(12, 10, SmallModel(), c);
  std::mt19937 rng(GetParam());
  std::vector<SessionRef> sessions;
  std::map<SessionId, int> streams;  // attached keep-alive streams, as the service keeps them
  std::map<SequenceId, ModelSeq> seqs;
  const std::vector<uint32_t> prompts[3] = {Tokens(0, 200), Tokens(5000, 150), Tokens(0, 100)};
  int done = 0, appended = 0;
  for (int step = 0; step < 1500; ++step) {
    // Weighted: appends dominate, time moves now and then.
    static constexpr int kOps[20] = {0, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 5, 6, 6, 7, 8, 9, 1, 2};
    const int op = kOps[rng() % 20];
    if (op == 0 || sessions.empty()) {
      OpenParams p;
      p.tenant = (rng() % 2) ? "a" : "b";
      p.layout = model_;
      p.max_sequences = 1 + rng() % 3;
      auto r = core_->OpenSession(p);
      if (r.ok()) {
        sessions.push_back(Ref(r));
        if (core_->AttachStream(sessions.back()).ok()) ++streams[r->session];
      } else {
        ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
      }
    } else if (op == 1) {
      const SessionRef s = sessions[rng() % sessions.size()];
      const auto& prompt = prompts[rng() % 3];
      auto r = core_->CreateSequence(s, prompt);
      if (r.ok()) {
        ASSERT_EQ(r->cached_tokens % g_, 0u);
        ASSERT_LE(r->cached_tokens, prompt.size() - 1);
        seqs[r->sequence] = {s, r->cached_tokens};
      } else {
        ASSERT_TRUE(r.status().code() == absl::StatusCode::kResourceExhausted ||
                    r.status().code() == absl::StatusCode::kNotFound) << r.status();
      }
    } else if (op == 2 && !seqs.empty()) {
      auto it = seqs.begin();
      std::advance(it, rng() % seqs.size());
      auto t = core_->Table(it->second.session, it->first);
      if (!t.ok()) {
        ASSERT_EQ(t.status().code(), absl::StatusCode::kNotFound);
        seqs.erase(it);
        continue;
      }
      const int room = g_ - static_cast<int>(t->tail_tokens);
      const int n = (rng() % 2) ? room : 1 + static_cast<int>(rng() % room);
      std::vector<float> k = Kv(n, static_cast<uint32_t>(it->second.tokens)), v = Kv(n, 7 + static_cast<uint32_t>(it->second.tokens));
      if (rng() % 50 == 0) k[rng() % k.size()] = NAN;
      auto r = core_->AppendInline(it->second.session, it->first, Tokens(static_cast<uint32_t>(it->second.tokens), n),
                                   k.data(), v.data(), DType::kF32);
      if (r.ok()) {
        ++appended;
        it->second.tokens += n;
        ASSERT_EQ(r->table.tokens, it->second.tokens);
      } else {
        ASSERT_TRUE(r.status().code() == absl::StatusCode::kInvalidArgument ||
                    r.status().code() == absl::StatusCode::kResourceExhausted) << r.status();
        ASSERT_EQ(core_->Table(it->second.session, it->first)->tokens, it->second.tokens);
      }
    } else if (op == 5 && !seqs.empty()) {
      auto it = seqs.begin();
      std::advance(it, rng() % seqs.size());
      auto r = core_->Fork(it->second.session, it->first);
      if (r.ok()) {
        ASSERT_EQ(r->table.tokens, it->second.tokens);
        seqs[r->sequence] = it->second;
      }
    } else if (op == 6 && !seqs.empty()) {
      auto it = seqs.begin();
      std::advance(it, rng() % seqs.size());
      absl::Status s = core_->Release(it->second.session, std::vector<SequenceId>{it->first}).status();
      ASSERT_TRUE(s.ok() || s.code() == absl::StatusCode::kNotFound) << s;
      seqs.erase(it);
      ++done;
    } else if (op == 7) {
      clock_.Advance(absl::Milliseconds(rng() % 800));
      for (const SessionRef& s : sessions) {
        if (rng() % 4 != 0) core_->KeepAlive(s).IgnoreError();
      }
      core_->ExpireSessions();
    } else if (op == 8 && !sessions.empty()) {
      const SessionRef s = sessions[rng() % sessions.size()];
      if (rng() % 3 == 0) {
        if (streams[s.session] > 0) {
          --streams[s.session];
          core_->DetachStream(s.session);
        }
      } else {
        core_->CloseSession(s).IgnoreError();
      }
    } else if (op == 9 && !sessions.empty()) {
      core_->Evict(sessions[rng() % sessions.size()], EvictScope::kTenant, 0, "").IgnoreError();
    }
    ASSERT_TRUE(core_->CheckInvariants().ok()) << core_->CheckInvariants() << " after step " << step << " op " << op;
    auto st = core_->Stats(std::nullopt);
    ASSERT_LE(st->UsedBytes(), st->capacity_bytes);
  }
  EXPECT_GT(done, 10);
  EXPECT_GT(appended, 100);
  const auto st = core_->Stats(std::nullopt);
  EXPECT_GT(st->seals + st->sink_seals + st->dedup_seals, 50u);
  std::printf("seed %u: %d appends, %d releases, %lu seals, %lu evictions, %lu sessions expired\n", GetParam(), appended,
              done, static_cast<unsigned long>(st->seals),
              static_cast<unsigned long>(st->evictions[0] + st->evictions[1] + st->evictions[2]),
              static_cast<unsigned long>(st->sessions_expired));
}

INSTANTIATE_TEST_SUITE_P(Seeds, RandomActionsTest, ::testing::Values(1u, 2u, 3u, 4u));

// Sessions on four threads hammer the core at once; the invariants hold throughout and
// nothing leaks once everyone closes.
TEST_F(CoreTest, ConcurrentSessionsLeaveNoLeaks) {
  MakeCore(64, 32);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([this, t] {
      std::mt19937 rng(t);
      SessionRef s = Open("tenant" + std::to_string(t % 2), 3);
      std::vector<SequenceId> mine;
      for (int i = 0; i < 150; ++i) {
        if (mine.size() < 3 && rng() % 3 == 0) {
          auto r = core_->CreateSequence(s, Tokens(static_cast<uint32_t>(rng() % 3) * 1000, 130));
          if (r.ok()) mine.push_back(r->sequence);
        } else if (!mine.empty()) {
          const SequenceId q = mine[rng() % mine.size()];
          auto tab = core_->Table(s, q);
          if (!tab.ok()) continue;
          const int n = 1 + static_cast<int>(rng() % (g_ - tab->tail_tokens));
          std::vector<float> k = Kv(n, i), v = Kv(n, i + 1);
          core_->AppendInline(s, q, Tokens(static_cast<uint32_t>(i), n), k.data(), v.data(), DType::kF32).IgnoreError();
          if (rng() % 10 == 0) {
            core_->Release(s, std::vector<SequenceId>{q}).IgnoreError();
            mine.erase(std::find(mine.begin(), mine.end(), q));
          }
        }
        EXPECT_TRUE(core_->CheckInvariants().ok());
      }
      EXPECT_TRUE(core_->CloseSession(s).ok());
    });
  }
  for (std::thread& t : threads) t.join();
  auto st = core_->Stats(std::nullopt);
  EXPECT_EQ(st->quant_active + st->sink_active, 0u);
  EXPECT_EQ(st->quant_sealing + st->sink_sealing, 0u);
  EXPECT_EQ(st->tail_slots_reserved, 0u);
  EXPECT_EQ(st->sessions, 0u);
}

}  // namespace
}  // namespace kvarn::testing
