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

  // Drain (SIGTERM): new sessions are refused (UNAVAILABLE), readiness turns false at once
  // (/readyz 503, gRPC health NOT_SERVING, kvarn_draining 1), and open sessions keep being
  // served. The caller waits for ClientSessions() to reach 0 or its drain budget to pass,
  // then calls Shutdown. Idempotent.
  void BeginDrain();
  // Open sessions that are not observers: what a drain waits for.
  uint32_t ClientSessions() const;
  // Stop: drains if not draining yet, ends streams, gives calls in flight up to `deadline`,
  // then releases memory and removes the sockets.
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
  // Opens the configured tiers and hands them to the core.
  absl::Status OpenTiers();

  DaemonConfig config_;
  std::unique_ptr<InstanceLock> lock_;
  std::unique_ptr<MemoryBackend> backend_;
  metrics::Registry registry_;
  std::unique_ptr<ServiceMetrics> metrics_;
  // Tiers below the pool, in lookup order: declared before the core, which points at them.
  std::vector<std::unique_ptr<BlockTier>> tiers_;
  std::unique_ptr<KvCore> core_;
  std::unique_ptr<KvService> service_;
  std::unique_ptr<grpc::Server> grpc_;
  std::unique_ptr<CommitRingServer> rings_;  // before descriptors_: they hand out its rings
  std::unique_ptr<DescriptorServer> descriptors_;
  std::unique_ptr<metrics::HttpExporter> exporter_;
  int tcp_port_ = 0;
  Notification stop_housekeeping_;
  std::thread housekeeping_;
  std::atomic<bool> draining_{false};
  std::atomic<bool> shut_down_{false};
};

// A file holding credentials must be a regular file (symlinks followed: a Kubernetes Secret
// volume) of kvarnd's uid or root, with no access for others, and readable by the group only
// when the group is one of kvarnd's. FAILED_PRECONDITION naming the file and the fix.
absl::Status CheckSecretFile(const std::string& path, const std::string& what);

// Reads and validates a tenants file: a regular file of this user, no access for group or
// others (mode 0600 or 0400), then ParseTenants.
absl::StatusOr<std::vector<TenantSpec>> LoadTenantsFile(const std::string& path);

}  // namespace kvarn

#endif  // KVARN_DAEMON_SERVICE_SERVER_H_
