// kvarn::Client and kvarn::Session (client/lib/client.h) against an in-process daemon: the
// KvService on a Unix socket with the descriptor channel beside it, so sessions map the pool
// exactly as they do against kvarnd (tests/daemon/service/service_harness.h).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "client/lib/client.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/client/lib/in_process_daemon.h"
#include "tests/common/wait_for.h"

namespace kvarn::testing {
namespace {

void SetDeadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
}

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    InProcessDaemon::Options o;
    o.descriptors = true;
    o.tcp = true;
    Start(o);
  }
  void TearDown() override {
    session_.reset();
    client_.reset();
    if (h_ != nullptr) {
      EXPECT_TRUE(h_->CheckInvariants().ok()) << h_->CheckInvariants();
    }
  }
  void Start(const InProcessDaemon::Options& o) {
    session_.reset();
    client_.reset();
    h_.reset();
    h_ = std::make_unique<InProcessDaemon>();
    const absl::Status s = h_->Start(o);
    ASSERT_TRUE(s.ok()) << s;
  }

  std::unique_ptr<Client> Connect(const std::string& target, ClientOptions options = {}) {
    auto c = Client::Connect(target, options, absl::Seconds(10));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  SessionOptions Options(Client& c) {
    auto d = c.Describe();
    EXPECT_TRUE(d.ok()) << d.status();
    SessionOptions o;
    o.tenant = "tenant-a";
    o.layout = d.ok() ? Client::LayoutOf(*d) : Layout{};
    o.max_sequences = 4;
    o.client_name = "client-test";
    return o;
  }

  // Connects over the Unix socket and opens a session (mapped unless told otherwise).
  void OpenMapped(ClientOptions options = {}) {
    client_ = Connect(h_->target(), options);
    ASSERT_NE(client_, nullptr);
    auto s = client_->OpenSession(Options(*client_));
    ASSERT_TRUE(s.ok()) << s.status();
    session_ = std::move(*s);
  }

  uint64_t NewSequence() {
    auto q = session_->CreateSequence({});
    EXPECT_TRUE(q.ok()) << q.status();
    return q.ok() ? q->id : 0;
  }

  // Stages n tokens of seeded f32 K/V.
  absl::Status Stage(uint64_t seq, int n, uint32_t seed) {
    const std::vector<float> k = TestKv(n, seed), v = TestKv(n, seed + 1);
    return session_->Stage(seq, n, k.data(), v.data(), DType::kF32);
  }

  // Appends `tokens` tokens through shared memory, in tail-sized pieces.
  void AppendTokens(uint64_t seq, int tokens) {
    int done = 0;
    while (done < tokens) {
      auto t = session_->Table(seq);
      ASSERT_TRUE(t.ok()) << t.status();
      const int n = std::min(64 - static_cast<int>(t->tail_tokens), tokens - done);
      const std::vector<float> k = TestKv(n, 1000u + done), v = TestKv(n, 2000u + done);
      auto r = session_->Append(seq, TestTokenIds(10 + done, n), k.data(), v.data(), DType::kF32);
      ASSERT_TRUE(r.ok()) << r.status();
      done += n;
    }
  }

  uint64_t CoreTokens(uint64_t seq) {
    auto t = h_->SequenceTokens(session_->Ref(), seq);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *t : ~0ull;
  }

  std::unique_ptr<InProcessDaemon> h_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<Session> session_;
};

TEST_F(ClientTest, ASessionOverTheUnixSocketMapsThePool) {
  OpenMapped();
  EXPECT_TRUE(session_->mapped());
  EXPECT_FALSE(session_->on_device());
  EXPECT_TRUE(session_->alive());
  EXPECT_EQ(session_->pool().backend(), v1::PoolDescription::BACKEND_HOST);
  EXPECT_EQ(session_->epoch(), h_->epoch());
  EXPECT_EQ(client_->socket_path(), h_->socket());
  EXPECT_TRUE(WaitFor([&] { return h_->lent() == 1; }));
}

TEST_F(ClientTest, TheSessionsRefCarriesItsSecret) {
  OpenMapped();
  const v1::SessionRef ref = session_->Ref();
  EXPECT_EQ(ref.session_id(), session_->id());
  EXPECT_EQ(ref.epoch(), session_->epoch());
  ASSERT_EQ(ref.secret().size(), 32u);
  EXPECT_TRUE(h_->CheckSession(ref).ok());
  v1::SessionRef wrong = ref;
  std::string secret = wrong.secret();
  secret[7] = static_cast<char>(secret[7] ^ 0x10);
  wrong.set_secret(secret);
  EXPECT_EQ(h_->CheckSession(wrong).code(), absl::StatusCode::kNotFound);
  // The raw stub with the Ref works like the Session's own calls.
  v1::StatsRequest req;
  *req.mutable_session() = ref;
  v1::StatsResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  EXPECT_TRUE(client_->stub().Stats(&ctx, req, &resp).ok());
}

TEST_F(ClientTest, CommitBatchChecksEachItemsIdsAgainstItsStagedCountBeforeSending) {
  OpenMapped();
  const uint64_t a = NewSequence(), b = NewSequence();
  ASSERT_TRUE(Stage(a, 2, 1).ok());
  ASSERT_TRUE(Stage(b, 2, 2).ok());
  auto r = session_->CommitBatch({{a, TestTokenIds(1, 2)}, {b, TestTokenIds(1, 3)}, {a + b + 100, TestTokenIds(1, 1)}});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 3u);
  ASSERT_TRUE((*r)[0].ok()) << (*r)[0].status();
  EXPECT_EQ((*r)[0]->table.tokens, 2u);
  EXPECT_EQ((*r)[1].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*r)[2].status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(h_->calls("AppendBatch"), 1);
  // b's item was not sent: the daemon committed nothing of it, and its staged tokens wait.
  EXPECT_EQ(CoreTokens(a), 2u);
  EXPECT_EQ(CoreTokens(b), 0u);
  auto again = session_->CommitBatch({{b, TestTokenIds(5, 2)}});
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE((*again)[0].ok()) << (*again)[0].status();
  EXPECT_EQ((*again)[0]->table.tokens, 2u);
  EXPECT_EQ(CoreTokens(b), 2u);
}

TEST_F(ClientTest, CommitBatchOfOnlyBadItemsSendsNoCall) {
  OpenMapped();
  const uint64_t a = NewSequence();
  ASSERT_TRUE(Stage(a, 2, 1).ok());
  auto r = session_->CommitBatch({{a, TestTokenIds(1, 1)}, {a + 100, TestTokenIds(1, 1)}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*r)[1].status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(h_->calls("AppendBatch"), 0);
  EXPECT_EQ(CoreTokens(a), 0u);
}

TEST_F(ClientTest, CommitBatchReturnsTheCallsStatusForASessionTheDaemonNoLongerKnows) {
  OpenMapped();
  const uint64_t a = NewSequence();
  ASSERT_TRUE(Stage(a, 2, 1).ok());
  ASSERT_TRUE(h_->CloseSession(session_->Ref()).ok());  // behind the Session's back
  auto r = session_->CommitBatch({{a, TestTokenIds(1, 2)}});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  EXPECT_EQ(h_->calls("AppendBatch"), 1);
}

TEST_F(ClientTest, CommitChecksTheStagedCountBeforeSending) {
  OpenMapped();
  const uint64_t a = NewSequence();
  ASSERT_TRUE(Stage(a, 3, 1).ok());
  EXPECT_EQ(session_->Commit(a, TestTokenIds(1, 2)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(h_->calls("Append"), 0);
  auto ok = session_->Commit(a, TestTokenIds(1, 3));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->table.tokens, 3u);
  EXPECT_EQ(h_->calls("Append"), 1);
}

TEST_F(ClientTest, StageRefusesTokensPastTheTailAndNonFiniteValues) {
  OpenMapped();
  const uint64_t a = NewSequence();
  ASSERT_TRUE(Stage(a, 60, 1).ok());
  EXPECT_EQ(Stage(a, 5, 2).code(), absl::StatusCode::kInvalidArgument);  // 65 > 64
  std::vector<float> k = TestKv(1, 3), v = TestKv(1, 4);
  k[3] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(session_->Stage(a, 1, k.data(), v.data(), DType::kF32).code(), absl::StatusCode::kInvalidArgument);
  // Neither refusal counted: exactly the 60 good tokens commit.
  auto r = session_->Commit(a, TestTokenIds(1, 60));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->table.tokens, 60u);
}

TEST_F(ClientTest, WithoutPoolMappingSharedMemoryCallsFailAndInlineCallsWork) {
  ClientOptions o;
  o.map_pool = false;
  OpenMapped(o);
  EXPECT_FALSE(session_->mapped());
  const uint64_t a = NewSequence();
  ASSERT_NE(a, 0u);
  EXPECT_EQ(Stage(a, 1, 1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(session_->MarkStaged(a, 1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(session_->Resident().status().code(), absl::StatusCode::kFailedPrecondition);
  std::vector<float> q(4 * 64, 0.5f), out(4 * 64);
  EXPECT_EQ(session_->Attend(a, 0, q.data(), 4, out.data()).code(), absl::StatusCode::kFailedPrecondition);
  std::vector<float> dk(64 * 64), dv(64 * 64);
  EXPECT_EQ(session_->DequantizeBlock(0, 0, 0, dk.data(), dv.data()).code(), absl::StatusCode::kFailedPrecondition);

  const std::vector<float> k = TestKv(3, 9), v = TestKv(3, 10);
  auto appended = session_->AppendInline(a, TestTokenIds(1, 3), k.data(), v.data(), DType::kF32);
  ASSERT_TRUE(appended.ok()) << appended.status();
  EXPECT_EQ(appended->table.tokens, 3u);
  std::vector<float> rk, rv;
  ASSERT_TRUE(session_->Read(a, 0, 0, 3, &rk, &rv).ok());
  ASSERT_EQ(rk.size(), 3u * 2 * 64);
  // Layer 0 of token 1, head 1, channel 5: [t][L][H][D] in, [t][H][D] out.
  EXPECT_NEAR(rk[1 * 128 + 64 + 5], k[1 * 256 + 64 + 5], 0.02);
  EXPECT_NEAR(rv[2 * 128 + 7], v[2 * 256 + 7], 0.02);
  // Nothing was lent: the session never asked for memory.
  EXPECT_EQ(h_->lent(), 0u);
  EXPECT_EQ(h_->refused(), 0u);
}

TEST_F(ClientTest, ATcpClientHasNoSharedMemoryAndAppendsInline) {
  ASSERT_GT(h_->tcp_port(), 0);
  client_ = Connect(absl::StrCat("127.0.0.1:", h_->tcp_port()));
  ASSERT_NE(client_, nullptr);
  EXPECT_TRUE(client_->socket_path().empty());
  auto s = client_->OpenSession(Options(*client_));
  ASSERT_TRUE(s.ok()) << s.status();
  session_ = std::move(*s);
  EXPECT_FALSE(session_->mapped());
  const uint64_t a = NewSequence();
  EXPECT_EQ(Stage(a, 1, 1).code(), absl::StatusCode::kFailedPrecondition);
  std::vector<float> q(4 * 64, 0.5f), out(4 * 64);
  EXPECT_EQ(session_->Attend(a, 0, q.data(), 4, out.data()).code(), absl::StatusCode::kFailedPrecondition);
  const std::vector<float> k = TestKv(2, 5), v = TestKv(2, 6);
  auto appended = session_->AppendInline(a, TestTokenIds(1, 2), k.data(), v.data(), DType::kF32);
  ASSERT_TRUE(appended.ok()) << appended.status();
  std::vector<float> rk, rv;
  EXPECT_TRUE(session_->Read(a, 1, 0, 2, &rk, &rv).ok());
  EXPECT_EQ(rk.size(), 2u * 2 * 64);
}

TEST_F(ClientTest, ResidentReportsAllocatedBytesAfterAppends) {
  OpenMapped();
  auto before = session_->Resident();
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(before->tail, 0u);
  EXPECT_EQ(before->sink, 0u);
  const uint64_t a = NewSequence();
  AppendTokens(a, 64 + 64 + 3);  // a sink tile, a quantized tile, 3 tail tokens
  auto after = session_->Resident();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_GT(after->tail, before->tail);
  EXPECT_GT(after->sink, before->sink);
  EXPECT_GT(after->quant, before->quant);
  EXPECT_LE(after->tail, session_->pool().tail_segment().bytes());
}

TEST_F(ClientTest, DequantizeBlockAndAttendReadWhatTheDaemonSealed) {
  OpenMapped();
  const uint64_t a = NewSequence();
  AppendTokens(a, 64 + 64 + 3);
  auto table = session_->Table(a);
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_TRUE(table->has_sink);
  ASSERT_EQ(table->quant_blocks.size(), 1u);
  EXPECT_EQ(table->tail_tokens, 3u);
  const int H = 2, D = 64, L = 2;
  for (int layer = 0; layer < L; ++layer) {
    // The daemon's decode of every token, the reference for what the client reads in place.
    std::vector<float> k, v, k2, v2;
    ASSERT_TRUE(session_->Read(a, layer, 0, 128, &k, &v).ok());
    ASSERT_TRUE(session_->Read(a, layer, 128, 3, &k2, &v2).ok());
    k.insert(k.end(), k2.begin(), k2.end());
    v.insert(v.end(), v2.begin(), v2.end());
    const int T = 131;
    for (int h = 0; h < H; ++h) {
      std::vector<float> dk(64 * D), dv(64 * D);
      ASSERT_TRUE(session_->DequantizeBlock(table->quant_blocks[0], layer, h, dk.data(), dv.data()).ok());
      for (int t = 0; t < 64; ++t) {
        for (int d = 0; d < D; ++d) {
          const size_t r = (static_cast<size_t>(64 + t) * H + h) * D + d;
          ASSERT_NEAR(dk[static_cast<size_t>(t * D + d)], k[r], 1e-4) << "layer " << layer << " head " << h << " token " << t;
          ASSERT_NEAR(dv[static_cast<size_t>(t * D + d)], v[r], 1e-4);
        }
      }
    }
    // Attention with 4 query heads (2 per kv-head) against a softmax over the daemon's decode.
    const int Q = 4;
    std::vector<float> q(static_cast<size_t>(Q) * D);
    for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.37f * static_cast<float>(i));
    std::vector<float> out(q.size(), 0.0f);
    ASSERT_TRUE(session_->Attend(a, layer, q.data(), Q, out.data()).ok());
    for (int qh = 0; qh < Q; ++qh) {
      const int h = qh / (Q / H);
      std::vector<double> s(T);
      double max = -1e300;
      for (int t = 0; t < T; ++t) {
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += double{q[static_cast<size_t>(qh * D + d)]} * k[(static_cast<size_t>(t) * H + h) * D + d];
        s[static_cast<size_t>(t)] = dot / std::sqrt(double{D});
        max = std::max(max, s[static_cast<size_t>(t)]);
      }
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - max));
      for (int d = 0; d < D; ++d) {
        double want = 0;
        for (int t = 0; t < T; ++t) want += s[static_cast<size_t>(t)] / sum * v[(static_cast<size_t>(t) * H + h) * D + d];
        EXPECT_NEAR(out[static_cast<size_t>(qh * D + d)], want, 2e-3) << "layer " << layer << " q-head " << qh << " d " << d;
      }
    }
  }
}

TEST_F(ClientTest, AUnixTargetWithSlashesMapsThePoolToo) {
  client_ = Connect("unix://" + h_->socket());
  ASSERT_NE(client_, nullptr);
  EXPECT_EQ(client_->socket_path(), h_->socket());
  auto s = client_->OpenSession(Options(*client_));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE((*s)->mapped());
}

TEST_F(ClientTest, LookupAndCreateSequenceAdoptACachedPrefix) {
  OpenMapped();
  const uint64_t a = NewSequence();
  AppendTokens(a, 64);  // seals the sink tile of ids 10..73
  auto sealed = session_->Table(a);
  ASSERT_TRUE(sealed.ok() && sealed->has_sink);
  const std::vector<uint32_t> prompt = TestTokenIds(10, 65);
  auto cached = session_->Lookup(prompt);
  ASSERT_TRUE(cached.ok()) << cached.status();
  EXPECT_EQ(*cached, 64u);
  EXPECT_EQ(*session_->Lookup(TestTokenIds(11, 65)), 0u);  // another prefix
  auto b = session_->CreateSequence(prompt);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->cached_tokens, 64u);
  EXPECT_TRUE(b->table.has_sink);
  EXPECT_EQ(b->table.sink_block, sealed->sink_block);
  EXPECT_EQ(b->table.tokens, 64u);
}

TEST_F(ClientTest, ForkSharesTheSealedBlocksAndCopiesTheTail) {
  OpenMapped();
  const uint64_t a = NewSequence();
  AppendTokens(a, 64 + 5);
  auto child = session_->Fork(a);
  ASSERT_TRUE(child.ok()) << child.status();
  auto parent = session_->Table(a);
  ASSERT_TRUE(parent.ok());
  EXPECT_EQ(child->table.tokens, 69u);
  EXPECT_EQ(child->table.sink_block, parent->sink_block);
  EXPECT_EQ(child->table.tail_tokens, 5u);
  EXPECT_NE(child->table.tail_slot, parent->tail_slot);
  std::vector<float> pk, pv, ck, cv;
  ASSERT_TRUE(session_->Read(a, 1, 0, 69, &pk, &pv).ok());
  ASSERT_TRUE(session_->Read(child->id, 1, 0, 69, &ck, &cv).ok());
  EXPECT_EQ(pk, ck);
  EXPECT_EQ(pv, cv);
  const uint64_t both[] = {a, child->id};
  ASSERT_TRUE(session_->Release(both).ok());
  EXPECT_EQ(session_->Table(a).status().code(), absl::StatusCode::kNotFound);
  auto listed = session_->ListSequences();
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->sequences_size(), 0);
}

TEST_F(ClientTest, WatchStreamsTheTenantsStoredEventsUntilTheCallbackDeclines) {
  OpenMapped();
  absl::Status watched = absl::UnknownError("not run");
  v1::BlockEvent first;
  std::thread watcher([&] {
    watched = session_->Watch([&](const v1::BlockEvent& e) {
      first = e;
      return false;
    });
  });
  ASSERT_TRUE(WaitFor([&] { return h_->watch_streams() == 1; }));
  const uint64_t a = NewSequence();
  AppendTokens(a, 64);
  watcher.join();
  EXPECT_TRUE(watched.ok()) << watched;
  EXPECT_EQ(first.kind(), v1::BlockEvent::KIND_STORED);
  EXPECT_EQ(first.tenant(), "tenant-a");
  EXPECT_TRUE(first.fp16());
  EXPECT_EQ(first.block(), session_->Table(a)->sink_block);
}

TEST_F(ClientTest, DestroyingTheSessionClosesIt) {
  OpenMapped();
  EXPECT_EQ(h_->sessions(), 1u);
  session_.reset();
  EXPECT_EQ(h_->sessions(), 0u);
}

TEST_F(ClientTest, TheSessionNoticesWhenTheDaemonEndsItsLease) {
  OpenMapped();
  ASSERT_TRUE(session_->alive());
  ASSERT_TRUE(h_->CloseSession(session_->Ref()).ok());
  // The keep-alive stream (every 20 ms here) learns it from the daemon.
  EXPECT_TRUE(WaitFor([&] { return !session_->alive(); }));
}

TEST_F(ClientTest, OpenSessionWithoutADescriptorChannelIsUnavailableAndLeavesNoSession) {
  InProcessDaemon::Options o;
  o.descriptors = false;
  Start(o);
  client_ = Connect(h_->target());
  ASSERT_NE(client_, nullptr);
  auto s = client_->OpenSession(Options(*client_));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnavailable) << s.status();
  // The session the daemon opened was closed again by the failed Session.
  EXPECT_EQ(h_->sessions(), 0u);
}

TEST_F(ClientTest, OpenSessionWithAnUnknownPresetIsInvalidArgumentWithoutACall) {
  client_ = Connect(h_->target());
  ASSERT_NE(client_, nullptr);
  SessionOptions o = Options(*client_);
  o.layout.preset = "no_such_preset";
  EXPECT_EQ(client_->OpenSession(o).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(h_->calls("OpenSession"), 0);
}

TEST_F(ClientTest, ConnectToNobodyIsUnavailable) {
  auto c = Client::Connect("unix:" + h_->File("nobody.sock"), {}, absl::Milliseconds(200));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace kvarn::testing
