#include "daemon/metrics/http_request.h"

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace kvarn::metrics {
namespace {

constexpr size_t kMax = 1024;

absl::StatusCode CodeOf(absl::string_view head) {
  return ParseRequestHead(head, kMax).status().code();
}

TEST(MetricsHttpRequestTest, ParsesPrometheusStyleRequest) {
  absl::StatusOr<std::optional<HttpRequest>> parsed = ParseRequestHead(
      "GET /metrics HTTP/1.1\r\nHost: 10.0.0.1:9400\r\nUser-Agent: Prometheus/2.42.0\r\n"
      "Accept: text/plain;version=0.0.4;q=0.5,*/*;q=0.1\r\nAccept-Encoding: gzip\r\n"
      "X-Prometheus-Scrape-Timeout-Seconds: 10\r\n\r\n",
      kMax);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_TRUE(parsed->has_value());
  EXPECT_EQ((*parsed)->method, "GET");
  EXPECT_EQ((*parsed)->path, "/metrics");
  EXPECT_EQ((*parsed)->minor_version, 1);
}

TEST(MetricsHttpRequestTest, StripsQueryAndAbsoluteFormPrefix) {
  EXPECT_EQ((*ParseRequestHead("GET /metrics?x=1 HTTP/1.0\r\n\r\n", kMax))->path, "/metrics");
  EXPECT_EQ(
      (*ParseRequestHead("GET http://h:1/healthz?a HTTP/1.1\r\nHost: h:1\r\n\r\n", kMax))->path,
      "/healthz");
  EXPECT_EQ((*ParseRequestHead("GET http://h HTTP/1.1\r\nHost: h\r\n\r\n", kMax))->path, "/");
}

TEST(MetricsHttpRequestTest, AcceptsBareLineFeedsAndLeadingEmptyLines) {
  absl::StatusOr<std::optional<HttpRequest>> parsed =
      ParseRequestHead("\r\n\nHEAD /metrics HTTP/1.1\nHost: x\n\n", kMax);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_TRUE(parsed->has_value());
  EXPECT_EQ((*parsed)->method, "HEAD");
}

TEST(MetricsHttpRequestTest, IncompleteHeadAsksForMore) {
  for (const char* partial : {"", "G", "GET /metrics HTTP/1.1", "GET /metrics HTTP/1.1\r",
                              "GET /metrics HTTP/1.1\r\nHost: x\r\n", "GET / HTTP/1.1\r\nHo"}) {
    absl::StatusOr<std::optional<HttpRequest>> parsed = ParseRequestHead(partial, kMax);
    ASSERT_TRUE(parsed.ok()) << partial << ": " << parsed.status();
    EXPECT_FALSE(parsed->has_value()) << partial;
  }
}

TEST(MetricsHttpRequestTest, IgnoresBodyAfterHead) {
  absl::StatusOr<std::optional<HttpRequest>> parsed =
      ParseRequestHead("POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nabcd", kMax);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ((*parsed)->method, "POST");
}

TEST(MetricsHttpRequestTest, RejectsMalformedRequestLines) {
  for (const char* head : {
           "GET\r\n\r\n",
           "GET /metrics\r\n\r\n",
           "GET  /metrics HTTP/1.1\r\nHost: x\r\n\r\n",  // two spaces
           "GET /metrics HTTP/1.1 \r\nHost: x\r\n\r\n",  // trailing space
           "G(T /metrics HTTP/1.1\r\nHost: x\r\n\r\n",   // not a token
           "GET /metrics HTTP/1\r\nHost: x\r\n\r\n",
           "GET /metrics http/1.1\r\nHost: x\r\n\r\n",
           "GET metrics HTTP/1.1\r\nHost: x\r\n\r\n",  // neither path nor URI
           "GET ftp://h/metrics HTTP/1.1\r\nHost: x\r\n\r\n",
           "GET /met\x01rics HTTP/1.1\r\nHost: x\r\n\r\n",
       }) {
    EXPECT_EQ(CodeOf(head), absl::StatusCode::kInvalidArgument) << head;
  }
}

TEST(MetricsHttpRequestTest, RejectsMalformedHeaderFields) {
  EXPECT_EQ(CodeOf("GET / HTTP/1.1\r\nHost: x\r\nNoColon\r\n\r\n"),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CodeOf("GET / HTTP/1.1\r\nHost : x\r\n\r\n"), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CodeOf("GET / HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n"),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CodeOf("GET / HTTP/1.1\r\nHost: x\r\nA: b\x7f\r\n\r\n"),
            absl::StatusCode::kInvalidArgument);
}

TEST(MetricsHttpRequestTest, Http11NeedsExactlyOneHost) {
  EXPECT_EQ(CodeOf("GET / HTTP/1.1\r\n\r\n"), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CodeOf("GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n"),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CodeOf("GET / HTTP/1.0\r\n\r\n"), absl::StatusCode::kOk);
}

TEST(MetricsHttpRequestTest, RejectsBinaryGarbageBeforeTheLineEnds) {
  // The start of a TLS ClientHello: no newline will ever come.
  EXPECT_EQ(CodeOf(absl::string_view("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11)),
            absl::StatusCode::kInvalidArgument);
}

TEST(MetricsHttpRequestTest, OtherHttpVersionsAreUnimplemented) {
  EXPECT_EQ(CodeOf("GET / HTTP/2.0\r\n\r\n"), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(CodeOf("GET / HTTP/0.9\r\n\r\n"), absl::StatusCode::kUnimplemented);
}

TEST(MetricsHttpRequestTest, HeadLongerThanLimitIsResourceExhausted) {
  const std::string big_header = "GET / HTTP/1.1\r\nHost: x\r\nX: " + std::string(2000, 'a');
  EXPECT_EQ(CodeOf(big_header), absl::StatusCode::kResourceExhausted);  // incomplete
  EXPECT_EQ(CodeOf(big_header + "\r\n\r\n"), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(CodeOf(std::string(2000, '\n')), absl::StatusCode::kResourceExhausted);
  const std::string exact = "GET / HTTP/1.0\r\n\r\n";
  EXPECT_EQ(ParseRequestHead(exact, exact.size()).status().code(), absl::StatusCode::kOk);
  EXPECT_EQ(ParseRequestHead(exact, exact.size() - 1).status().code(),
            absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace kvarn::metrics
