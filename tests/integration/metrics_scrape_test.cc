// Scenario 7: a live scrape of kvarnd's /metrics after prefix-sharing traffic: promtool
// accepts it without a lint complaint, and the pool, prefix-cache, seal and RPC series carry
// the values the traffic implies.
#include <map>
#include <string>
#include <vector>

#include "tests/integration/fixture.h"

namespace kvarn::it {
namespace {

class MetricsScrapeTest : public IntegrationTest {};

TEST_F(MetricsScrapeTest, LiveScrapePassesPromtoolAndReportsTheTraffic) {
  Daemon* d = StartDaemon();
  ASSERT_NE(d, nullptr);
  ASSERT_GT(d->metrics_port(), 0);
  auto client = Connect(*d);
  ASSERT_NE(client, nullptr);
  IT_ASSIGN_OR_FAIL(a, Open(*client, "team-m"));
  IT_ASSIGN_OR_FAIL(b, Open(*client, "team-m"));

  // Scenario-1 traffic: A appends a 266-token prompt (1 sink + 3 quantized seals, 5 append
  // calls alternating in-place commits and inline appends), B creates the same prompt and
  // adopts 256 tokens, then appends the 10 others (one more call).
  const std::vector<uint32_t> prompt = Tokens(20000, 4 * kTile + 10);
  IT_ASSIGN_OR_FAIL(qa, a->CreateSequence(prompt));
  ASSERT_TRUE(AppendTokens(*a, qa.id, prompt, 0, prompt.size()).ok());
  IT_ASSIGN_OR_FAIL(qb, b->CreateSequence(prompt));
  ASSERT_EQ(qb.cached_tokens, 256u);
  ASSERT_TRUE(AppendTokens(*b, qb.id, prompt, qb.cached_tokens, prompt.size()).ok());
  IT_ASSIGN_OR_FAIL(st, a->Stats());

  // The exporter caches the core's figures for 100 ms: scrape until they show the traffic.
  std::string text;
  const double t0 = NowMs();
  for (;;) {
    IT_ASSIGN_OR_FAIL(body, HttpGet(d->metrics_port(), "/metrics"));
    text = body;
    if (MetricValue(text, "kvarn_prefix_cache_hit_tokens_total") == 256.0 || NowMs() - t0 > 3000) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }

  // promtool: exit 0, no lint output.
  IT_ASSIGN_OR_FAIL(check, RunWithInput(PromtoolBinary(), {"check", "metrics"}, text));
  EXPECT_TRUE(WIFEXITED(check.first) && WEXITSTATUS(check.first) == 0) << "promtool status " << check.first << ":\n"
                                                                       << check.second;
  EXPECT_EQ(check.second, "") << "promtool lint output";

  const auto value = [&](const std::string& name, const std::string& labels = "") {
    const std::optional<double> v = MetricValue(text, name, labels);
    EXPECT_TRUE(v.has_value()) << name << labels << " missing from the scrape:\n" << text;
    return v.value_or(-1);
  };
  // The pool's partition: per class, the states sum exactly to the class's capacity; the
  // classes sum to the pool, which is the configured 16 MiB less under a block per class; and
  // every series equals the Stats reply's `pool` row.
  const uint64_t qbytes = a->block_layout().quant_block_bytes(), fbytes = a->block_layout().fp16_block_bytes();
  EXPECT_EQ(value("kvarn_pool_configured_bytes"), 16.0 * 1024 * 1024);
  const std::map<std::string, std::vector<std::string>> states = {
      {"quant", {"free", "sealing", "active", "cached"}},
      {"sink", {"free", "sealing", "active", "cached"}},
      {"tail", {"free", "reserved", "retained"}}};
  double pool = 0;
  for (const auto& [cls, names] : states) {
    const double capacity = value("kvarn_pool_capacity_bytes", "{class=\"" + cls + "\"}");
    double sum = 0;
    for (const std::string& state : names) {
      const std::string labels = "{class=\"" + cls + "\",state=\"" + state + "\"}";
      sum += value("kvarn_pool_bytes", labels);
      const double tokens = value("kvarn_pool_tokens", labels);
      EXPECT_EQ(tokens * static_cast<double>(cls == "quant" ? qbytes : fbytes),
                value("kvarn_pool_bytes", labels) * kTile) << labels;
    }
    EXPECT_EQ(sum, capacity) << cls;
    EXPECT_EQ(value("kvarn_pool_capacity_tokens", "{class=\"" + cls + "\"}") * static_cast<double>(cls == "quant" ? qbytes : fbytes),
              capacity * kTile) << cls;
    pool += capacity;
  }
  EXPECT_EQ(pool, static_cast<double>(st.pool_bytes()));
  EXPECT_LE(pool, 16.0 * 1024 * 1024);
  EXPECT_GT(pool, 16.0 * 1024 * 1024 - static_cast<double>(qbytes + 2 * fbytes));
  ASSERT_EQ(st.pool_size(), 11);
  for (const auto& row : st.pool()) {
    EXPECT_EQ(value("kvarn_pool_bytes", "{class=\"" + row.pool_class() + "\",state=\"" + row.state() + "\"}"),
              static_cast<double>(row.bytes())) << row.pool_class() << " " << row.state();
  }
  // A's 3 quantized tiles and its sink are referenced; nothing is cached yet; both sessions
  // reserved 8 tail slots (the harness default).
  EXPECT_EQ(value("kvarn_pool_bytes", "{class=\"quant\",state=\"active\"}"), static_cast<double>(3 * qbytes));
  EXPECT_EQ(value("kvarn_pool_bytes", "{class=\"sink\",state=\"active\"}"), static_cast<double>(fbytes));
  EXPECT_EQ(value("kvarn_pool_bytes", "{class=\"quant\",state=\"cached\"}"), 0.0);
  EXPECT_EQ(value("kvarn_pool_bytes", "{class=\"tail\",state=\"reserved\"}"), static_cast<double>(2 * 8 * fbytes));
  EXPECT_EQ(value("kvarn_draining"), 0.0);
  // Prefix cache: B's 256 adopted tokens out of 2 x 266 queried.
  EXPECT_EQ(value("kvarn_prefix_cache_hit_tokens_total"), 256.0);
  EXPECT_EQ(value("kvarn_prefix_cache_queried_tokens_total"), 532.0);
  // The what-if ghosts: no eviction yet, so every scale saw B's 256 hit tokens, as the
  // Stats reply does.
  ASSERT_EQ(st.whatif_size(), 4);
  for (const char* scale : {"0.5", "1", "2", "4"}) {
    EXPECT_EQ(value("kvarn_whatif_prefix_hit_tokens_total", absl::StrCat("{capacity_scale=\"", scale, "\"}")), 256.0)
        << scale;
  }
  IT_ASSIGN_OR_FAIL(st2, a->Stats());
  for (const auto& w : st2.whatif()) EXPECT_EQ(w.hit_tokens(), 256u) << w.capacity_scale();
  // The sampled error: quantized block 0 (the first allocated) is sampled, once per method;
  // each error is a fraction, KVarN's no worse than the rotation alone on this tile.
  std::map<std::string, double> err;
  for (const char* m : {"kvarn", "hadamard", "kivi"}) {
    const std::string labels = absl::StrCat("{method=\"", m, "\"}");
    EXPECT_EQ(value("kvarn_sampled_quantization_error_ratio_count", labels), 1.0) << m;
    err[m] = value("kvarn_sampled_quantization_error_ratio_sum", labels);
    EXPECT_GT(err[m], 0.0) << m;
    EXPECT_LT(err[m], 1.0) << m;
  }
  EXPECT_LE(err["kvarn"], err["hadamard"]);
  // Seals: A's sink and 3 quantized tiles; B sealed nothing (its tail is partial).
  EXPECT_EQ(value("kvarn_seals_total", "{kind=\"quant\"}"), 3.0);
  EXPECT_EQ(value("kvarn_seals_total", "{kind=\"sink\"}"), 1.0);
  EXPECT_EQ(value("kvarn_seals_total", "{kind=\"dedup\"}"), 0.0);
  EXPECT_EQ(value("kvarn_sessions"), 2.0);
  EXPECT_EQ(value("kvarn_sequences"), 2.0);
  // RPC latency histogram: one observation per call, by method; +Inf bucket == count.
  EXPECT_EQ(value("kvarn_rpc_duration_seconds_count", "{method=\"CreateSequence\"}"), 2.0);
  EXPECT_EQ(value("kvarn_rpc_duration_seconds_bucket", "{method=\"CreateSequence\",le=\"+Inf\"}"), 2.0);
  EXPECT_EQ(value("kvarn_rpc_duration_seconds_count", "{method=\"OpenSession\"}"), 2.0);
  // A: 5 pieces (64, 64, 64, 64, 10 tokens) alternating Append / AppendInline: 3 + 2; B: 1 Append.
  EXPECT_EQ(value("kvarn_rpc_duration_seconds_count", "{method=\"Append\"}"), 4.0);
  EXPECT_EQ(value("kvarn_rpc_duration_seconds_count", "{method=\"AppendInline\"}"), 2.0);
  const double sum = value("kvarn_rpc_duration_seconds_sum", "{method=\"AppendInline\"}");
  EXPECT_GT(sum, 0.0);
  EXPECT_LT(sum, 10.0);
  EXPECT_EQ(value("kvarn_rpc_requests_total", "{method=\"CreateSequence\",code=\"OK\"}"), 2.0);
  EXPECT_EQ(value("kvarn_seal_duration_seconds_count", "{kind=\"quant\"}"), 3.0);
  EXPECT_EQ(value("kvarn_seal_duration_seconds_count", "{kind=\"sink\"}"), 1.0);
  Report(absl::StrCat("metrics scrape: ", text.size(), " bytes, promtool clean; hit tokens ",
                      value("kvarn_prefix_cache_hit_tokens_total"), ", AppendInline mean latency ",
                      sum / 2.0 * 1e3, " ms; sampled relative L2 kvarn ", err["kvarn"], " hadamard ",
                      err["hadamard"], " kivi ", err["kivi"]));
}

}  // namespace
}  // namespace kvarn::it
