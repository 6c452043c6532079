#include "daemon/metrics/registry.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvarn::metrics {
namespace {

using ::testing::DoubleEq;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

template <typename T>
T* Unwrap(absl::StatusOr<T*> result) {
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? *result : nullptr;
}

TEST(MetricsRegistryTest, EmptyRegistrySerializesToNothing) {
  Registry registry;
  EXPECT_EQ(registry.Serialize(), "");
}

TEST(MetricsRegistryTest, UnlabelledCounterReadsZeroFromRegistration) {
  Registry registry;
  Unwrap(registry.AddCounter("kvarn_seals_total", "Tiles sealed."));
  EXPECT_EQ(registry.Serialize(),
            "# HELP kvarn_seals_total Tiles sealed.\n"
            "# TYPE kvarn_seals_total counter\n"
            "kvarn_seals_total 0\n");
}

TEST(MetricsRegistryTest, CounterAddsWholeAndFractionalIncrements) {
  Registry registry;
  CounterFamily* family = Unwrap(registry.AddCounter("kvarn_busy_seconds_total", "Busy time."));
  Counter& counter = family->WithLabels({});
  counter.Increment();
  counter.Increment(4);
  counter.Add(0.25);
  counter.Add(-3);                                        // dropped: counters never go down
  counter.Add(std::numeric_limits<double>::quiet_NaN());  // dropped
  EXPECT_EQ(counter.Value(), 5.25);
  EXPECT_EQ(registry.Serialize(),
            "# HELP kvarn_busy_seconds_total Busy time.\n"
            "# TYPE kvarn_busy_seconds_total counter\n"
            "kvarn_busy_seconds_total 5.25\n");
}

TEST(MetricsRegistryTest, GaugeSetsIncrementsAndDecrements) {
  Registry registry;
  GaugeFamily* family = Unwrap(registry.AddGauge("kvarn_sessions", "Open sessions."));
  Gauge& gauge = family->WithLabels({});
  gauge.Set(10);
  gauge.Increment();
  gauge.Decrement(3.5);
  EXPECT_EQ(registry.Serialize(),
            "# HELP kvarn_sessions Open sessions.\n"
            "# TYPE kvarn_sessions gauge\n"
            "kvarn_sessions 7.5\n");
}

TEST(MetricsRegistryTest, LabelledFamilyPrintsSeriesInLabelOrderAndNothingWhenEmpty) {
  Registry registry;
  CounterFamily* family = Unwrap(registry.AddCounter(
      "kvarn_evictions_total", "Blocks evicted, by reason and tenant.", {"reason", "tenant"}));
  EXPECT_EQ(registry.Serialize(), "");  // no series yet
  family->WithLabels({"pressure", "b"}).Increment(2);
  family->WithLabels({"request", "a"}).Increment();
  family->WithLabels({"pressure", "a"}).Increment(3);
  EXPECT_EQ(registry.Serialize(),
            "# HELP kvarn_evictions_total Blocks evicted, by reason and tenant.\n"
            "# TYPE kvarn_evictions_total counter\n"
            "kvarn_evictions_total{reason=\"pressure\",tenant=\"a\"} 3\n"
            "kvarn_evictions_total{reason=\"pressure\",tenant=\"b\"} 2\n"
            "kvarn_evictions_total{reason=\"request\",tenant=\"a\"} 1\n");
}

TEST(MetricsRegistryTest, WithLabelsReturnsTheSameSeriesEveryTime) {
  Registry registry;
  GaugeFamily* family = Unwrap(registry.AddGauge("g", "A gauge.", {"k"}));
  Gauge& first = family->WithLabels({"v"});
  for (int i = 0; i < 100; ++i) family->WithLabels({absl::StrCat("other", i)});
  Gauge& again = family->WithLabels({"v"});
  EXPECT_EQ(&first, &again);
  absl::StatusOr<Gauge*> tried = family->TryWithLabels({"v"});
  ASSERT_TRUE(tried.ok());
  EXPECT_EQ(*tried, &first);
}

TEST(MetricsRegistryTest, FamiliesPrintInNameOrder) {
  Registry registry;
  Unwrap(registry.AddGauge("zeta", "Z."));
  Unwrap(registry.AddGauge("alpha", "A."));
  Unwrap(registry.AddCounter("mid_total", "M."));
  EXPECT_EQ(registry.Serialize(),
            "# HELP alpha A.\n# TYPE alpha gauge\nalpha 0\n"
            "# HELP mid_total M.\n# TYPE mid_total counter\nmid_total 0\n"
            "# HELP zeta Z.\n# TYPE zeta gauge\nzeta 0\n");
}

TEST(MetricsRegistryTest, HistogramPrintsCumulativeBucketsSumAndCount) {
  Registry registry;
  HistogramFamily* family = Unwrap(registry.AddHistogram(
      "kvarn_seal_duration_seconds", "Time to seal one tile.", {0.001, 0.01, 0.1}));
  Histogram& histogram = family->WithLabels({});
  // Binary fractions, so the expected _sum is exact.
  histogram.Observe(0.0009765625);  // 2^-10
  histogram.Observe(0.0078125);     // 2^-7
  histogram.Observe(0.0625);
  histogram.Observe(2);
  histogram.Observe(std::numeric_limits<double>::quiet_NaN());  // dropped
  EXPECT_EQ(registry.Serialize(),
            "# HELP kvarn_seal_duration_seconds Time to seal one tile.\n"
            "# TYPE kvarn_seal_duration_seconds histogram\n"
            "kvarn_seal_duration_seconds_bucket{le=\"0.001\"} 1\n"
            "kvarn_seal_duration_seconds_bucket{le=\"0.01\"} 2\n"
            "kvarn_seal_duration_seconds_bucket{le=\"0.1\"} 3\n"
            "kvarn_seal_duration_seconds_bucket{le=\"+Inf\"} 4\n"
            "kvarn_seal_duration_seconds_sum 2.0712890625\n"
            "kvarn_seal_duration_seconds_count 4\n");
}

TEST(MetricsRegistryTest, LabelledHistogramPutsLeLast) {
  Registry registry;
  HistogramFamily* family =
      Unwrap(registry.AddHistogram("rpc_seconds", "RPC latency.", {1, 2.5}, {"method"}));
  family->WithLabels({"Append"}).Observe(2);
  family->WithLabels({"Open"}).Observe(-1);
  family->WithLabels({"Open"}).Observe(1);  // on a bound: "le" is inclusive
  EXPECT_EQ(registry.Serialize(),
            "# HELP rpc_seconds RPC latency.\n"
            "# TYPE rpc_seconds histogram\n"
            "rpc_seconds_bucket{method=\"Append\",le=\"1\"} 0\n"
            "rpc_seconds_bucket{method=\"Append\",le=\"2.5\"} 1\n"
            "rpc_seconds_bucket{method=\"Append\",le=\"+Inf\"} 1\n"
            "rpc_seconds_sum{method=\"Append\"} 2\n"
            "rpc_seconds_count{method=\"Append\"} 1\n"
            "rpc_seconds_bucket{method=\"Open\",le=\"1\"} 2\n"
            "rpc_seconds_bucket{method=\"Open\",le=\"2.5\"} 2\n"
            "rpc_seconds_bucket{method=\"Open\",le=\"+Inf\"} 2\n"
            "rpc_seconds_sum{method=\"Open\"} 0\n"
            "rpc_seconds_count{method=\"Open\"} 2\n");
}

TEST(MetricsRegistryTest, HistogramWithoutBoundsHasOnlyInfBucketAndTrailingInfIsDropped) {
  Registry registry;
  HistogramFamily* none = Unwrap(registry.AddHistogram("h_none", "H.", {}));
  none->WithLabels({}).Observe(7);
  HistogramFamily* inf =
      Unwrap(registry.AddHistogram("h_inf", "H.", {1, std::numeric_limits<double>::infinity()}));
  EXPECT_EQ(inf->bucket_bounds(), std::vector<double>{1});
  EXPECT_EQ(registry.Serialize(),
            "# HELP h_inf H.\n# TYPE h_inf histogram\n"
            "h_inf_bucket{le=\"1\"} 0\nh_inf_bucket{le=\"+Inf\"} 0\nh_inf_sum 0\nh_inf_count 0\n"
            "# HELP h_none H.\n# TYPE h_none histogram\n"
            "h_none_bucket{le=\"+Inf\"} 1\nh_none_sum 7\nh_none_count 1\n");
}

TEST(MetricsRegistryTest, BucketBoundsAreSpelledLikeTheGoClient) {
  Registry registry;
  Unwrap(registry.AddHistogram("size_bytes", "S.", {0.0001, 1e6}));
  EXPECT_EQ(registry.Serialize(),
            "# HELP size_bytes S.\n# TYPE size_bytes histogram\n"
            "size_bytes_bucket{le=\"0.0001\"} 0\n"
            "size_bytes_bucket{le=\"1e+06\"} 0\n"
            "size_bytes_bucket{le=\"+Inf\"} 0\n"
            "size_bytes_sum 0\nsize_bytes_count 0\n");
}

TEST(MetricsRegistryTest, CallbackMayRegisterOtherFamiliesWithoutDeadlock) {
  Registry registry;
  CallbackFamily* family = Unwrap(registry.AddCallbackGauge("lazy", "L."));
  ASSERT_TRUE(family
                  ->SetCallback({},
                                [&registry] {
                                  // The registry lock is not held while callbacks run.
                                  return registry.AddGauge("other", "O.").ok() ? 1.0 : 0.0;
                                })
                  .ok());
  EXPECT_THAT(registry.Serialize(), HasSubstr("lazy 1\n"));
  EXPECT_THAT(registry.Serialize(), HasSubstr("other 0\n"));
}

TEST(MetricsRegistryTest, EscapesHelpAndLabelValues) {
  Registry registry;
  CounterFamily* family =
      Unwrap(registry.AddCounter("odd_total", "Line one\nback\\slash \"quoted\".", {"path"}));
  family->WithLabels({"C:\\dir\n\"x\""}).Increment();
  EXPECT_EQ(registry.Serialize(),
            "# HELP odd_total Line one\\nback\\\\slash \"quoted\".\n"
            "# TYPE odd_total counter\n"
            "odd_total{path=\"C:\\\\dir\\n\\\"x\\\"\"} 1\n");
}

TEST(MetricsRegistryTest, PrintsSpecialFloatValues) {
  Registry registry;
  GaugeFamily* family = Unwrap(registry.AddGauge("g", "G.", {"v"}));
  family->WithLabels({"nan"}).Set(std::numeric_limits<double>::quiet_NaN());
  family->WithLabels({"pinf"}).Set(std::numeric_limits<double>::infinity());
  family->WithLabels({"ninf"}).Set(-std::numeric_limits<double>::infinity());
  family->WithLabels({"tiny"}).Set(1e-300);
  EXPECT_EQ(registry.Serialize(),
            "# HELP g G.\n# TYPE g gauge\n"
            "g{v=\"nan\"} NaN\n"
            "g{v=\"ninf\"} -Inf\n"
            "g{v=\"pinf\"} +Inf\n"
            "g{v=\"tiny\"} 1e-300\n");
}

TEST(MetricsRegistryTest, CallbackGaugeIsComputedAtScrapeTimePerLabelSet) {
  Registry registry;
  CallbackFamily* family = Unwrap(
      registry.AddCallbackGauge("kvarn_pool_bytes", "Pool bytes by block state.", {"state"}));
  double used = 100;
  ASSERT_TRUE(family->SetCallback({"used"}, [&used] { return used; }).ok());
  ASSERT_TRUE(family->SetCallback({"free"}, [] { return 924.0; }).ok());
  EXPECT_EQ(registry.Serialize(),
            "# HELP kvarn_pool_bytes Pool bytes by block state.\n"
            "# TYPE kvarn_pool_bytes gauge\n"
            "kvarn_pool_bytes{state=\"free\"} 924\n"
            "kvarn_pool_bytes{state=\"used\"} 100\n");
  used = 300;
  ASSERT_TRUE(family->SetCallback({"free"}, [] { return 724.0; }).ok());  // replaces
  EXPECT_THAT(registry.Serialize(), HasSubstr("kvarn_pool_bytes{state=\"free\"} 724\n"
                                              "kvarn_pool_bytes{state=\"used\"} 300\n"));
  ASSERT_TRUE(family->RemoveCallback({"used"}).ok());
  EXPECT_EQ(family->RemoveCallback({"used"}).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(family->RemoveCallback({"free"}).ok());
  EXPECT_EQ(registry.Serialize(), "");
}

TEST(MetricsRegistryTest, CallbackCounterHasCounterType) {
  Registry registry;
  CallbackFamily* family = Unwrap(registry.AddCallbackCounter("hits_total", "Hits."));
  ASSERT_TRUE(family->SetCallback({}, [] { return 12.0; }).ok());
  EXPECT_EQ(registry.Serialize(),
            "# HELP hits_total Hits.\n# TYPE hits_total counter\nhits_total 12\n");
}

TEST(MetricsRegistryTest, CallbackRejectsBadLabelsAndEmptyFunction) {
  Registry registry;
  CallbackFamily* family = Unwrap(registry.AddCallbackGauge("cap", "Capacity.", {"class"}));
  EXPECT_EQ(family->SetCallback({}, [] { return 1.0; }).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(family->SetCallback({"a", "b"}, [] { return 1.0; }).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(family->SetCallback({"fp16"}, nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.Serialize(), "");
}

TEST(MetricsRegistryTest, RejectsInvalidNamesWithInvalidArgument) {
  Registry registry;
  EXPECT_EQ(registry.AddCounter("bad-name", "H.").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddGauge("", "H.").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddGauge("0day", "H.").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddGauge("g", "H.", {"bad label"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddGauge("g", "H.", {"__reserved"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(registry.AddGauge("g", "H.", {"a", "a"}).status().message(),
              HasSubstr("appears twice"));
  EXPECT_THAT(registry.AddHistogram("h", "H.", {1}, {"le"}).status().message(),
              HasSubstr("reserved for histogram buckets"));
  EXPECT_THAT(registry.AddGauge("g", "").status().message(), HasSubstr("help text is empty"));
  EXPECT_EQ(registry.AddGauge("g", "bad \xff help").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.Serialize(), "");  // nothing half-registered
}

TEST(MetricsRegistryTest, RejectsBadBucketBounds) {
  Registry registry;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_THAT(registry.AddHistogram("h", "H.", {1, 1}).status().message(),
              HasSubstr("strictly increase"));
  EXPECT_FALSE(registry.AddHistogram("h", "H.", {2, 1}).ok());
  EXPECT_FALSE(registry.AddHistogram("h", "H.", {nan}).ok());
  EXPECT_FALSE(registry.AddHistogram("h", "H.", {-inf, 1}).ok());
  EXPECT_FALSE(registry.AddHistogram("h", "H.", {inf, inf}).ok());
}

TEST(MetricsRegistryTest, SameNameWithDifferentTypeIsAlreadyExists) {
  Registry registry;
  Unwrap(registry.AddCounter("x_total", "X."));
  absl::StatusOr<GaugeFamily*> gauge = registry.AddGauge("x_total", "X.");
  EXPECT_EQ(gauge.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(gauge.status().message(), HasSubstr("already registered as a counter"));
  EXPECT_EQ(registry.AddCallbackCounter("x_total", "X.").status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry.AddHistogram("x_total", "X.", {1}).status().code(),
            absl::StatusCode::kAlreadyExists);
}

TEST(MetricsRegistryTest, SameFamilyTwiceReturnsItButDifferentShapeIsAnError) {
  Registry registry;
  CounterFamily* first = Unwrap(registry.AddCounter("y_total", "Y.", {"a"}));
  EXPECT_EQ(Unwrap(registry.AddCounter("y_total", "Y.", {"a"})), first);
  EXPECT_EQ(registry.AddCounter("y_total", "Other help.", {"a"}).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry.AddCounter("y_total", "Y.", {"b"}).status().code(),
            absl::StatusCode::kAlreadyExists);
  HistogramFamily* h = Unwrap(registry.AddHistogram("z", "Z.", {1, 2}));
  EXPECT_EQ(Unwrap(registry.AddHistogram("z", "Z.", {1, 2})), h);
  EXPECT_EQ(registry.AddHistogram("z", "Z.", {1, 3}).status().code(),
            absl::StatusCode::kAlreadyExists);
}

TEST(MetricsRegistryTest, RejectsSampleNamesThatCollideWithAHistogramsSeries) {
  Registry registry;
  Unwrap(registry.AddHistogram("lat_seconds", "L.", {1}));
  EXPECT_THAT(registry.AddGauge("lat_seconds_count", "C.").status().message(),
              HasSubstr("lat_seconds already emits"));
  EXPECT_EQ(registry.AddCounter("lat_seconds_bucket", "B.").status().code(),
            absl::StatusCode::kAlreadyExists);
  Unwrap(registry.AddGauge("q_sum", "S."));
  EXPECT_EQ(registry.AddHistogram("q", "Q.", {1}).status().code(),
            absl::StatusCode::kAlreadyExists);
}

TEST(MetricsRegistryTest, TryWithLabelsRejectsWrongArityAndBadUtf8) {
  Registry registry;
  CounterFamily* family = Unwrap(registry.AddCounter("c_total", "C.", {"a", "b"}));
  EXPECT_THAT(family->TryWithLabels({"only-one"}).status().message(),
              HasSubstr("has labels {a,b} but got 1 values"));
  EXPECT_EQ(family->TryWithLabels({"x", "\xff"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.Serialize(), "");
}

TEST(MetricsRegistryTest, WithLabelsReplacesInvalidUtf8) {
  Registry registry;
  GaugeFamily* family = Unwrap(registry.AddGauge("g", "G.", {"tenant"}));
  family->WithLabels({"t\xff"}).Set(1);
  EXPECT_EQ(&family->WithLabels({"t\xff"}), &family->WithLabels({"t\xef\xbf\xbd"}));
  EXPECT_THAT(registry.Serialize(), HasSubstr("g{tenant=\"t\xef\xbf\xbd\"} 1\n"));
}

TEST(MetricsRegistryDeathTest, WithLabelsAbortsOnWrongArity) {
  Registry registry;
  CounterFamily* family = Unwrap(registry.AddCounter("c_total", "C.", {"a"}));
  EXPECT_DEATH(family->WithLabels({"x", "y"}), "c_total.WithLabels got 2 label values");
}

TEST(MetricsRegistryTest, ConcurrentUpdatesFromSeveralThreadsSumExactly) {
  Registry registry;
  CounterFamily* counters = Unwrap(registry.AddCounter("n_total", "N.", {"shard"}));
  GaugeFamily* gauges = Unwrap(registry.AddGauge("level", "L."));
  HistogramFamily* histograms = Unwrap(registry.AddHistogram("obs", "O.", {0.5, 1.5}));
  constexpr int kThreads = 8;
  constexpr int kIterations = 50000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Half the threads resolve the shared series each time, racing on creation too.
      Counter& shared = counters->WithLabels({"shared"});
      for (int i = 0; i < kIterations; ++i) {
        (t % 2 == 0 ? shared : counters->WithLabels({"shared"})).Increment();
        counters->WithLabels({"fractional"}).Add(0.5);
        gauges->WithLabels({}).Increment(2);
        gauges->WithLabels({}).Decrement(1);
        histograms->WithLabels({}).Observe(i % 2 == 0 ? 1.0 : 2.0);
      }
    });
  }
  // Scrape while they run: must not crash or tear the format.
  for (int i = 0; i < 20; ++i) EXPECT_THAT(registry.Serialize(), HasSubstr("# TYPE obs histogram"));
  for (std::thread& thread : threads) thread.join();

  constexpr uint64_t kTotal = uint64_t{kThreads} * kIterations;
  const double total = static_cast<double>(kTotal);
  EXPECT_EQ(counters->WithLabels({"shared"}).Value(), total);
  EXPECT_EQ(counters->WithLabels({"fractional"}).Value(), total / 2);
  EXPECT_EQ(gauges->WithLabels({}).Value(), total);
  const Histogram::Snapshot snapshot = histograms->WithLabels({}).Take();
  EXPECT_EQ(snapshot.count, kTotal);
  EXPECT_EQ(snapshot.cumulative_counts, (std::vector<uint64_t>{0, kTotal / 2, kTotal}));
  EXPECT_EQ(snapshot.sum, 1.5 * total);
  EXPECT_THAT(registry.Serialize(), HasSubstr("n_total{shard=\"shared\"} 400000\n"));
}

TEST(MetricsRegistryTest, BucketHelpersBuildBoundsOrReject) {
  EXPECT_THAT(*ExponentialBuckets(0.001, 10, 4),
              ElementsAre(DoubleEq(0.001), DoubleEq(0.01), DoubleEq(0.1), DoubleEq(1)));
  EXPECT_EQ(*LinearBuckets(1, 0.5, 3), (std::vector<double>{1, 1.5, 2}));
  EXPECT_FALSE(ExponentialBuckets(0, 2, 3).ok());
  EXPECT_FALSE(ExponentialBuckets(1, 1, 3).ok());
  EXPECT_FALSE(ExponentialBuckets(1, 2, 0).ok());
  EXPECT_FALSE(ExponentialBuckets(1, 1e300, 3).ok());
  EXPECT_FALSE(LinearBuckets(0, 0, 3).ok());
  EXPECT_FALSE(LinearBuckets(0, 1, 0).ok());
}

}  // namespace
}  // namespace kvarn::metrics
