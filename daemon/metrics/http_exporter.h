// A minimal HTTP/1.1 server for Prometheus scrapes:
//   GET /metrics  200, the Registry in the text format 0.0.4
//   GET /healthz  liveness: 200 "ok serving" or "ok draining"; 503 "starting" / "stopped"
//   GET /readyz   readiness: 200 "ready" while serving; 503 "starting", "draining", "stopped"
//   other paths   404;  other methods on those paths 405 (HEAD is served like GET)
//   malformed     400;  head too large 431;  HTTP version other than 1.x 505
// Every response closes its connection: a scrape every few seconds gains nothing from
// keep-alive, and it keeps the server free of per-connection request loops.
//
// One thread runs a poll(2) loop over non-blocking sockets, so a client that connects and
// sends nothing, or stops reading the response, costs at most one connection slot, never the
// attention of the server: other scrapes proceed meanwhile. Requests are bounded in size and
// time (Options). The registry is serialized on that thread, so its callbacks run there.
//
// A flood of idle connections does not delay a scrape by any timeout: when the table is full
// the oldest connection still waiting for its request head makes room (see
// Options::max_connections).
//
// Thread safety: port() and Stop() may be called from any thread.
#ifndef KVARN_DAEMON_METRICS_HTTP_EXPORTER_H_
#define KVARN_DAEMON_METRICS_HTTP_EXPORTER_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"
#include "daemon/metrics/http_request.h"
#include "daemon/metrics/registry.h"

namespace kvarn::metrics {

class HttpExporter {
 public:
  struct Options {
    // Numeric IPv4 or IPv6 address to listen on. Loopback by default: exposing metrics off
    // the host is a deployment decision (a pod sets "0.0.0.0" so Prometheus can reach it).
    std::string bind_address = "127.0.0.1";
    // TCP port; 0 asks the kernel for an ephemeral one, which port() then reports.
    uint16_t port = 0;
    // Longest request head (request line plus header fields) accepted. Prometheus sends
    // about 300 bytes; 8 KiB is the common server default and bounds per-client memory.
    size_t max_request_bytes = 8 * 1024;
    // Time from accepting a connection to having its whole request head. A client that
    // connects and sends nothing holds a slot at most this long, less when the slot is
    // needed (max_connections); Prometheus sends at once.
    absl::Duration read_timeout = absl::Seconds(10);
    // Time to hand over the whole response; a client that stops reading is dropped. Generous
    // because a large registry on a slow link is still a legitimate scrape.
    absl::Duration write_timeout = absl::Seconds(30);
    // Connections open at once. When all are open and a client waits in the accept queue,
    // the connection that has waited longest without a whole request head (reading, earliest
    // accepted) is closed unanswered, the client is accepted, and its request is read in the
    // same poll round. Hence idle connections delay a scrape by no timeout, only by accepting
    // the clients queued ahead of it (up to max_connections per round, rounds back to back),
    // and a scrape whose request has arrived when it is accepted is answered in that round.
    // A reading connection keeps its slot until it is the oldest reading one and another
    // client arrives while the table is full. Connections writing or lingering over a
    // response are never closed for room: while every slot holds one, no client is accepted
    // until one of them finishes or reaches its deadline, at most write_timeout later.
    int max_connections = 64;
    // listen(2) backlog: connections the kernel queues beyond max_connections. A connect
    // that finds this queue full (a burst of more than backlog at once) is not queued; the
    // client's TCP retries it, the first time after about 1 s.
    int backlog = 128;
  };

  // Binds, listens and starts serving `registry`, which must outlive the exporter.
  // INVALID_ARGUMENT for a null registry, an address that is not a numeric IP, a
  // non-positive limit or a timeout that is not positive and finite; the errno-derived
  // status when the socket cannot be bound (FAILED_PRECONDITION for "address already in
  // use").
  static absl::StatusOr<std::unique_ptr<HttpExporter>> Start(const Registry* registry,
                                                             Options options);

  HttpExporter(const HttpExporter&) = delete;
  HttpExporter& operator=(const HttpExporter&) = delete;
  // Stops if still running.
  ~HttpExporter();

  // Closes the listening socket and every open connection (responses in flight are cut
  // short) and joins the server thread. Idempotent; after it returns no registry callback
  // runs on behalf of this exporter.
  void Stop() ABSL_LOCKS_EXCLUDED(stop_mu_);

  // The bound port (the kernel's pick when Options::port was 0).
  uint16_t port() const { return port_; }

  // What /healthz and /readyz report; kStarting until the owner says otherwise.
  enum class Serving { kStarting, kServing, kDraining, kStopped };
  void SetServing(Serving s) { serving_.store(s, std::memory_order_relaxed); }

 private:
  struct Connection;

  HttpExporter(const Registry* registry, Options options, UniqueFd listener, UniqueFd wake,
               uint16_t port);

  // The server thread's loop; returns when wake_fd_ is signalled.
  void Serve();
  // Moves `connection` as far along as its socket allows. False when it is finished.
  bool Advance(Connection& connection, std::chrono::steady_clock::time_point now);
  // Whether `connection` still waits for (the rest of) its request head.
  static bool IsReading(const std::unique_ptr<Connection>& connection);
  // Closes and removes the reading connection accepted earliest, to make room for a
  // newcomer. REQUIRES: some connection in `connections` is reading (else it does nothing).
  static void DropOldestReading(std::vector<std::unique_ptr<Connection>>& connections);
  // The whole HTTP response to a parsed request head (or to the parse error).
  std::string Respond(const absl::StatusOr<HttpRequest>& parsed) const;

  // Immutable after construction, read by the server thread.
  const Registry* const registry_;
  const Options options_;
  const UniqueFd wake_;  // eventfd: Stop() writes to it, which ends Serve()
  const uint16_t port_;

  std::atomic<Serving> serving_{Serving::kStarting};
  Mutex stop_mu_;
  std::thread thread_ ABSL_GUARDED_BY(stop_mu_);
  // Used by the server thread while it runs; Stop() closes it after joining, so connections
  // still waiting in the accept queue are refused rather than left hanging.
  UniqueFd listener_;
};

}  // namespace kvarn::metrics

#endif  // KVARN_DAEMON_METRICS_HTTP_EXPORTER_H_
