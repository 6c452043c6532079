// kvarn::Session and kvarn::Client used from many threads at once, as client/lib/client.h
// allows ("Thread safety"), against an in-process daemon (in_process_daemon.h: the service on
// a Unix socket with the descriptor channel, so sessions map the pool as against kvarnd).
// Each case compares what the threads got, bit for bit, with the same operations run one
// after another on a fresh daemon, then checks the daemon's books. deploy/sanitize.sh tsan
// runs it under ThreadSanitizer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <latch>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "client/lib/client.h"
#include "client/lib/commit_ring.h"
#include "tests/client/lib/in_process_daemon.h"

namespace kvarn::testing {
namespace {

using Code = absl::StatusCode;

constexpr int kThreads = 6;
constexpr int kRounds = 5;

// A token's keys and values are a function of its id alone, so a prefix adopted from the
// cache (matched by ids) holds exactly what the sequence would have written itself, whichever
// thread sealed it.
std::vector<float> TokenKv(std::span<const uint32_t> ids, uint32_t salt) {
  std::vector<float> out;
  for (uint32_t id : ids) {
    const std::vector<float> one = TestKv(1, id * 2 + salt);
    out.insert(out.end(), one.begin(), one.end());
  }
  return out;
}

std::vector<uint32_t> Concat(std::vector<uint32_t> a, const std::vector<uint32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// An in-process daemon and a client of it; Open gives sessions with the daemon's layout.
struct Daemon {
  std::unique_ptr<InProcessDaemon> h;
  std::unique_ptr<Client> client;

  absl::Status Start() {
    h = std::make_unique<InProcessDaemon>();
    if (absl::Status s = h->Start({}); !s.ok()) return s;
    auto c = Client::Connect(h->target(), {}, absl::Seconds(10));
    if (!c.ok()) return c.status();
    client = std::move(*c);
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<Session>> Open(const std::string& tenant, uint32_t slots) {
    auto d = client->Describe();
    if (!d.ok()) return d.status();
    SessionOptions o;
    o.tenant = tenant;
    o.layout = Client::LayoutOf(*d);
    o.max_sequences = slots;
    o.client_name = "session-threads-test";
    return client->OpenSession(o);
  }
};

// Appends `ids` in pieces that never cross a tile boundary, cycling through the ways in:
// Append, Stage in two parts then Commit, and AppendInline (at most 8 tokens: the harness's
// inline limit).
absl::Status AppendIds(Session& s, uint64_t seq, std::span<const uint32_t> ids, int style) {
  static constexpr int kPieces[] = {1, 7, 24, 64, 3, 8, 40};
  const int tile = s.block_layout().tile_tokens;
  size_t done = 0;
  for (int k = style; done < ids.size(); ++k) {
    auto t = s.Table(seq);
    if (!t.ok()) return t.status();
    const int way = k % 3;
    int n = std::min<int>({kPieces[k % 7], tile - static_cast<int>(t->tail_tokens),
                           static_cast<int>(ids.size() - done)});
    if (way == 2) n = std::min(n, 8);
    const std::span<const uint32_t> piece = ids.subspan(done, static_cast<size_t>(n));
    const std::vector<float> keys = TokenKv(piece, 0), values = TokenKv(piece, 1);
    absl::StatusOr<AppendInfo> r;
    if (way == 0) {
      r = s.Append(seq, piece, keys.data(), values.data(), DType::kF32);
    } else if (way == 1) {
      const int first = n / 2;
      const size_t row = keys.size() / piece.size();
      absl::Status st = first == 0 ? absl::OkStatus()
                                   : s.Stage(seq, first, keys.data(), values.data(), DType::kF32);
      if (st.ok()) {
        st = s.Stage(seq, n - first, keys.data() + first * row, values.data() + first * row,
                     DType::kF32);
      }
      if (!st.ok()) return st;
      r = s.Commit(seq, piece);
    } else {
      r = s.AppendInline(seq, piece, keys.data(), values.data(), DType::kF32);
    }
    if (!r.ok()) return r.status();
    done += piece.size();
  }
  return absl::OkStatus();
}

// What a sequence reads as: per layer, Attend's output and log-sum-exp for seeded queries
// (two query heads per kv-head), then Read's keys and values of every token.
absl::Status Observe(Session& s, uint64_t seq, uint32_t query_seed,
                     std::vector<std::vector<float>>* out) {
  auto t = s.Table(seq);
  if (!t.ok()) return t.status();
  const BlockLayout& l = s.block_layout();
  const int q_heads = 2 * l.num_kv_heads;
  for (int layer = 0; layer < l.num_layers; ++layer) {
    std::mt19937 rng(query_seed + static_cast<uint32_t>(layer));
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> q(static_cast<size_t>(q_heads) * l.head_dim);
    for (float& x : q) x = dist(rng);
    std::vector<float> o(q.size()), lse(static_cast<size_t>(q_heads));
    if (absl::Status a = s.Attend(seq, layer, q.data(), q_heads, o.data(), lse.data()); !a.ok())
      return a;
    std::vector<float> keys, values;
    if (absl::Status r = s.Read(seq, static_cast<uint32_t>(layer), 0,
                                static_cast<uint32_t>(t->tokens), &keys, &values);
        !r.ok()) {
      return r;
    }
    out->push_back(std::move(o));
    out->push_back(std::move(lse));
    out->push_back(std::move(keys));
    out->push_back(std::move(values));
  }
  return absl::OkStatus();
}

// One round of thread t's work: a sequence from a prompt that shares its first tile (the sink)
// with every other, and its second with half of them; what the cache lacks of the prompt
// appended; decoding past a tile boundary; a fork; each branch its own continuation; both
// observed and released.
struct Round {
  std::vector<uint32_t> prompt, decode, branch_a, branch_b;
  uint32_t query_seed = 0;
};

Round RoundOf(int t, int r, int tile) {
  Round x;
  const uint32_t base = 1'000'000u + static_cast<uint32_t>(t * 100 + r) * 1000u;
  x.prompt = TestTokenIds(1, tile);
  if ((t + r) % 2 == 0) x.prompt = Concat(x.prompt, TestTokenIds(500, tile));
  x.prompt = Concat(x.prompt, TestTokenIds(base, 5 + (t * 7 + r * 3) % 40));
  x.decode = TestTokenIds(base + 100, 40 + (t * 13 + r * 5) % 60);
  x.branch_a = TestTokenIds(base + 300, 10 + (t + r) % 30);
  x.branch_b = TestTokenIds(base + 500, 30 + (t * 3 + r) % 50);
  x.query_seed = base;
  return x;
}

struct Outcome {
  uint64_t cached_tokens = 0;  // adopted at creation
  std::vector<std::vector<float>> reads;
};

absl::StatusOr<Outcome> RunRound(Session& s, int t, int r) {
  const Round x = RoundOf(t, r, s.block_layout().tile_tokens);
  Outcome out;
  auto q = s.CreateSequence(x.prompt);
  if (!q.ok()) return q.status();
  const uint64_t seq = q->id;
  out.cached_tokens = q->cached_tokens;
  const std::span<const uint32_t> prompt(x.prompt);
  if (q->cached_tokens > prompt.size()) return absl::InternalError("adopted more than the prompt");
  if (absl::Status a = AppendIds(s, seq, prompt.subspan(q->cached_tokens), t + r); !a.ok())
    return a;
  if (absl::Status a = AppendIds(s, seq, x.decode, t); !a.ok()) return a;
  auto f = s.Fork(seq);
  if (!f.ok()) return f.status();
  if (absl::Status a = AppendIds(s, seq, x.branch_a, r); !a.ok()) return a;
  if (absl::Status a = AppendIds(s, f->id, x.branch_b, t + 1); !a.ok()) return a;
  const std::vector<uint64_t> both = {seq, f->id};
  const uint64_t common = x.prompt.size() + x.decode.size();
  const uint64_t expected[] = {common + x.branch_a.size(), common + x.branch_b.size()};
  for (int i = 0; i < 2; ++i) {
    auto table = s.Table(both[i]);
    if (!table.ok()) return table.status();
    if (table->tokens != expected[i]) {
      return absl::InternalError(
          absl::StrCat("sequence holds ", table->tokens, " tokens, not ", expected[i]));
    }
    if (absl::Status o = Observe(s, both[i], x.query_seed + 10 * i, &out.reads); !o.ok()) return o;
  }
  if (absl::Status rel = s.Release(both); !rel.ok()) return rel;
  return out;
}

// The reference: every thread's rounds, one after another, on a session of a fresh daemon.
std::map<std::pair<int, int>, Outcome> Serially(int threads, int rounds) {
  std::map<std::pair<int, int>, Outcome> out;
  Daemon d;
  absl::Status st = d.Start();
  EXPECT_TRUE(st.ok()) << st;
  if (!st.ok()) return out;
  auto s = d.Open("tenant-a", 2);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return out;
  for (int t = 0; t < threads; ++t) {
    for (int r = 0; r < rounds; ++r) {
      auto o = RunRound(**s, t, r);
      EXPECT_TRUE(o.ok()) << "serially, thread " << t << " round " << r << ": " << o.status();
      if (o.ok()) out[{t, r}] = std::move(*o);
    }
  }
  return out;
}

void ExpectSameReads(const Outcome& got, const Outcome& want, int t, int r) {
  ASSERT_EQ(got.reads.size(), want.reads.size()) << "thread " << t << " round " << r;
  for (size_t i = 0; i < got.reads.size(); ++i) {
    EXPECT_TRUE(SameBits(got.reads[i], want.reads[i]))
        << "thread " << t << " round " << r << ", output " << i;
  }
}

// Seals the first tile of every prompt here (ids 1..tile) into the session's prefix cache.
absl::Status CacheSink(Session& s) {
  auto q = s.CreateSequence({});
  if (!q.ok()) return q.status();
  if (absl::Status a = AppendIds(s, q->id, TestTokenIds(1, s.block_layout().tile_tokens), 0);
      !a.ok())
    return a;
  return s.Release(std::vector<uint64_t>{q->id});
}

// No sequence left, no block referenced, and the pool's invariants hold.
void ExpectNothingHeld(Daemon& d, Session& s) {
  auto st = s.Stats();
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->sequences(), 0u);
  EXPECT_EQ(st->quant_blocks_active(), 0u);
  EXPECT_EQ(st->sink_blocks_active(), 0u);
  EXPECT_EQ(st->quant_blocks_free() + st->quant_blocks_cached(), st->quant_blocks_total());
  EXPECT_EQ(st->sink_blocks_free() + st->sink_blocks_cached(), st->sink_blocks_total());
  EXPECT_TRUE(d.h->CheckInvariants().ok()) << d.h->CheckInvariants();
}

TEST(SessionThreadsTest, ThreadsSharingOneSessionGetWhatTheSameCallsGiveSerially) {
  const auto want = Serially(kThreads, kRounds);
  ASSERT_EQ(want.size(), static_cast<size_t>(kThreads * kRounds));

  Daemon d;
  ASSERT_TRUE(d.Start().ok());
  auto s = d.Open("tenant-a", 2 * kThreads);
  ASSERT_TRUE(s.ok()) << s.status();
  Session& session = **s;
  std::vector<std::vector<absl::StatusOr<Outcome>>> got(kThreads);
  std::latch start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      for (int r = 0; r < kRounds; ++r) got[t].push_back(RunRound(session, t, r));
    });
  }
  for (std::thread& th : threads) th.join();

  uint64_t adopted = 0;
  for (int t = 0; t < kThreads; ++t) {
    for (int r = 0; r < kRounds; ++r) {
      const absl::StatusOr<Outcome>& o = got[t][r];
      ASSERT_TRUE(o.ok()) << "thread " << t << " round " << r << ": " << o.status();
      ExpectSameReads(*o, want.at({t, r}), t, r);
      adopted += o->cached_tokens;
    }
  }
  // The threads shared prefixes: every round after a thread's first finds the sink cached.
  EXPECT_GE(adopted,
            static_cast<uint64_t>(kThreads * (kRounds - 1) * session.block_layout().tile_tokens));
  ExpectNothingHeld(d, session);
}

// Appends of 4 tokens from several threads to one sequence, and forks of it from another:
// each either lands whole or fails FAILED_PRECONDITION (client.h, "Thread safety"), and the
// sequence then reads exactly as the successful appends one after another, in the order of
// the positions they got.
TEST(SessionThreadsTest, ConcurrentAppendsToOneSequenceLandWholeOrFailPrecondition) {
  constexpr int kAppenders = 4;
  constexpr int kAttempts = 40;
  constexpr int kTokens = 4;  // divides the tile: no append crosses a tile boundary
  Daemon d;
  ASSERT_TRUE(d.Start().ok());
  auto s = d.Open("tenant-a", 2);
  ASSERT_TRUE(s.ok()) << s.status();
  Session& session = **s;
  ASSERT_EQ(session.block_layout().tile_tokens % kTokens, 0);
  auto q = session.CreateSequence({});
  ASSERT_TRUE(q.ok()) << q.status();
  const uint64_t seq = q->id;

  struct Landed {
    uint64_t end;  // the sequence's length after it
    std::vector<uint32_t> ids;
  };
  std::vector<std::vector<Landed>> landed(kAppenders);
  std::vector<std::vector<absl::Status>> refused(kAppenders);
  // Forks taken meanwhile: each OK or FAILED_PRECONDITION, and holding whole appends.
  std::vector<absl::Status> fork_errors;
  std::vector<uint64_t> fork_tokens;
  std::latch start(kAppenders + 1);
  std::vector<std::thread> threads;
  threads.emplace_back([&] {
    start.arrive_and_wait();
    for (int a = 0; a < kAttempts; ++a) {
      auto f = session.Fork(seq);
      if (!f.ok()) {
        fork_errors.push_back(f.status());
        continue;
      }
      fork_tokens.push_back(f->table.tokens);
      if (absl::Status r = session.Release(std::vector<uint64_t>{f->id}); !r.ok())
        fork_errors.push_back(r);
    }
  });
  for (int t = 0; t < kAppenders; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      for (int a = 0; a < kAttempts; ++a) {
        const std::vector<uint32_t> ids =
            TestTokenIds(static_cast<uint32_t>((t + 1) * 100'000 + a * kTokens), kTokens);
        const std::vector<float> keys = TokenKv(ids, 0), values = TokenKv(ids, 1);
        auto r = a % 2 == 0
                     ? session.Append(seq, ids, keys.data(), values.data(), DType::kF32)
                     : session.AppendInline(seq, ids, keys.data(), values.data(), DType::kF32);
        if (r.ok()) {
          landed[t].push_back({r->table.tokens, ids});
        } else {
          refused[t].push_back(r.status());
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();

  for (const absl::Status& st : fork_errors) EXPECT_EQ(st.code(), Code::kFailedPrecondition) << st;
  std::vector<Landed> all;
  for (int t = 0; t < kAppenders; ++t) {
    for (const absl::Status& st : refused[t]) EXPECT_EQ(st.code(), Code::kFailedPrecondition) << st;
    all.insert(all.end(), landed[t].begin(), landed[t].end());
  }
  ASSERT_FALSE(all.empty());
  std::sort(all.begin(), all.end(), [](const Landed& a, const Landed& b) { return a.end < b.end; });
  for (size_t i = 0; i < all.size(); ++i) {
    ASSERT_EQ(all[i].end, (i + 1) * kTokens) << "the append that landed " << i << "th";
  }
  const uint64_t total = all.size() * kTokens;
  for (uint64_t tokens : fork_tokens) {
    EXPECT_EQ(tokens % kTokens, 0u);
    EXPECT_LE(tokens, total);
  }
  auto table = session.Table(seq);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->tokens, total);
  auto core = d.h->SequenceTokens(session.Ref(), seq);
  ASSERT_TRUE(core.ok()) << core.status();
  EXPECT_EQ(*core, total);
  std::vector<std::vector<float>> got;
  ASSERT_TRUE(Observe(session, seq, 7, &got).ok());
  ASSERT_TRUE(session.Release(std::vector<uint64_t>{seq}).ok());
  ExpectNothingHeld(d, session);

  // The same appends, one after another, on a fresh daemon.
  Daemon ref;
  ASSERT_TRUE(ref.Start().ok());
  auto rs = ref.Open("tenant-a", 2);
  ASSERT_TRUE(rs.ok()) << rs.status();
  auto rq = (*rs)->CreateSequence({});
  ASSERT_TRUE(rq.ok()) << rq.status();
  for (const Landed& l : all) {
    const std::vector<float> keys = TokenKv(l.ids, 0), values = TokenKv(l.ids, 1);
    auto r = (*rs)->Append(rq->id, l.ids, keys.data(), values.data(), DType::kF32);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  std::vector<std::vector<float>> want;
  ASSERT_TRUE(Observe(**rs, rq->id, 7, &want).ok());
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(SameBits(got[i], want[i])) << "output " << i;
}

// One Client: worker threads run rounds on sessions of their own while other threads open
// sessions, append, and destroy them (sequences unreleased, keep-alive threads streaming).
TEST(SessionThreadsTest, SessionsOpenAndCloseOnOneClientWhileOthersWork) {
  constexpr int kWorkers = 3;
  constexpr int kChurners = 3;
  constexpr int kCycles = 8;
  const auto want = Serially(kWorkers, kRounds);
  ASSERT_EQ(want.size(), static_cast<size_t>(kWorkers * kRounds));

  Daemon d;
  ASSERT_TRUE(d.Start().ok());
  std::vector<std::vector<absl::StatusOr<Outcome>>> got(kWorkers);
  std::vector<absl::Status> churned(kChurners);
  std::latch start(kWorkers + kChurners);
  std::vector<std::thread> threads;
  for (int t = 0; t < kWorkers; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      auto s = d.Open(absl::StrCat("worker-", t), 2);
      if (!s.ok()) {
        got[t].push_back(s.status());
        return;
      }
      for (int r = 0; r < kRounds; ++r) got[t].push_back(RunRound(**s, t, r));
    });
  }
  for (int c = 0; c < kChurners; ++c) {
    threads.emplace_back([&, c] {
      start.arrive_and_wait();
      for (int i = 0; i < kCycles && churned[c].ok(); ++i) {
        auto s = d.Open(absl::StrCat("churner-", c), 2);
        if (!s.ok()) {
          churned[c] = s.status();
          break;
        }
        auto q = (*s)->CreateSequence(TestTokenIds(1, (*s)->block_layout().tile_tokens));
        if (!q.ok()) {
          churned[c] = q.status();
          break;
        }
        const std::vector<uint32_t> ids =
            TestTokenIds(static_cast<uint32_t>(2'000'000 + c * 1000 + i * 100), 70);
        churned[c] = AppendIds(**s, q->id, ids, i);
      }  // the session ends here, its sequence unreleased
    });
  }
  for (std::thread& th : threads) th.join();

  for (int c = 0; c < kChurners; ++c)
    EXPECT_TRUE(churned[c].ok()) << "churner " << c << ": " << churned[c];
  for (int t = 0; t < kWorkers; ++t) {
    ASSERT_EQ(got[t].size(), static_cast<size_t>(kRounds)) << got[t].back().status();
    for (int r = 0; r < kRounds; ++r) {
      ASSERT_TRUE(got[t][r].ok()) << "worker " << t << " round " << r << ": " << got[t][r].status();
      ExpectSameReads(*got[t][r], want.at({t, r}), t, r);
    }
  }
  // Every session closed as it was destroyed, and took its sequences with it.
  EXPECT_EQ(d.h->sessions(), 0u);
  auto s = d.Open("tenant-a", 2);
  ASSERT_TRUE(s.ok()) << s.status();
  ExpectNothingHeld(d, **s);
}

// The commit ring serializes its callers (commit_ring.h: Commit may be called from any
// thread): threads staging their own sequences and committing them through the session's one
// ring, beside threads appending over RPCs, end with the sequences the same appends give one
// after another.
TEST(SessionThreadsTest, ThreadsCommittingThroughOneRingGetWhatSerialAppendsGive) {
  constexpr int kSteps = 150;  // past two tile boundaries
  constexpr int kRingThreads = 4;
  auto step_ids = [](int t, int i) {
    return TestTokenIds(static_cast<uint32_t>(3'000'000 + t * 10'000 + i * 3), i % 3 + 1);
  };
  Daemon d;
  ASSERT_TRUE(d.Start().ok());
  auto s = d.Open("tenant-a", 2 * kThreads);
  ASSERT_TRUE(s.ok()) << s.status();
  Session& session = **s;
  auto ring = session.OpenCommitRing();
  ASSERT_TRUE(ring.ok()) << ring.status();
  (*ring)->set_spin(absl::ZeroDuration());  // two threads per core: sleep at once

  // Two sequences per thread, each adopting the cached sink (the pool has fewer sink blocks
  // than sequences here; a prompt's last token is never adopted); thread t's steps append
  // step_ids(2t + k, i) to its k-th.
  const int tile = session.block_layout().tile_tokens;
  ASSERT_TRUE(CacheSink(session).ok());
  std::vector<uint64_t> seqs;
  for (int k = 0; k < 2 * kThreads; ++k) {
    auto q = session.CreateSequence(TestTokenIds(1, tile + 1));
    ASSERT_TRUE(q.ok()) << q.status();
    ASSERT_EQ(q->cached_tokens, static_cast<uint64_t>(tile));
    seqs.push_back(q->id);
  }
  std::vector<absl::Status> failed(kThreads);
  std::latch start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      const bool by_ring = t < kRingThreads;
      for (int i = 0; i < kSteps && failed[t].ok(); ++i) {
        std::vector<std::pair<uint64_t, std::vector<uint32_t>>> items;
        for (int k = 0; k < 2; ++k) {
          const int which = 2 * t + k;
          std::vector<uint32_t> ids = step_ids(which, i);
          auto table = session.Table(seqs[which]);
          if (!table.ok()) {
            failed[t] = table.status();
            break;
          }
          // A step that would cross the tile boundary waits for the next one.
          if (table->tail_tokens + ids.size() > static_cast<size_t>(tile))
            ids.resize(tile - table->tail_tokens);
          const std::vector<float> keys = TokenKv(ids, 0), values = TokenKv(ids, 1);
          if (by_ring) {
            failed[t] = session.Stage(seqs[which], static_cast<int>(ids.size()), keys.data(),
                                      values.data(), DType::kF32);
            items.emplace_back(seqs[which], std::move(ids));
          } else {
            failed[t] =
                session.Append(seqs[which], ids, keys.data(), values.data(), DType::kF32).status();
          }
          if (!failed[t].ok()) break;
        }
        if (!by_ring || !failed[t].ok()) continue;
        auto r = (*ring)->Commit(items);
        if (!r.ok()) {
          failed[t] = r.status();
          break;
        }
        for (const auto& item : *r) {
          if (!item.ok()) failed[t] = item.status();
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t)
    ASSERT_TRUE(failed[t].ok()) << "thread " << t << ": " << failed[t];

  // The reference: each sequence's steps, cut at the same tile boundaries, on a fresh daemon.
  Daemon ref;
  ASSERT_TRUE(ref.Start().ok());
  auto rs = ref.Open("tenant-a", 1);
  ASSERT_TRUE(rs.ok()) << rs.status();
  ASSERT_TRUE(CacheSink(**rs).ok());
  for (int which = 0; which < 2 * kThreads; ++which) {
    auto rq = (*rs)->CreateSequence(TestTokenIds(1, tile + 1));
    ASSERT_TRUE(rq.ok()) << rq.status();
    ASSERT_EQ(rq->cached_tokens, static_cast<uint64_t>(tile));
    uint64_t tokens = tile;
    for (int i = 0; i < kSteps; ++i) {
      std::vector<uint32_t> ids = step_ids(which, i);
      const uint64_t room = tile - tokens % tile;
      if (ids.size() > room) ids.resize(room);
      const std::vector<float> keys = TokenKv(ids, 0), values = TokenKv(ids, 1);
      auto r = (*rs)->Append(rq->id, ids, keys.data(), values.data(), DType::kF32);
      ASSERT_TRUE(r.ok()) << r.status();
      tokens += ids.size();
    }
    auto table = session.Table(seqs[which]);
    ASSERT_TRUE(table.ok()) << table.status();
    ASSERT_EQ(table->tokens, tokens) << "sequence " << which;
    std::vector<std::vector<float>> got, want;
    ASSERT_TRUE(Observe(session, seqs[which], 11, &got).ok());
    ASSERT_TRUE(Observe(**rs, rq->id, 11, &want).ok());
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_TRUE(SameBits(got[i], want[i])) << "sequence " << which << ", output " << i;
    ASSERT_TRUE((*rs)->Release(std::vector<uint64_t>{rq->id}).ok());
  }
  ASSERT_TRUE(session.Release(seqs).ok());
  ring->reset();
  ExpectNothingHeld(d, session);
}

}  // namespace
}  // namespace kvarn::testing
