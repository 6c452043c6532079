// kvarnd assembled in one place: memory backend, core, tenants, gRPC server (Unix socket and
// optionally TCP with TLS, health and reflection services), the descriptor channel, the
// metrics endpoint, and the housekeeping loop (lease expiry, retained-memory sweeps). Every
// gRPC knob is set here, explicitly, with its unit and reason.
//
// One daemon per socket path: Start takes an exclusive lock on "<listen>.lock" (an advisory
// fcntl lock through Boost.Interprocess, released by the kernel when the process dies) before
// it touches the socket, so a second kvarnd on a live daemon's path fails with
// FAILED_PRECONDITION and the first keeps serving; a dead daemon's leftover sockets are
// replaced. The lock file itself stays (removing it would race a starting daemon).
#ifndef KVARN_DAEMON_SERVICE_SERVER_H_
#define KVARN_DAEMON_SERVICE_SERVER_H_

#include <grpcpp/server.h>

#include <atomic>
#include <memory>
#include <thread>

#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "daemon/core/kv_core.h"
#include "daemon/metrics/http_exporter.h"
#include "daemon/metrics/registry.h"
#include "daemon/service/config.h"
#include "daemon/service/descriptor_server.h"
#include "daemon/service/kv_service.h"
#include "daemon/service/service_metrics.h"

namespace kvarn {

class InstanceLock;  // server.cc

class Server {
 public:
  static absl::StatusOr<std::unique_ptr<Server>> Start(const DaemonConfig& config);
  ~Server();

  // Graceful stop: refuse new work (UNAVAILABLE), end streams, give in-flight calls up to
  // `deadline`, then release memory and remove the sockets.
  void Shutdown(absl::Duration deadline = absl::Seconds(5));
  // Re-reads the tenants file (SIGHUP). On any error the old tenants stay and the error is
  // returned (and logged).
  absl::Status ReloadTenants();

  KvCore& core() { return *core_; }
  uint16_t metrics_port() const { return exporter_ ? exporter_->port() : 0; }
  int tcp_port() const { return tcp_port_; }

 private:
  Server();
  void Housekeeping();

  DaemonConfig config_;
  std::unique_ptr<InstanceLock> lock_;
  std::unique_ptr<MemoryBackend> backend_;
  metrics::Registry registry_;
  std::unique_ptr<ServiceMetrics> metrics_;
  std::unique_ptr<KvCore> core_;
  std::unique_ptr<KvService> service_;
  std::unique_ptr<grpc::Server> grpc_;
  std::unique_ptr<DescriptorServer> descriptors_;
  std::unique_ptr<metrics::HttpExporter> exporter_;
  int tcp_port_ = 0;
  Notification stop_housekeeping_;
  std::thread housekeeping_;
  std::atomic<bool> shut_down_{false};
};

// Reads and validates a tenants file: a regular file of this user, no access for group or
// others (mode 0600 or 0400), then ParseTenants.
absl::StatusOr<std::vector<TenantSpec>> LoadTenantsFile(const std::string& path);

}  // namespace kvarn

#endif  // KVARN_DAEMON_SERVICE_SERVER_H_
