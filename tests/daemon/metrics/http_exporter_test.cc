// Serves a populated registry over real loopback sockets: protocol behaviour, robustness
// against idle and hostile clients, and promtool's verdict on the scrape.
#include "daemon/metrics/http_exporter.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"
#include "daemon/metrics/registry.h"
#include "daemon/metrics/text_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvarn::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr absl::string_view kScrape =
    "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: kvarn-test\r\n"
    "Accept: text/plain;version=0.0.4\r\n\r\n";

// A connected loopback client socket whose blocking calls give up after `timeout`.
absl::StatusOr<UniqueFd> Connect(uint16_t port, absl::Duration timeout = absl::Seconds(10)) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return absl::ErrnoToStatus(errno, "socket");
  const timeval tv = absl::ToTimeval(timeout);
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    return absl::ErrnoToStatus(errno, "connect");
  }
  return fd;
}

absl::Status SendAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0) return absl::ErrnoToStatus(errno, "send");
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

// Everything the peer sends until it closes; DEADLINE_EXCEEDED if it goes quiet instead.
absl::StatusOr<std::string> ReadToEof(int fd) {
  std::string data;
  char buffer[16384];
  while (true) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n > 0) {
      data.append(buffer, static_cast<size_t>(n));
    } else if (n == 0) {
      return data;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return absl::DeadlineExceededError(absl::StrCat("no EOF; got ", data.size(), " bytes"));
    } else if (errno != EINTR) {
      return absl::ErrnoToStatus(errno, "recv");
    }
  }
}

struct HttpReply {
  int status = 0;
  std::string head;  // status line and header fields
  std::string body;

  // The value of header field `name` (case-insensitive), or "" if absent.
  std::string Header(absl::string_view name) const {
    for (absl::string_view line : absl::StrSplit(head, "\r\n")) {
      const size_t colon = line.find(':');
      if (colon != absl::string_view::npos && absl::EqualsIgnoreCase(line.substr(0, colon), name)) {
        return std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
      }
    }
    return "";
  }
};

absl::StatusOr<HttpReply> ParseReply(absl::string_view raw) {
  const size_t end = raw.find("\r\n\r\n");
  if (end == absl::string_view::npos || !absl::StartsWith(raw, "HTTP/1.1 ")) {
    return absl::DataLossError(absl::StrCat("not an HTTP response: ", raw.substr(0, 80)));
  }
  HttpReply reply;
  reply.head = std::string(raw.substr(0, end));
  reply.body = std::string(raw.substr(end + 4));
  if (!absl::SimpleAtoi(raw.substr(9, 3), &reply.status)) {
    return absl::DataLossError(absl::StrCat("bad status line: ", reply.head));
  }
  return reply;
}

// Sends `request` on the open connection `fd` and reads the reply to the end.
absl::StatusOr<HttpReply> ExchangeOn(int fd, absl::string_view request) {
  if (absl::Status sent = SendAll(fd, request); !sent.ok()) return sent;
  absl::StatusOr<std::string> raw = ReadToEof(fd);
  if (!raw.ok()) return raw.status();
  return ParseReply(*raw);
}

// One request on a fresh connection, as Prometheus does it.
absl::StatusOr<HttpReply> Exchange(uint16_t port, absl::string_view request) {
  absl::StatusOr<UniqueFd> fd = Connect(port);
  if (!fd.ok()) return fd.status();
  return ExchangeOn(fd->get(), request);
}

// Receives until `prefix` has arrived on `fd`: the server has read the request and is
// sending its response. DEADLINE_EXCEEDED if the peer goes quiet first.
absl::Status AwaitReplyStart(int fd, absl::string_view prefix) {
  std::string data;
  while (data.size() < prefix.size()) {
    char buffer[64];
    const ssize_t n = ::recv(fd, buffer, prefix.size() - data.size(), 0);
    if (n > 0) {
      data.append(buffer, static_cast<size_t>(n));
    } else if (n == 0) {
      return absl::UnavailableError(absl::StrCat("closed after \"", data, "\""));
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return absl::DeadlineExceededError(absl::StrCat("no reply; got \"", data, "\""));
    } else if (errno != EINTR) {
      return absl::ErrnoToStatus(errno, "recv");
    }
  }
  if (data != prefix) return absl::DataLossError(absl::StrCat("reply starts \"", data, "\""));
  return absl::OkStatus();
}

absl::Duration Since(std::chrono::steady_clock::time_point start) {
  return absl::FromChrono(std::chrono::steady_clock::now() - start);
}

// The families the daemon will export, with every kind of value the format must spell.
void Populate(Registry& registry) {
  CallbackFamily* capacity = *registry.AddCallbackGauge(
      "kvarn_pool_capacity_bytes", "Pool capacity by block class.", {"block_class"});
  ASSERT_TRUE(capacity->SetCallback({"quantized"}, [] { return 17179869184.0; }).ok());
  ASSERT_TRUE(capacity->SetCallback({"fp16"}, [] { return 1073741824.0; }).ok());
  GaugeFamily* used =
      *registry.AddGauge("kvarn_pool_used_bytes", "Pool bytes by state.", {"state"});
  used->WithLabels({"active"}).Set(123456789);
  used->WithLabels({"cached"}).Set(42);
  used->WithLabels({"free"}).Set(0);
  (*registry.AddGauge("kvarn_pool_usage_ratio", "Used over capacity."))->WithLabels({}).Set(0.25);
  CounterFamily* evictions = *registry.AddCounter(
      "kvarn_evictions_total", "Blocks evicted.\nBy reason, with a \\backslash.", {"reason"});
  evictions->WithLabels({"pressure"}).Increment(7);
  evictions->WithLabels({"request \"all\"\nC:\\"}).Increment();
  (*registry.AddCounter("kvarn_prefix_cache_queries_total", "Prompt tokens looked up.", {"tenant"}))
      ->WithLabels({"caf\xc3\xa9"})
      .Increment(1000);
  HistogramFamily* seal = *registry.AddHistogram(
      "kvarn_seal_duration_seconds", "Time to seal a tile.", *ExponentialBuckets(0.0001, 4, 8));
  for (double v : {0.00005, 0.0003, 0.002, 0.002, 0.5, 100.0}) seal->WithLabels({}).Observe(v);
  HistogramFamily* rpc = *registry.AddHistogram(
      "kvarn_rpc_duration_seconds", "RPC latency by method.", {0.001, 0.01, 0.1, 1}, {"method"});
  rpc->WithLabels({"Append"}).Observe(0.004);
  rpc->WithLabels({"CreateSequence"}).Observe(0.02);
  GaugeFamily* odd = *registry.AddGauge("kvarn_quantization_error", "Sampled error.", {"stat"});
  odd->WithLabels({"nan"}).Set(std::numeric_limits<double>::quiet_NaN());
  odd->WithLabels({"max"}).Set(std::numeric_limits<double>::infinity());
  odd->WithLabels({"min"}).Set(-std::numeric_limits<double>::infinity());
  odd->WithLabels({"mean"}).Set(1.5e-7);
}

class MetricsHttpExporterTest : public ::testing::Test {
 protected:
  void SetUp() override { Populate(registry_); }

  std::unique_ptr<HttpExporter> StartExporter(HttpExporter::Options options = {}) {
    options.bind_address = "127.0.0.1";
    options.port = 0;
    absl::StatusOr<std::unique_ptr<HttpExporter>> exporter =
        HttpExporter::Start(&registry_, options);
    EXPECT_TRUE(exporter.ok()) << exporter.status();
    return exporter.ok() ? *std::move(exporter) : nullptr;
  }

  Registry registry_;
};

TEST_F(MetricsHttpExporterTest, ServesMetricsWithTextFormatContentType) {
  std::unique_ptr<HttpExporter> exporter = StartExporter();
  ASSERT_NE(exporter, nullptr);
  EXPECT_NE(exporter->port(), 0);
  absl::StatusOr<HttpReply> reply = Exchange(exporter->port(), kScrape);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status, 200);
  EXPECT_EQ(reply->Header("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(reply->Header("Content-Length"), absl::StrCat(reply->body.size()));
  EXPECT_EQ(reply->Header("Connection"), "close");
  EXPECT_EQ(reply->body, registry_.Serialize());
  EXPECT_THAT(reply->body, HasSubstr("kvarn_pool_capacity_bytes{block_class=\"quantized\"} "
                                     "17179869184\n"));
}

TEST_F(MetricsHttpExporterTest, PromtoolAcceptsTheScrapeWithoutLintFindings) {
  const std::string promtool = KVARN_PROMTOOL;
  ASSERT_EQ(::access(promtool.c_str(), X_OK), 0)
      << promtool << " is missing: install Debian's \"prometheus\" package (CI does). "
      << "This test fails rather than skips so a scrape promtool rejects cannot go unnoticed.";
  std::unique_ptr<HttpExporter> exporter = StartExporter();
  ASSERT_NE(exporter, nullptr);
  absl::StatusOr<HttpReply> reply = Exchange(exporter->port(), kScrape);
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_EQ(reply->status, 200);

  std::string dir = ::testing::TempDir() + "/kvarn_promtool_XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr) << std::strerror(errno);
  const std::string scrape_path = dir + "/scrape.prom";
  const std::string output_path = dir + "/promtool.out";
  std::ofstream(scrape_path, std::ios::binary) << reply->body;
  const std::string command =
      absl::StrCat(promtool, " check metrics < '", scrape_path, "' > '", output_path, "' 2>&1");
  const int status = std::system(command.c_str());
  std::stringstream output;
  output << std::ifstream(output_path).rdbuf();
  ASSERT_TRUE(WIFEXITED(status)) << command;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "promtool said:\n"
                                    << output.str() << "\nscrape:\n"
                                    << reply->body;
  EXPECT_EQ(output.str(), "") << "scrape:\n" << reply->body;
  std::remove(scrape_path.c_str());
  std::remove(output_path.c_str());
  ::rmdir(dir.c_str());
}

TEST_F(MetricsHttpExporterTest, HeadSendsHeadersOnlyAndHealthzSaysOk) {
  std::unique_ptr<HttpExporter> exporter = StartExporter();
  ASSERT_NE(exporter, nullptr);
  absl::StatusOr<HttpReply> head =
      Exchange(exporter->port(), "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->status, 200);
  EXPECT_EQ(head->body, "");
  EXPECT_EQ(head->Header("Content-Length"), absl::StrCat(registry_.Serialize().size()));

  exporter->SetServing(HttpExporter::Serving::kServing);
  absl::StatusOr<HttpReply> health = Exchange(exporter->port(), "GET /healthz HTTP/1.0\r\n\r\n");
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(health->body, "ok serving\n");
}

// Liveness holds while serving and while draining; readiness only while serving.
TEST_F(MetricsHttpExporterTest, HealthzAndReadyzFollowTheServingState) {
  std::unique_ptr<HttpExporter> exporter = StartExporter();
  ASSERT_NE(exporter, nullptr);
  const struct {
    HttpExporter::Serving state;
    int healthz;
    const char* healthz_body;
    int readyz;
    const char* readyz_body;
  } cases[] = {
      {HttpExporter::Serving::kStarting, 503, "starting\n", 503, "starting\n"},
      {HttpExporter::Serving::kServing, 200, "ok serving\n", 200, "ready\n"},
      {HttpExporter::Serving::kDraining, 200, "ok draining\n", 503, "draining\n"},
      {HttpExporter::Serving::kStopped, 503, "stopped\n", 503, "stopped\n"},
  };
  for (const auto& c : cases) {
    exporter->SetServing(c.state);
    absl::StatusOr<HttpReply> live = Exchange(exporter->port(), "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    absl::StatusOr<HttpReply> ready = Exchange(exporter->port(), "GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n");
    ASSERT_TRUE(live.ok() && ready.ok());
    EXPECT_EQ(live->status, c.healthz) << c.healthz_body;
    EXPECT_EQ(live->body, c.healthz_body);
    EXPECT_EQ(ready->status, c.readyz) << c.readyz_body;
    EXPECT_EQ(ready->body, c.readyz_body);
  }
}

TEST_F(MetricsHttpExporterTest, UnknownPathsAre404) {
  std::unique_ptr<HttpExporter> exporter = StartExporter();
  ASSERT_NE(exporter, nullptr);
  for (const char* path : {"/", "/metrics/", "/favicon.ico", "/Metrics", "*"}) {
    absl::StatusOr<HttpReply> reply =
        Exchange(exporter->port(), absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: x\r\n\r\n"));
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(reply->status, 404) << path;
  }
}

TEST_F(MetricsHttpExporterTest, OtherMethodsAre405WithAllow) {
  std::unique_ptr<HttpExporter> exporter = StartExporter();
  ASSERT_NE(exporter, nullptr);
  for (const char* request :
       {"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        "DELETE /metrics HTTP/1.1\r\nHost: x\r\n\r\n", "PUT /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
        "get /metrics HTTP/1.1\r\nHost: x\r\n\r\n"}) {
    absl::StatusOr<HttpReply> reply = Exchange(exporter->port(), request);
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(reply->status, 405) << request;
    EXPECT_EQ(reply->Header("Allow"), "GET, HEAD");
  }
}

TEST_F(MetricsHttpExporterTest, MalformedRequestsAre400AndOtherLimitsHaveTheirCodes) {
  std::unique_ptr<HttpExporter> exporter = StartExporter();
  ASSERT_NE(exporter, nullptr);
  const uint16_t port = exporter->port();
  for (absl::string_view request :
       {absl::string_view("hello\r\n\r\n"), absl::string_view("GET /metrics\r\n\r\n"),
        absl::string_view("GET /metrics HTTP/1.1\r\n\r\n"),  // no Host
        absl::string_view("GET /metrics HTTP/1.1\r\nHost x\r\n\r\n"),
        absl::string_view("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11)}) {
    absl::StatusOr<HttpReply> reply = Exchange(port, request);
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(reply->status, 400) << request;
  }
  absl::StatusOr<HttpReply> version = Exchange(port, "GET /metrics HTTP/2.0\r\n\r\n");
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(version->status, 505);

  // A head past max_request_bytes is refused without reading the rest.
  const std::string huge = absl::StrCat(
      "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: ", std::string(64 * 1024, 'p'), "\r\n\r\n");
  absl::StatusOr<UniqueFd> fd = Connect(port);
  ASSERT_TRUE(fd.ok()) << fd.status();
  SendAll(fd->get(), huge).IgnoreError();  // the server may close before taking it all
  absl::StatusOr<std::string> raw = ReadToEof(fd->get());
  if (raw.ok()) {  // else a reset beat the response to us, which is also a refusal
    EXPECT_THAT(*raw, StartsWith("HTTP/1.1 431 "));
  } else {
    EXPECT_NE(raw.status().code(), absl::StatusCode::kDeadlineExceeded) << raw.status();
  }

  // The server is still healthy after all of that.
  absl::StatusOr<HttpReply> ok = Exchange(port, kScrape);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->status, 200);
}

TEST_F(MetricsHttpExporterTest, SilentClientsDoNotBlockOtherScrapes) {
  HttpExporter::Options options;
  options.read_timeout = absl::Seconds(120);  // far longer than the clients below wait
  std::unique_ptr<HttpExporter> exporter = StartExporter(options);
  ASSERT_NE(exporter, nullptr);
  std::vector<UniqueFd> idle;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<UniqueFd> fd = Connect(exporter->port());
    ASSERT_TRUE(fd.ok()) << fd.status();
    idle.push_back(*std::move(fd));
  }
  ASSERT_TRUE(SendAll(idle[0].get(), "GET /metr").ok());  // half a request, then nothing
  for (int i = 0; i < 5; ++i) {
    // Exchange gives up after 10 s; a server stuck on an idle client would take 120 s.
    absl::StatusOr<HttpReply> reply = Exchange(exporter->port(), kScrape);
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(reply->status, 200);
  }
}

TEST_F(MetricsHttpExporterTest, StalledClientIsDisconnectedAfterReadTimeout) {
  HttpExporter::Options options;
  options.read_timeout = absl::Milliseconds(200);
  std::unique_ptr<HttpExporter> exporter = StartExporter(options);
  ASSERT_NE(exporter, nullptr);
  absl::StatusOr<UniqueFd> fd = Connect(exporter->port());
  ASSERT_TRUE(fd.ok()) << fd.status();
  ASSERT_TRUE(SendAll(fd->get(), "GET /metrics HTTP/1.1\r\n").ok());
  absl::StatusOr<std::string> rest = ReadToEof(fd->get());  // 10 s receive timeout
  ASSERT_TRUE(rest.ok()) << rest.status();
  EXPECT_EQ(*rest, "");  // closed without a response
}

TEST_F(MetricsHttpExporterTest, FloodOfIdleConnectionsDoesNotDelayAScrape) {
  HttpExporter::Options options;
  options.read_timeout = absl::Seconds(30);  // no idle connection times out in this test
  std::unique_ptr<HttpExporter> exporter = StartExporter(options);
  ASSERT_NE(exporter, nullptr);
  // More than the connection table and the accept queue together hold.
  constexpr int kIdle = 200;
  ASSERT_GT(kIdle, options.max_connections + options.backlog);
  std::vector<UniqueFd> idle;
  for (int i = 0; i < kIdle; ++i) {
    absl::StatusOr<UniqueFd> fd = Connect(exporter->port());
    ASSERT_TRUE(fd.ok()) << "idle connection " << i << ": " << fd.status();
    idle.push_back(*std::move(fd));
  }

  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<HttpReply> reply = Exchange(exporter->port(), kScrape);
  const absl::Duration elapsed = Since(start);
  std::printf("scrape behind %d idle connections took %s\n", kIdle,
              absl::FormatDuration(elapsed).c_str());
  ASSERT_TRUE(reply.ok()) << reply.status() << " after " << elapsed;
  EXPECT_EQ(reply->status, 200);
  EXPECT_EQ(reply->body, registry_.Serialize());
  // Not a speed requirement: an answer before read_timeout/2 means the scrape waited for no
  // idle connection's read deadline.
  EXPECT_LT(elapsed, options.read_timeout / 2);

  // The room was made by closing the oldest idle connections without a response; the
  // newest kept its slot and is served when it finally sends a request.
  absl::StatusOr<std::string> oldest = ReadToEof(idle.front().get());
  ASSERT_TRUE(oldest.ok()) << oldest.status();
  EXPECT_EQ(*oldest, "");
  absl::StatusOr<HttpReply> newest = ExchangeOn(idle.back().get(), kScrape);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(newest->status, 200);
}

// The head sent so far on a connection that has not finished its request.
constexpr absl::string_view kPartialHead = "GET /metrics HTTP/1.1\r\nHost: x\r\n";

TEST_F(MetricsHttpExporterTest, FullTableDropsAPartialRequestWhenItIsTheOldest) {
  HttpExporter::Options options;
  options.max_connections = 2;
  options.read_timeout = absl::Seconds(30);
  std::unique_ptr<HttpExporter> exporter = StartExporter(options);
  ASSERT_NE(exporter, nullptr);
  absl::StatusOr<UniqueFd> partial = Connect(exporter->port());
  ASSERT_TRUE(partial.ok()) << partial.status();
  ASSERT_TRUE(SendAll(partial->get(), kPartialHead).ok());
  absl::StatusOr<UniqueFd> idle = Connect(exporter->port());
  ASSERT_TRUE(idle.ok()) << idle.status();

  absl::StatusOr<HttpReply> reply = Exchange(exporter->port(), kScrape);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status, 200);
  EXPECT_EQ(reply->body, registry_.Serialize());

  absl::StatusOr<std::string> dropped = ReadToEof(partial->get());
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_EQ(*dropped, "");  // closed without a response
  absl::StatusOr<HttpReply> kept = ExchangeOn(idle->get(), kScrape);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->status, 200);
}

TEST_F(MetricsHttpExporterTest, FullTableKeepsAPartialRequestWhenAnIdleConnectionIsOlder) {
  HttpExporter::Options options;
  options.max_connections = 2;
  options.read_timeout = absl::Seconds(30);
  std::unique_ptr<HttpExporter> exporter = StartExporter(options);
  ASSERT_NE(exporter, nullptr);
  absl::StatusOr<UniqueFd> idle = Connect(exporter->port());
  ASSERT_TRUE(idle.ok()) << idle.status();
  absl::StatusOr<UniqueFd> partial = Connect(exporter->port());
  ASSERT_TRUE(partial.ok()) << partial.status();
  ASSERT_TRUE(SendAll(partial->get(), kPartialHead).ok());

  absl::StatusOr<HttpReply> reply = Exchange(exporter->port(), kScrape);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status, 200);
  EXPECT_EQ(reply->body, registry_.Serialize());

  absl::StatusOr<std::string> dropped = ReadToEof(idle->get());
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_EQ(*dropped, "");
  // The partial request kept its slot and what it had sent: the rest of the head completes it.
  absl::StatusOr<HttpReply> kept = ExchangeOn(partial->get(), "\r\n");
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->status, 200);
  EXPECT_EQ(kept->body, registry_.Serialize());
}

TEST_F(MetricsHttpExporterTest, FullTableOfUnreadResponsesQueuesNewScrapesUntilWriteTimeout) {
  GaugeFamily* many = *registry_.AddGauge("kvarn_test_series", "Many series.", {"id"});
  for (int i = 0; i < 40000; ++i) many->WithLabels({absl::StrCat("series-", i)}).Set(i);
  const std::string expected = registry_.Serialize();
  ASSERT_GT(expected.size(), 1u << 20);  // more than the socket buffers hold
  HttpExporter::Options options;
  options.max_connections = 2;
  options.write_timeout = absl::Milliseconds(300);
  std::unique_ptr<HttpExporter> exporter = StartExporter(options);
  ASSERT_NE(exporter, nullptr);

  // Both slots hold a response its client does not read. Those are never dropped to make
  // room, only at their deadline.
  const auto start = std::chrono::steady_clock::now();
  std::vector<UniqueFd> lazy;
  for (int i = 0; i < options.max_connections; ++i) {
    absl::StatusOr<UniqueFd> fd = Connect(exporter->port());
    ASSERT_TRUE(fd.ok()) << fd.status();
    const int small = 4096;
    ::setsockopt(fd->get(), SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    ASSERT_TRUE(SendAll(fd->get(), kScrape).ok());
    const absl::Status started = AwaitReplyStart(fd->get(), "HTTP/1.1 200 ");
    ASSERT_TRUE(started.ok()) << started;  // and never read on
    lazy.push_back(*std::move(fd));
  }

  absl::StatusOr<HttpReply> reply = Exchange(exporter->port(), kScrape);
  const absl::Duration elapsed = Since(start);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status, 200);
  EXPECT_EQ(reply->body, expected);
  // Served only once a stalled response reached its deadline.
  EXPECT_GE(elapsed, options.write_timeout);
}

TEST_F(MetricsHttpExporterTest, ConcurrentScrapesAllSucceed) {
  std::unique_ptr<HttpExporter> exporter = StartExporter();
  ASSERT_NE(exporter, nullptr);
  const std::string expected = registry_.Serialize();
  constexpr int kThreads = 8;
  constexpr int kScrapesPerThread = 25;
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kScrapesPerThread; ++i) {
        absl::StatusOr<HttpReply> reply = Exchange(exporter->port(), kScrape);
        if (!reply.ok() || reply->status != 200 || reply->body != expected) ++failures[t];
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures, std::vector<int>(kThreads, 0));
}

TEST_F(MetricsHttpExporterTest, ClientThatStopsReadingALargeResponseDoesNotBlockOthers) {
  GaugeFamily* many = *registry_.AddGauge("kvarn_test_series", "Many series.", {"id"});
  for (int i = 0; i < 40000; ++i) many->WithLabels({absl::StrCat("series-", i)}).Set(i);
  const std::string expected = registry_.Serialize();
  ASSERT_GT(expected.size(), 1u << 20);  // more than the socket buffers hold
  std::unique_ptr<HttpExporter> exporter = StartExporter();
  ASSERT_NE(exporter, nullptr);

  absl::StatusOr<UniqueFd> lazy = Connect(exporter->port());
  ASSERT_TRUE(lazy.ok()) << lazy.status();
  const int small = 4096;
  ::setsockopt(lazy->get(), SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  ASSERT_TRUE(SendAll(lazy->get(), kScrape).ok());  // and never read

  absl::StatusOr<HttpReply> reply = Exchange(exporter->port(), kScrape);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->status, 200);
  EXPECT_EQ(reply->body, expected);
}

TEST_F(MetricsHttpExporterTest, PortInUseIsAnError) {
  std::unique_ptr<HttpExporter> first = StartExporter();
  ASSERT_NE(first, nullptr);
  HttpExporter::Options options;
  options.bind_address = "127.0.0.1";
  options.port = first->port();
  absl::StatusOr<std::unique_ptr<HttpExporter>> second = HttpExporter::Start(&registry_, options);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  EXPECT_THAT(second.status().message(), HasSubstr(absl::StrCat("port ", first->port())));
}

TEST_F(MetricsHttpExporterTest, RejectsBadArguments) {
  HttpExporter::Options options;
  EXPECT_EQ(HttpExporter::Start(nullptr, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  for (const char* address : {"localhost", "300.1.1.1", "", "1.2.3.4:80"}) {
    options.bind_address = address;
    EXPECT_EQ(HttpExporter::Start(&registry_, options).status().code(),
              absl::StatusCode::kInvalidArgument)
        << address;
  }
  options = {};
  options.read_timeout = absl::ZeroDuration();
  EXPECT_EQ(HttpExporter::Start(&registry_, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = {};
  options.write_timeout = absl::InfiniteDuration();
  EXPECT_EQ(HttpExporter::Start(&registry_, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = {};
  options.max_connections = 0;
  EXPECT_EQ(HttpExporter::Start(&registry_, options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(MetricsHttpExporterTest, StopIsIdempotentAndClosesTheListener) {
  std::unique_ptr<HttpExporter> exporter = StartExporter();
  ASSERT_NE(exporter, nullptr);
  const uint16_t port = exporter->port();
  absl::StatusOr<UniqueFd> idle = Connect(port);  // open connections don't delay Stop
  ASSERT_TRUE(idle.ok());
  exporter->Stop();
  exporter->Stop();
  absl::StatusOr<UniqueFd> after = Connect(port);
  EXPECT_FALSE(after.ok());
  absl::StatusOr<std::string> cut = ReadToEof(idle->get());
  EXPECT_TRUE(cut.ok() || cut.status().code() != absl::StatusCode::kDeadlineExceeded)
      << cut.status();
  exporter.reset();  // the destructor after Stop is fine too
}

}  // namespace
}  // namespace kvarn::metrics
