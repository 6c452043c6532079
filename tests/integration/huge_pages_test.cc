// kvarnd with huge_pages (docs/operations.md, "Huge pages") against the kernel's real huge
// page pool: a session's tail lands on huge pages that the client maps whole, commits by ring
// and by CommitBatch write the same bytes there, the metrics count the pages; with too few free
// pages, `on` refuses to start naming the pool and `try` starts on base pages and says so.
// CI reserves huge pages (.ci/run); without free ones only the refusal and fallback run.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "client/lib/commit_ring.h"
#include "tests/common/huge_pages.h"
#include "tests/integration/fixture.h"

namespace kvarn::it {
namespace {

using kvarn::testing::ReadHugePagePool;

class HugePagesTest : public IntegrationTest {
 protected:
  // The value of one series now.
  std::optional<double> Metric(const Daemon& d, const std::string& name, const std::string& labels) {
    auto text = HttpGet(d.metrics_port(), "/metrics");
    return text.ok() ? MetricValue(*text, name, labels) : std::nullopt;
  }
  // The value of one series, polled until it equals `want` or 10 s pass (gauges are cached
  // for up to 100 ms).
  std::optional<double> AwaitMetric(const Daemon& d, const std::string& name, const std::string& labels, double want) {
    std::optional<double> v;
    const double until = NowMs() + 10000;
    for (;;) {
      v = Metric(d, name, labels);
      if (v == want || NowMs() > until) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // between polls
    }
    return v;
  }
};

// One token of every sequence in `seqs`, staged and committed through `commit`.
template <typename Commit>
void StepAll(Session& s, const std::vector<uint64_t>& seqs, uint32_t token, Commit&& commit) {
  const std::vector<uint32_t> ids = {token};
  const KvData kv = MakeKv(ids, SmallLayout(), 7);
  std::vector<std::pair<uint64_t, std::vector<uint32_t>>> items;
  for (uint64_t q : seqs) {
    ASSERT_TRUE(s.Stage(q, 1, kv.keys.data(), kv.values.data(), DType::kF16).ok());
    items.push_back({q, {token}});
  }
  commit(items);
}

TEST_F(HugePagesTest, ATailOnHugePagesIsMappedWholeAndCommitsLandInIt) {
  const auto pool = ReadHugePagePool();
  // 16 MiB of pool and one tail: 9 pages of 2 MiB.
  if (pool.page_bytes == 0 || pool.free_pages * pool.page_bytes < (24u << 20)) {
    GTEST_SKIP() << "needs 24 MiB of free huge pages (vm.nr_hugepages); " << pool.free_pages << " free";
  }
  Daemon* d = StartDaemon({"--huge_pages=on"});
  ASSERT_NE(d, nullptr);
  EXPECT_THAT(d->Log(), ::testing::HasSubstr("huge_pages=on"));
  auto client = Connect(*d);
  ASSERT_NE(client, nullptr);
  IT_ASSIGN_OR_FAIL(s, Open(*client, "huge", 4));
  EXPECT_EQ(s->tail_page_bytes(), pool.page_bytes) << "the tail is not on huge pages";
  const uint64_t tail_bytes = s->pool().tail_segment().bytes();
  EXPECT_EQ(tail_bytes % pool.page_bytes, 0u) << "a huge page segment is whole pages";
  EXPECT_EQ(AwaitMetric(*d, "kvarn_pool_huge_page_bytes", "{class=\"tail\"}", static_cast<double>(tail_bytes)),
            static_cast<double>(tail_bytes));
  EXPECT_EQ(Metric(*d, "kvarn_pool_huge_page_bytes", "{class=\"quant\"}"),
            static_cast<double>(s->pool().quant_segments(0).bytes()));
  EXPECT_EQ(Metric(*d, "kvarn_pool_huge_page_fallbacks_total", ""), 0.0);

  // Two sequences by ring, two by CommitBatch, the same tokens: the same bytes come back.
  IT_ASSIGN_OR_FAIL(ring, s->OpenCommitRing());
  std::vector<uint64_t> by_ring, by_batch;
  for (int i = 0; i < 2; ++i) {
    by_ring.push_back(s->CreateSequence({})->id);
    by_batch.push_back(s->CreateSequence({})->id);
  }
  constexpr uint32_t kSteps = 20;
  for (uint32_t t = 0; t < kSteps; ++t) {
    StepAll(*s, by_ring, t, [&](const auto& items) {
      auto r = ring->Commit(items);
      ASSERT_TRUE(r.ok()) << r.status();
      for (const auto& it : *r) ASSERT_TRUE(it.ok()) << it.status();
    });
    StepAll(*s, by_batch, t, [&](const auto& items) {
      auto r = s->CommitBatch(items);
      ASSERT_TRUE(r.ok()) << r.status();
      for (const auto& it : *r) ASSERT_TRUE(it.ok()) << it.status();
    });
  }
  std::vector<uint32_t> ids(kSteps);
  for (uint32_t t = 0; t < kSteps; ++t) ids[t] = t;
  const KvData kv = MakeKv(ids, SmallLayout(), 7);
  const std::vector<float> want_k = kv.KeysF32(), want_v = kv.ValuesF32();
  const Layout l = SmallLayout();
  const size_t row = static_cast<size_t>(l.num_kv_heads) * l.head_dim;
  // The tail holds the storage frame in fp16; Read rotates back, so the original values come
  // back to within fp16 rounding, and a ring's sequence reads exactly like CommitBatch's.
  for (uint32_t layer = 0; layer < l.num_layers; ++layer) {
    std::vector<float> first_k, first_v;
    for (uint64_t q : {by_ring[0], by_ring[1], by_batch[0], by_batch[1]}) {
      std::vector<float> k, v;
      IT_ASSERT_OK(s->Read(q, layer, 0, kSteps, &k, &v));
      ASSERT_EQ(k.size(), kSteps * row);
      float worst = 0;
      for (uint32_t t = 0; t < kSteps; ++t) {
        const size_t at = (static_cast<size_t>(t) * l.num_layers + layer) * row;
        for (size_t i = 0; i < row; ++i) {
          worst = std::max({worst, std::abs(k[t * row + i] - want_k[at + i]), std::abs(v[t * row + i] - want_v[at + i])});
        }
      }
      EXPECT_LT(worst, 1e-2f) << "seq " << q << " layer " << layer;
      if (first_k.empty()) {
        first_k = k;
        first_v = v;
      } else {
        EXPECT_EQ(k, first_k) << "seq " << q << " layer " << layer;
        EXPECT_EQ(v, first_v) << "seq " << q << " layer " << layer;
      }
    }
  }

  // The session's pages go back when it closes.
  ring.reset();
  s.reset();
  EXPECT_EQ(AwaitMetric(*d, "kvarn_pool_huge_page_bytes", "{class=\"tail\"}", 0), 0.0);
  StopCleanly(d);
}

TEST_F(HugePagesTest, OnWithTooFewFreeHugePagesRefusesToStartNamingThePool) {
  const auto pool = ReadHugePagePool();
  const uint64_t page = pool.page_bytes ? pool.page_bytes : 2u << 20;
  DaemonOptions o;
  // The quantized and sink segments (most of the capacity) need more pages than are free.
  o.extra_flags = {"--huge_pages=on", absl::StrCat("--capacity=", 2 * (pool.free_pages + 16) * page)};
  auto d = Daemon::Start(o);
  ASSERT_FALSE(d.ok()) << "kvarnd started on more huge pages than are free";
  EXPECT_THAT(std::string(d.status().message()), ::testing::HasSubstr("huge pages")) << d.status();
  EXPECT_THAT(std::string(d.status().message()), ::testing::HasSubstr("huge_pages = on")) << d.status();
}

TEST_F(HugePagesTest, TryWithTooFewFreeHugePagesStartsOnBasePagesAndSaysSo) {
  const auto pool = ReadHugePagePool();
  const uint64_t page = pool.page_bytes ? pool.page_bytes : 2u << 20;
  Daemon* d = StartDaemon({"--huge_pages=try", absl::StrCat("--capacity=", 2 * (pool.free_pages + 16) * page)});
  ASSERT_NE(d, nullptr);
  EXPECT_THAT(d->Log(), ::testing::HasSubstr("event=huge_pages_unavailable"));
  EXPECT_GE(Metric(*d, "kvarn_pool_huge_page_fallbacks_total", "").value_or(0), 1.0);
  auto client = Connect(*d);
  ASSERT_NE(client, nullptr);
  IT_ASSIGN_OR_FAIL(s, Open(*client, "fallback", 2));
  // The tail may still fit on huge pages; the client maps whichever it got.
  const bool tail_huge = s->tail_page_bytes() == page;
  EXPECT_TRUE(tail_huge || s->tail_page_bytes() == static_cast<uint64_t>(sysconf(_SC_PAGESIZE))) << s->tail_page_bytes();
  EXPECT_EQ(AwaitMetric(*d, "kvarn_pool_huge_page_bytes", "{class=\"tail\"}", tail_huge ? s->pool().tail_segment().bytes() : 0),
            tail_huge ? static_cast<double>(s->pool().tail_segment().bytes()) : 0.0);
  IT_ASSIGN_OR_FAIL(q, s->CreateSequence({}));
  StepAll(*s, {q.id}, 5, [&](const auto& items) {
    auto r = s->CommitBatch(items);
    ASSERT_TRUE(r.ok()) << r.status();
    for (const auto& it : *r) ASSERT_TRUE(it.ok()) << it.status();
  });
  IT_ASSIGN_OR_FAIL(t, s->Table(q.id));
  EXPECT_EQ(t.tokens, 1u);
}

}  // namespace
}  // namespace kvarn::it
