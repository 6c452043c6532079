// kvarnd assembled in one place: memory backend, core, gRPC server (Unix socket and
// optionally TCP, health and reflection services), metrics endpoint, and the lease clock.
// Every gRPC knob is set here, explicitly, with its unit and reason.
#ifndef KVARN_DAEMON_SERVICE_SERVER_H_
#define KVARN_DAEMON_SERVICE_SERVER_H_

#include <grpcpp/server.h>

#include <atomic>
#include <memory>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "daemon/core/kv_core.h"
#include "daemon/metrics/http_exporter.h"
#include "daemon/metrics/registry.h"
#include "daemon/service/config.h"
#include "daemon/service/kv_service.h"
#include "daemon/service/service_metrics.h"

namespace kvarn {

class Server {
 public:
  // Removes stale segments of this instance, builds everything and starts serving.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const DaemonConfig& config);
  ~Server();

  // Graceful stop: refuse new work (UNAVAILABLE), end streams, give in-flight calls up to
  // `deadline`, then release memory (segments are unlinked).
  void Shutdown(absl::Duration deadline = absl::Seconds(5));

  KvCore& core() { return *core_; }
  uint16_t metrics_port() const { return exporter_ ? exporter_->port() : 0; }
  int tcp_port() const { return tcp_port_; }

 private:
  Server() = default;
  void ExpiryLoop();

  DaemonConfig config_;
  std::unique_ptr<MemoryBackend> backend_;
  metrics::Registry registry_;
  std::unique_ptr<ServiceMetrics> metrics_;
  std::unique_ptr<KvCore> core_;
  std::unique_ptr<KvService> service_;
  std::unique_ptr<grpc::Server> grpc_;
  std::unique_ptr<metrics::HttpExporter> exporter_;
  int tcp_port_ = 0;
  absl::Notification stop_expiry_;
  std::thread expiry_;
  std::atomic<bool> shut_down_{false};
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_SERVICE_SERVER_H_
