// kvarn::Router (client/lib/router.h) against an in-process daemon: options checked, a
// tenant's session proving its index complete and ranking from it, an endpoint where nothing
// listens ranked last with its error. The multi-node scenarios (restart, tiers, the CLI) are
// in tests/integration/route_test.cc.
#include "client/lib/router.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "tests/client/lib/in_process_daemon.h"

namespace kvarn::testing {
namespace {

constexpr uint32_t kTile = 64;

RouterOptions Options(std::vector<std::string> endpoints) {
  RouterOptions o;
  o.endpoints = std::move(endpoints);
  o.tenant = "tenant-a";
  o.connect_timeout = absl::Milliseconds(500);
  o.backoff_max = absl::Milliseconds(200);
  return o;
}

TEST(RouterOptionsTest, BadOptionsAreInvalidArgument) {
  EXPECT_EQ(Router::Create(Options({})).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Router::Create(Options({"unix:/x", ""})).status().code(),
            absl::StatusCode::kInvalidArgument);
  RouterOptions o = Options({"unix:/x"});
  o.tenant = "";
  EXPECT_EQ(Router::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options({"unix:/x"});
  o.disk_weight = 1.5;
  EXPECT_EQ(Router::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options({"unix:/x"});
  o.backoff_max = absl::Milliseconds(1);
  EXPECT_EQ(Router::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

class RouterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    h_ = std::make_unique<InProcessDaemon>();
    const absl::Status s = h_->Start({});
    ASSERT_TRUE(s.ok()) << s;
  }
  void TearDown() override {
    if (h_ != nullptr) {
      EXPECT_TRUE(h_->CheckInvariants().ok()) << h_->CheckInvariants();
    }
  }

  // Appends `prompt` through a session of tenant-a, in tail-sized pieces, and releases it.
  void Prefill(const std::vector<uint32_t>& prompt) {
    auto c = Client::Connect(h_->target(), {}, absl::Seconds(10));
    ASSERT_TRUE(c.ok()) << c.status();
    auto d = (*c)->Describe();
    ASSERT_TRUE(d.ok()) << d.status();
    SessionOptions so;
    so.tenant = "tenant-a";
    so.layout = Client::LayoutOf(*d);
    so.max_sequences = 1;
    auto s = (*c)->OpenSession(so);
    ASSERT_TRUE(s.ok()) << s.status();
    auto seq = (*s)->CreateSequence({});
    ASSERT_TRUE(seq.ok()) << seq.status();
    size_t done = 0;
    while (done < prompt.size()) {
      auto t = (*s)->Table(seq->id);
      ASSERT_TRUE(t.ok()) << t.status();
      const int n = std::min<int>(kTile - t->tail_tokens, static_cast<int>(prompt.size() - done));
      const std::vector<float> k = TestKv(n, 1000u + done), v = TestKv(n, 2000u + done);
      auto r = (*s)->Append(seq->id, std::span<const uint32_t>(prompt).subspan(done, n), k.data(),
                            v.data(), DType::kF32);
      ASSERT_TRUE(r.ok()) << r.status();
      done += n;
    }
    const uint64_t ids[] = {seq->id};
    ASSERT_TRUE((*s)->Release(ids).ok());
  }

  std::unique_ptr<InProcessDaemon> h_;
};

TEST_F(RouterTest, TenantIndexProvenCompleteRanksFromWatchAndUnreachableLast) {
  const std::string absent = h_->File("nobody-listens.sock");
  auto router = Router::Create(Options({"unix:" + absent, h_->target()}));
  ASSERT_TRUE(router.ok()) << router.status();
  Router& r = **router;
  ASSERT_EQ(r.num_endpoints(), 2u);
  EXPECT_EQ(r.Info(0).state, IndexState::kDisconnected);
  EXPECT_FALSE(r.Info(0).last_error.ok());
  ASSERT_TRUE(r.Await([&] { return r.Info(1).state != IndexState::kDisconnected; },
                      absl::Now() + absl::Seconds(10)));

  // Before any event the index proves nothing: Lookup answers.
  const std::vector<uint32_t> prompt = TestTokenIds(10, 2 * kTile + 1);
  std::vector<RouteResult> ranked = r.Rank(prompt);
  ASSERT_EQ(ranked.size(), 2u);
  EXPECT_EQ(ranked[0].endpoint_index, 1u);
  EXPECT_EQ(ranked[0].source, RouteSource::kLookup);
  EXPECT_EQ(ranked[0].cached_tokens, 0u);
  EXPECT_EQ(ranked[0].epoch, h_->epoch());

  Prefill(prompt);
  ASSERT_TRUE(r.Await(
      [&] {
        auto m = r.IndexMatch(1, prompt);
        return r.Info(1).state == IndexState::kComplete && m.ok() && m->pool == 2 * kTile;
      },
      absl::Now() + absl::Seconds(10)))
      << IndexStateName(r.Info(1).state);
  ranked = r.Rank(prompt);
  EXPECT_EQ(ranked[0].endpoint_index, 1u);
  EXPECT_TRUE(ranked[0].status.ok()) << ranked[0].status;
  EXPECT_EQ(ranked[0].source, RouteSource::kWatchIndex);
  EXPECT_EQ(ranked[0].cached_tokens, 2 * kTile);
  EXPECT_EQ(ranked[0].tokens.pool, 2 * kTile);
  EXPECT_EQ(ranked[1].endpoint_index, 0u);
  EXPECT_FALSE(ranked[1].status.ok());
  EXPECT_EQ(ranked[1].source, RouteSource::kNone);

  // The same prompt one token shorter adopts one tile less (the last token is computed).
  const std::vector<uint32_t> shorter(prompt.begin(), prompt.end() - 1);
  EXPECT_EQ(r.Rank(shorter)[0].cached_tokens, kTile);
  // verify: Lookup agrees with the index.
  ranked = r.Rank(prompt, RankOptions{.verify = true});
  EXPECT_EQ(ranked[0].source, RouteSource::kLookup);
  EXPECT_EQ(ranked[0].cached_tokens, 2 * kTile);
}

TEST_F(RouterTest, DaemonGoneEndsTheStreamAndTheEndpointAnswersWithItsError) {
  auto router = Router::Create(Options({h_->target()}));
  ASSERT_TRUE(router.ok()) << router.status();
  Router& r = **router;
  ASSERT_TRUE(r.Await([&] { return r.Info(0).state != IndexState::kDisconnected; },
                      absl::Now() + absl::Seconds(10)));
  const std::vector<uint32_t> prompt = TestTokenIds(10, 2 * kTile + 1);
  Prefill(prompt);
  ASSERT_TRUE(r.Await([&] { return r.Info(0).state == IndexState::kComplete; },
                      absl::Now() + absl::Seconds(10)));
  const uint64_t streams = r.Info(0).streams;

  // The daemon stops: the stream ends, the index is dropped, the thread retries with backoff
  // (against nothing), and Rank answers at once with the error instead of a stale index.
  h_.reset();
  ASSERT_TRUE(r.Await([&] { return r.Info(0).state == IndexState::kDisconnected; },
                      absl::Now() + absl::Seconds(10)));
  EXPECT_EQ(r.Info(0).indexed_blocks, 0u);
  EXPECT_FALSE(r.Info(0).last_error.ok());
  const std::vector<RouteResult> ranked = r.Rank(prompt);
  ASSERT_EQ(ranked.size(), 1u);
  EXPECT_FALSE(ranked[0].status.ok());
  EXPECT_EQ(ranked[0].source, RouteSource::kNone);
  EXPECT_EQ(ranked[0].cached_tokens, 0u);
  EXPECT_EQ(r.Info(0).streams, streams) << "no stream opens against a daemon that is gone";
  // Destruction (the thread in a backoff wait or a connection attempt) ends the test.
}

}  // namespace
}  // namespace kvarn::testing
