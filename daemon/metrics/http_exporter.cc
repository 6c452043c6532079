#include "daemon/metrics/http_exporter.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "daemon/metrics/http_request.h"
#include "daemon/metrics/text_format.h"

namespace kvarn::metrics {
namespace {

using Clock = std::chrono::steady_clock;

// After the response is sent the socket is half-closed and drained for at most this long
// before close(2). Closing with unread request bytes (a body, pipelined junk) makes the
// kernel send RST, which can destroy the response before the client has read it.
constexpr auto kLingerTime = std::chrono::seconds(2);

// When accept(2) fails for lack of descriptors or memory, the listener stays readable;
// stop polling it this long instead of spinning.
constexpr auto kAcceptBackoff = std::chrono::milliseconds(100);

constexpr size_t kReadChunk = 4096;

Clock::duration ToClockDuration(absl::Duration d) {
  return std::chrono::duration_cast<Clock::duration>(absl::ToChronoNanoseconds(d));
}

absl::Status ErrnoStatus(int error, absl::string_view what) {
  return absl::ErrnoToStatus(error, what);
}

absl::StatusOr<UniqueFd> Listen(const std::string& address, uint16_t port, int backlog) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE;
  addrinfo* info = nullptr;
  const std::string service = absl::StrCat(port);
  if (const int rc = ::getaddrinfo(address.c_str(), service.c_str(), &hints, &info); rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bind address \"", address,
                     "\" is not a numeric IPv4 or IPv6 address: ", ::gai_strerror(rc)));
  }
  const std::string where = absl::StrCat(address, " port ", port);
  UniqueFd fd(::socket(info->ai_family, info->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                       info->ai_protocol));
  if (!fd.valid()) {
    const int error = errno;
    ::freeaddrinfo(info);
    return ErrnoStatus(error, absl::StrCat("socket for ", where));
  }
  // A restarted daemon must not wait out the previous one's TIME_WAIT connections. On Linux
  // this does not let two live listeners share the port.
  const int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const int bound = ::bind(fd.get(), info->ai_addr, info->ai_addrlen);
  const int bind_error = errno;
  ::freeaddrinfo(info);
  if (bound != 0) return ErrnoStatus(bind_error, absl::StrCat("bind ", where));
  if (::listen(fd.get(), backlog) != 0) {
    return ErrnoStatus(errno, absl::StrCat("listen on ", where));
  }
  return fd;
}

absl::StatusOr<uint16_t> BoundPort(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return ErrnoStatus(errno, "getsockname");
  }
  if (address.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&address)->sin6_port);
  }
  return ntohs(reinterpret_cast<const sockaddr_in*>(&address)->sin_port);
}

struct Reply {
  int code;
  absl::string_view reason;
  absl::string_view content_type;
  std::string body;
  absl::string_view allow;  // the Allow header of a 405
};

Reply PlainReply(int code, absl::string_view reason, std::string body) {
  return {code, reason, "text/plain; charset=utf-8", std::move(body), ""};
}

std::string Serialize(const Reply& reply, bool include_body) {
  std::string out = absl::StrCat(
      "HTTP/1.1 ", reply.code, " ", reply.reason, "\r\nContent-Type: ", reply.content_type,
      "\r\nContent-Length: ", reply.body.size(), "\r\nConnection: close\r\n");
  if (!reply.allow.empty()) absl::StrAppend(&out, "Allow: ", reply.allow, "\r\n");
  out.append("\r\n");
  if (include_body) out.append(reply.body);
  return out;
}

}  // namespace

struct HttpExporter::Connection {
  enum class State { kReading, kWriting, kLingering };

  Connection(UniqueFd socket, Clock::time_point accept_time, Clock::time_point read_deadline)
      : fd(std::move(socket)), accepted(accept_time), deadline(read_deadline) {}

  UniqueFd fd;
  const Clock::time_point accepted;
  State state = State::kReading;
  Clock::time_point deadline;  // the connection is dropped when it passes
  std::string received;        // the request so far, at most max_request_bytes + 1
  std::string response;
  size_t sent = 0;
};

absl::StatusOr<std::unique_ptr<HttpExporter>> HttpExporter::Start(const Registry* registry,
                                                                  Options options) {
  if (registry == nullptr) return absl::InvalidArgumentError("HttpExporter needs a registry");
  if (options.max_request_bytes == 0 || options.max_connections < 1 || options.backlog < 1 ||
      options.read_timeout <= absl::ZeroDuration() ||
      options.write_timeout <= absl::ZeroDuration() ||
      options.read_timeout == absl::InfiniteDuration() ||
      options.write_timeout == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        "HttpExporter needs positive max_request_bytes, max_connections and backlog, and "
        "positive finite timeouts");
  }
  absl::StatusOr<UniqueFd> listener = Listen(options.bind_address, options.port, options.backlog);
  if (!listener.ok()) return listener.status();
  absl::StatusOr<uint16_t> port = BoundPort(listener->get());
  if (!port.ok()) return port.status();
  UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return ErrnoStatus(errno, "eventfd");

  std::unique_ptr<HttpExporter> exporter(
      new HttpExporter(registry, std::move(options), *std::move(listener), std::move(wake), *port));
  HttpExporter* self = exporter.get();
  MutexLock lock(&exporter->stop_mu_);
  exporter->thread_ = std::thread([self] {
    ::pthread_setname_np(::pthread_self(), "kvarn-metrics");
    self->Serve();
  });
  return exporter;
}

HttpExporter::HttpExporter(const Registry* registry, Options options, UniqueFd listener,
                           UniqueFd wake, uint16_t port)
    : registry_(registry),
      options_(std::move(options)),
      wake_(std::move(wake)),
      port_(port),
      listener_(std::move(listener)) {}

HttpExporter::~HttpExporter() { Stop(); }

void HttpExporter::Stop() {
  MutexLock lock(&stop_mu_);
  if (!thread_.joinable()) return;
  const uint64_t one = 1;
  // An eventfd write of 1 cannot fail short of overflowing 2^64 - 2 pending wake-ups.
  [[maybe_unused]] const ssize_t written = ::write(wake_.get(), &one, sizeof(one));
  thread_.join();
  listener_.Reset();
}

void HttpExporter::Serve() {
  const size_t max_connections = static_cast<size_t>(options_.max_connections);
  std::vector<std::unique_ptr<Connection>> connections;  // in accept order
  std::vector<pollfd> polled;
  Clock::time_point accept_paused_until = Clock::time_point::min();

  while (true) {
    Clock::time_point now = Clock::now();
    // A full table still accepts while some connection lacks its request head: that one can
    // be dropped for the newcomer. A table of responses being written or lingering cannot.
    const bool accepting = now >= accept_paused_until &&
                           (connections.size() < max_connections ||
                            std::any_of(connections.begin(), connections.end(), IsReading));
    polled.clear();
    polled.push_back({wake_.get(), POLLIN, 0});
    polled.push_back({listener_.get(), static_cast<short>(accepting ? POLLIN : 0), 0});
    Clock::time_point wake_at = Clock::time_point::max();
    if (now < accept_paused_until) wake_at = accept_paused_until;
    for (const auto& connection : connections) {
      const short events = connection->state == Connection::State::kWriting ? POLLOUT : POLLIN;
      polled.push_back({connection->fd.get(), events, 0});
      wake_at = std::min(wake_at, connection->deadline);
    }
    int timeout_ms = -1;
    if (wake_at != Clock::time_point::max()) {
      const auto wait = std::chrono::ceil<std::chrono::milliseconds>(wake_at - now).count();
      timeout_ms = static_cast<int>(std::clamp<int64_t>(wait, 0, INT_MAX));
    }

    if (::poll(polled.data(), polled.size(), timeout_ms) < 0) {
      // EINTR; EINVAL and ENOMEM cannot be fixed from here either, so just go around.
      continue;
    }
    if (polled[0].revents != 0) return;  // Stop()

    now = Clock::now();
    for (size_t i = 0; i < connections.size(); ++i) {
      Connection& connection = *connections[i];
      bool keep = true;
      if (polled[i + 2].revents != 0) keep = Advance(connection, now);
      if (keep && now >= connection.deadline) keep = false;
      if (!keep) connections[i].reset();
    }
    std::erase(connections, nullptr);

    if (accepting && (polled[1].revents & POLLIN) != 0) {
      // Room is made only in a table that is full once this round's events are handled. One
      // filled by this round's accepts may hold answered connections whose peers have closed
      // already; the next round reaps those instead of dropping someone's request.
      const bool make_room = connections.size() >= max_connections;
      // At most a table's worth per round, so a connect flood cannot keep the loop from the
      // connections already open.
      for (size_t taken = 0; taken < max_connections;) {
        const bool full = connections.size() >= max_connections;
        if (full &&
            (!make_room || std::none_of(connections.begin(), connections.end(), IsReading))) {
          break;
        }
        const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
          ++taken;
          // Only now, with a client in hand, is a slot taken from a connection still reading.
          if (full) DropOldestReading(connections);
          auto connection = std::make_unique<Connection>(
              UniqueFd(fd), now, now + ToClockDuration(options_.read_timeout));
          // A scraper sends its request right after connecting: read it now, so it is
          // answered in this round and not left to be displaced by connections behind it.
          if (Advance(*connection, now)) connections.push_back(std::move(connection));
          continue;
        }
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          accept_paused_until = now + kAcceptBackoff;
        }
        break;  // EAGAIN: queue drained
      }
    }
  }
}

bool HttpExporter::IsReading(const std::unique_ptr<Connection>& connection) {
  return connection->state == Connection::State::kReading;
}

void HttpExporter::DropOldestReading(std::vector<std::unique_ptr<Connection>>& connections) {
  auto oldest = connections.end();
  for (auto it = connections.begin(); it != connections.end(); ++it) {
    // Strictly older: among equal accept times the earlier in the table was accepted first.
    if (IsReading(*it) && (oldest == connections.end() || (*it)->accepted < (*oldest)->accepted)) {
      oldest = it;
    }
  }
  // Closes it without a response, as its read deadline would have.
  if (oldest != connections.end()) connections.erase(oldest);
}

bool HttpExporter::Advance(Connection& connection, Clock::time_point now) {
  if (connection.state == Connection::State::kReading) {
    bool peer_closed = false;
    const size_t limit = options_.max_request_bytes + 1;
    while (connection.received.size() < limit) {
      char buffer[kReadChunk];
      const size_t want = std::min(sizeof(buffer), limit - connection.received.size());
      const ssize_t n = ::recv(connection.fd.get(), buffer, want, 0);
      if (n > 0) {
        connection.received.append(buffer, static_cast<size_t>(n));
        continue;
      }
      if (n == 0) {
        peer_closed = true;
        break;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return false;  // reset by peer and the like
    }
    absl::StatusOr<std::optional<HttpRequest>> parsed =
        ParseRequestHead(connection.received, options_.max_request_bytes);
    if (parsed.ok() && !parsed->has_value()) {
      // Wait for the rest; a peer that half-closed mid-request gets no answer.
      return !peer_closed;
    }
    connection.response =
        Respond(parsed.ok() ? absl::StatusOr<HttpRequest>(**std::move(parsed)) : parsed.status());
    connection.received.clear();
    connection.state = Connection::State::kWriting;
    connection.deadline = now + ToClockDuration(options_.write_timeout);
    // The socket is almost always writable now; don't wait for another poll round.
  }

  if (connection.state == Connection::State::kWriting) {
    while (connection.sent < connection.response.size()) {
      const ssize_t n = ::send(connection.fd.get(), connection.response.data() + connection.sent,
                               connection.response.size() - connection.sent, MSG_NOSIGNAL);
      if (n >= 0) {
        connection.sent += static_cast<size_t>(n);
        continue;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      return false;
    }
    ::shutdown(connection.fd.get(), SHUT_WR);
    connection.response = std::string();
    connection.state = Connection::State::kLingering;
    connection.deadline = std::min(connection.deadline, now + kLingerTime);
    return true;  // poll reports the peer's FIN (or more junk) next
  }

  // Lingering: discard whatever arrives until the peer closes.
  while (true) {
    char buffer[kReadChunk];
    const ssize_t n = ::recv(connection.fd.get(), buffer, sizeof(buffer), 0);
    if (n > 0) continue;
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
}

std::string HttpExporter::Respond(const absl::StatusOr<HttpRequest>& parsed) const {
  if (!parsed.ok()) {
    const std::string body = absl::StrCat(parsed.status().message(), "\n");
    switch (parsed.status().code()) {
      case absl::StatusCode::kResourceExhausted:
        return Serialize(PlainReply(431, "Request Header Fields Too Large", body), true);
      case absl::StatusCode::kUnimplemented:
        return Serialize(PlainReply(505, "HTTP Version Not Supported", body), true);
      default:
        return Serialize(PlainReply(400, "Bad Request", body), true);
    }
  }
  const HttpRequest& request = *parsed;
  const bool head = request.method == "HEAD";
  const bool get_or_head = head || request.method == "GET";
  if (request.path != "/metrics" && request.path != "/healthz" && request.path != "/readyz") {
    return Serialize(PlainReply(404, "Not Found", "not found; try /metrics, /healthz or /readyz\n"), !head);
  }
  if (!get_or_head) {
    Reply reply = PlainReply(405, "Method Not Allowed", "method not allowed\n");
    reply.allow = "GET, HEAD";
    return Serialize(reply, true);
  }
  if (request.path == "/healthz" || request.path == "/readyz") {
    const Serving serving = serving_.load(std::memory_order_relaxed);
    const char* state = serving == Serving::kServing    ? "serving"
                        : serving == Serving::kDraining ? "draining"
                        : serving == Serving::kStopped  ? "stopped"
                                                        : "starting";
    const bool live = serving == Serving::kServing || serving == Serving::kDraining;
    if (request.path == "/healthz") {
      return Serialize(live ? PlainReply(200, "OK", absl::StrCat("ok ", state, "\n"))
                            : PlainReply(503, "Service Unavailable", absl::StrCat(state, "\n")),
                       !head);
    }
    return Serialize(serving == Serving::kServing ? PlainReply(200, "OK", "ready\n")
                                                  : PlainReply(503, "Service Unavailable", absl::StrCat(state, "\n")),
                     !head);
  }
  Reply reply{200, "OK", kTextContentType, registry_->Serialize(), ""};
  return Serialize(reply, !head);
}

}  // namespace kvarn::metrics
