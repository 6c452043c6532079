#include "daemon/metrics/text_format.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvarn::metrics {
namespace {

using ::testing::HasSubstr;

TEST(MetricsTextFormatTest, AcceptsValidMetricNames) {
  for (const char* name : {"a", "_", ":", "kvarn_pool_bytes", "job:rate5m", "A1_b2:c3", "_x9"}) {
    EXPECT_TRUE(ValidateMetricName(name).ok()) << name;
  }
}

TEST(MetricsTextFormatTest, RejectsInvalidMetricNamesNamingTheCharacter) {
  EXPECT_EQ(ValidateMetricName("").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ValidateMetricName("1abc").message(), HasSubstr("'1' at offset 0"));
  EXPECT_THAT(ValidateMetricName("kvarn-pool").message(), HasSubstr("'-' at offset 5"));
  EXPECT_THAT(ValidateMetricName("a b").message(), HasSubstr("' ' at offset 1"));
  EXPECT_THAT(ValidateMetricName("caf\xc3\xa9").message(), HasSubstr("byte 0xc3 at offset 3"));
  EXPECT_FALSE(ValidateMetricName("a.b").ok());
}

TEST(MetricsTextFormatTest, LabelNamesFollowPrometheusRules) {
  EXPECT_TRUE(ValidateLabelName("tenant").ok());
  EXPECT_TRUE(ValidateLabelName("_private").ok());
  EXPECT_TRUE(ValidateLabelName("le").ok());  // only reserved within histograms
  EXPECT_FALSE(ValidateLabelName("").ok());
  EXPECT_FALSE(ValidateLabelName("9lives").ok());
  EXPECT_FALSE(ValidateLabelName("a:b").ok());  // colons only in metric names
  EXPECT_FALSE(ValidateLabelName("a-b").ok());
  EXPECT_THAT(ValidateLabelName("__name__").message(), HasSubstr("reserved"));
}

TEST(MetricsTextFormatTest, EscapesHelpBackslashAndNewlineButNotQuotes) {
  std::string out;
  AppendEscapedHelp("a\\b\nc \"d\"", &out);
  EXPECT_EQ(out, "a\\\\b\\nc \"d\"");
}

TEST(MetricsTextFormatTest, EscapesLabelValueBackslashNewlineAndQuote) {
  std::string out;
  AppendEscapedLabelValue("a\\b\nc \"d\" \xc3\xa9", &out);
  EXPECT_EQ(out, "a\\\\b\\nc \\\"d\\\" \xc3\xa9");
}

TEST(MetricsTextFormatTest, SpellsSpecialFloatsAsPrometheusExpects) {
  EXPECT_EQ(FormatDouble(std::numeric_limits<double>::quiet_NaN()), "NaN");
  EXPECT_EQ(FormatDouble(-std::numeric_limits<double>::quiet_NaN()), "NaN");
  EXPECT_EQ(FormatDouble(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatDouble(-std::numeric_limits<double>::infinity()), "-Inf");
}

TEST(MetricsTextFormatTest, SpellsNumbersShortestFirstAndIntegersInFull) {
  EXPECT_EQ(FormatDouble(0), "0");
  EXPECT_EQ(FormatDouble(-0.0), "-0");
  EXPECT_EQ(FormatDouble(1), "1");
  EXPECT_EQ(FormatDouble(-42), "-42");
  EXPECT_EQ(FormatDouble(100000), "100000");
  EXPECT_EQ(FormatDouble(17179869184.0), "17179869184");
  EXPECT_EQ(FormatDouble(9007199254740991.0), "9007199254740991");  // 2^53 - 1
  EXPECT_EQ(FormatDouble(1e21), "1e+21");
  EXPECT_EQ(FormatDouble(0.1), "0.1");
  EXPECT_EQ(FormatDouble(0.005), "0.005");
  EXPECT_EQ(FormatDouble(2.5), "2.5");
  EXPECT_EQ(FormatDouble(1.5e-7), "1.5e-07");
  EXPECT_EQ(FormatDouble(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(FormatDouble(std::numeric_limits<double>::max()), "1.7976931348623157e+308");
  EXPECT_EQ(FormatDouble(std::numeric_limits<double>::denorm_min()), "5e-324");
}

TEST(MetricsTextFormatTest, NonIntegerValuesUseGoExponentThresholds) {
  EXPECT_EQ(FormatDouble(123456.5), "123456.5");
  EXPECT_EQ(FormatDouble(1234567.5), "1.2345675e+06");
  EXPECT_EQ(FormatDouble(0.0001), "0.0001");
  EXPECT_EQ(FormatDouble(0.00001), "1e-05");
  EXPECT_EQ(FormatDouble(1e16), "1e+16");  // integral but past 2^53
}

TEST(MetricsTextFormatTest, SpellsBucketBoundsLikeTheGoClient) {
  EXPECT_EQ(FormatBucketBound(0.005), "0.005");
  EXPECT_EQ(FormatBucketBound(0.0001), "0.0001");
  EXPECT_EQ(FormatBucketBound(0.00001), "1e-05");
  EXPECT_EQ(FormatBucketBound(1), "1");
  EXPECT_EQ(FormatBucketBound(2.5), "2.5");
  EXPECT_EQ(FormatBucketBound(100000), "100000");
  EXPECT_EQ(FormatBucketBound(1000000), "1e+06");
  EXPECT_EQ(FormatBucketBound(1638400), "1.6384e+06");
  EXPECT_EQ(FormatBucketBound(-0.5), "-0.5");
  EXPECT_EQ(FormatBucketBound(std::numeric_limits<double>::infinity()), "+Inf");
}

TEST(MetricsTextFormatTest, FormattedDoublesRoundTripExactly) {
  std::mt19937_64 rng(20240601);
  for (int i = 0; i < 100000; ++i) {
    const uint64_t bits = rng();
    double value;
    std::memcpy(&value, &bits, sizeof(value));
    if (!std::isfinite(value)) continue;
    for (const std::string& text : {FormatDouble(value), FormatBucketBound(value)}) {
      const double parsed = std::strtod(text.c_str(), nullptr);
      ASSERT_EQ(std::memcmp(&parsed, &value, sizeof(value)), 0) << text;
    }
  }
}

TEST(MetricsTextFormatTest, ValidatesUtf8) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain ascii"));
  EXPECT_TRUE(IsValidUtf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));  // é € 😀
  EXPECT_TRUE(IsValidUtf8("\xf4\x8f\xbf\xbf"));                           // U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xc3"));                                      // truncated
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));                                  // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xe0\x80\xaf"));                              // overlong
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));                              // surrogate D800
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));                          // past U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xff"));
  EXPECT_FALSE(IsValidUtf8("a\x80z"));
}

TEST(MetricsTextFormatTest, SanitizeReplacesEachBadByte) {
  EXPECT_EQ(SanitizeUtf8("ok \xc3\xa9"), "ok \xc3\xa9");
  EXPECT_EQ(SanitizeUtf8("a\xffz"), "a\xef\xbf\xbdz");
  EXPECT_EQ(SanitizeUtf8("\xc3"), "\xef\xbf\xbd");
  EXPECT_EQ(SanitizeUtf8("\xc0\xaf"), "\xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_TRUE(IsValidUtf8(SanitizeUtf8("\xed\xa0\x80 \xf8\x88\x80\x80\x80")));
}

}  // namespace
}  // namespace kvarn::metrics
