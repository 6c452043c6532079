// kvarnd with huge_pages (docs/operations.md, "Huge pages") against the kernel's real huge
// page pool: a session's tail lands on huge pages that the client maps whole, commits by ring
// and by CommitBatch write the same bytes there, the metrics count the pages; with too few free
// pages, `on` refuses to start naming the pool and `try` starts on base pages and says so; a
// client that punches holes in its own tail (which would leave kvarnd a SIGBUS on its next
// touch once the pool is empty) gets its commits refused, and nobody else notices.
// deploy/test.sh reserves huge pages for the run; without them only the refusal and the
// fallback run.
#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "client/lib/commit_ring.h"
#include "tests/common/huge_pages.h"
#include "tests/integration/fixture.h"

namespace kvarn::it {
namespace {

using kvarn::testing::ReadHugePagePool;

// Whether the pool has room for a kvarnd of the harness's 16 MiB pool (its quantized and sink
// segments) and `sessions` tails of a few slots, with a margin for the segment rounding.
bool Enough(const kvarn::testing::HugePagePool& pool, int sessions) {
  return pool.page_bytes != 0 && pool.available() >= pool.PagesFor(16u << 20) + 2 + 2 * static_cast<uint64_t>(sessions);
}

class HugePagesTest : public IntegrationTest {
 protected:
  // A kvarnd with huge_pages = on, when the pool has room for it and `sessions` tails (else
  // the test is skipped, or fails if kvarnd does not start): nullptr then.
  Daemon* StartOnHugePages(const kvarn::testing::HugePagePool& pool, int sessions) {
    if (!Enough(pool, sessions)) {
      [&] { GTEST_SKIP() << "too few huge pages available (vm.nr_hugepages): " << pool.available(); }();
      return nullptr;
    }
    return StartDaemon({"--huge_pages=on"});
  }
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

// The descriptor this process holds for the segment mapped at `p` (found by the inode
// /proc/self/maps gives for the address), or -1.
int FdOfMappingAt(const void* p) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::ifstream maps("/proc/self/maps");
  std::string line;
  uint64_t inode = 0;
  while (std::getline(maps, line)) {
    std::istringstream in(line);
    std::string range, perms, offset, dev;
    uint64_t ino = 0;
    in >> range >> perms >> offset >> dev >> ino;
    const size_t dash = range.find('-');
    const uintptr_t lo = std::stoull(range.substr(0, dash), nullptr, 16), hi = std::stoull(range.substr(dash + 1), nullptr, 16);
    if (at >= lo && at < hi) inode = ino;
  }
  if (inode == 0) return -1;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::stoi(e.path().filename().string());
    struct stat st;
    if (fstat(fd, &st) == 0 && st.st_ino == inode) return fd;
  }
  return -1;
}

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
  Daemon* d = StartOnHugePages(pool, 1);
  if (d == nullptr) return;
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

TEST_F(HugePagesTest, AClientThatPunchesItsTailGetsItsCommitsRefusedUntilItIsWholeAndHurtsNobody) {
  const auto pool = ReadHugePagePool();
  Daemon* d = StartOnHugePages(pool, 2);
  if (d == nullptr) return;
  auto client = Connect(*d);
  ASSERT_NE(client, nullptr);
  IT_ASSIGN_OR_FAIL(victim, Open(*client, "victim", 2));
  IT_ASSIGN_OR_FAIL(mallory, Open(*client, "mallory", 2));
  ASSERT_EQ(victim->tail_page_bytes(), pool.page_bytes);
  ASSERT_EQ(mallory->tail_page_bytes(), pool.page_bytes);
  IT_ASSIGN_OR_FAIL(v, victim->CreateSequence({}));
  IT_ASSIGN_OR_FAIL(m, mallory->CreateSequence({}));
  const auto stage = [](Session& s, uint64_t q, uint32_t token) {
    const std::vector<uint32_t> ids = {token};
    const KvData kv = MakeKv(ids, SmallLayout(), 9);
    return s.Stage(q, 1, kv.keys.data(), kv.values.data(), DType::kF16);
  };
  const auto commit_staged = [](Session& s, uint64_t q, uint32_t token) {
    const std::vector<std::pair<uint64_t, std::vector<uint32_t>>> items = {{q, {token}}};
    auto r = s.CommitBatch(items);
    return r.ok() ? (*r)[0].status() : r.status();
  };
  const auto commit = [&](Session& s, uint64_t q, uint32_t token) {
    absl::Status st = stage(s, q, token);
    return st.ok() ? commit_staged(s, q, token) : st;
  };
  // The victim commits first: from then on its tail is sealed, and its own descriptor cannot
  // punch it either.
  IT_ASSERT_OK(commit(*victim, v.id, 0));
  IT_ASSIGN_OR_FAIL(vslot, victim->TailSlot(v.id));
  const int vfd = FdOfMappingAt(vslot.first);
  ASSERT_GE(vfd, 0);
  EXPECT_EQ(fallocate(vfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(pool.page_bytes)), -1);
  EXPECT_EQ(errno, EPERM);

  // Mallory stages a token, then punches the page under it before committing: kvarnd's scan of
  // the token would touch a page that is gone, and with the pool empty die of SIGBUS.
  IT_ASSERT_OK(stage(*mallory, m.id, 0));
  IT_ASSIGN_OR_FAIL(mslot, mallory->TailSlot(m.id));
  const int mfd = FdOfMappingAt(mslot.first);
  ASSERT_GE(mfd, 0);
  ASSERT_NE(mfd, vfd);
  ASSERT_EQ(fallocate(mfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(pool.page_bytes)), 0) << strerror(errno);
  for (int attempt = 0; attempt < 3; ++attempt) {
    const absl::Status refused = commit_staged(*mallory, m.id, 0);
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
    EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr("removed")) << refused;
  }
  IT_ASSIGN_OR_FAIL(mt, mallory->Table(m.id));
  EXPECT_EQ(mt.tokens, 0u) << "a refused commit changed the sequence";
  EXPECT_EQ(mallory->Fork(m.id).status().code(), absl::StatusCode::kFailedPrecondition);
  // The refusal sealed the tail: no more holes. Once Mallory's own write brings the page back
  // (zeros, its staged token lost), the tail is whole and its commits go through.
  EXPECT_EQ(fallocate(mfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(pool.page_bytes)), -1);
  EXPECT_EQ(errno, EPERM);
  *static_cast<volatile uint8_t*>(mslot.first) = 0;
  IT_ASSERT_OK(commit_staged(*mallory, m.id, 0));
  IT_ASSIGN_OR_FAIL(mt1, mallory->Table(m.id));
  EXPECT_EQ(mt1.tokens, 1u);

  // The victim goes on, and kvarnd is still there.
  for (uint32_t t = 1; t < 10; ++t) IT_ASSERT_OK(commit(*victim, v.id, t));
  std::vector<float> k, vv;
  IT_ASSERT_OK(victim->Read(v.id, 0, 0, 10, &k, &vv));
  EXPECT_TRUE(d->Running());
  mallory.reset();
  victim.reset();
  StopCleanly(d);
}

TEST_F(HugePagesTest, OnWithTooFewFreeHugePagesRefusesToStartNamingThePool) {
  const auto pool = ReadHugePagePool();
  const uint64_t page = pool.page_bytes ? pool.page_bytes : 2u << 20;
  DaemonOptions o;
  // The quantized segment (most of the capacity) needs more pages than the pool has.
  o.extra_flags = {"--huge_pages=on", absl::StrCat("--capacity=", 2 * pool.Impossible() * page)};
  auto d = Daemon::Start(o);
  ASSERT_FALSE(d.ok()) << "kvarnd started on more huge pages than are free";
  EXPECT_THAT(std::string(d.status().message()), ::testing::HasSubstr("huge pages")) << d.status();
  EXPECT_THAT(std::string(d.status().message()), ::testing::HasSubstr("huge_pages = on")) << d.status();
}

TEST_F(HugePagesTest, TryWithTooFewFreeHugePagesStartsOnBasePagesAndSaysSo) {
  const auto pool = ReadHugePagePool();
  const uint64_t page = pool.page_bytes ? pool.page_bytes : 2u << 20;
  // Neither the quantized nor the sink segment (a sixteenth of the capacity) fits the pool, so
  // this kvarnd holds none of its pages beside other tests.
  const uint64_t capacity = 17 * pool.Impossible() * page;
  if (capacity > (8ull << 30)) GTEST_SKIP() << "a pool of " << pool.total << " huge pages is too large to outsize here";
  Daemon* d = StartDaemon({"--huge_pages=try", absl::StrCat("--capacity=", capacity)});
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
