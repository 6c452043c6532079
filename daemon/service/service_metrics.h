// kvarnd's Prometheus metrics (DESIGN.md "Metrics"): pool capacity and bytes by block state,
// usage ratio, prefix-cache queried and hit tokens, evictions by reason, seals and their
// latency, sampled quantization error, sessions and sequences, compression ratio, and RPC
// latency by method. Gauges are read from the core at scrape time, so they cannot drift.
#ifndef KVARN_DAEMON_SERVICE_SERVICE_METRICS_H_
#define KVARN_DAEMON_SERVICE_SERVICE_METRICS_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "daemon/core/kv_core.h"
#include "daemon/metrics/registry.h"
#include "daemon/service/kv_service.h"

namespace kvarn {

class ServiceMetrics final : public CoreObserver, public RpcObserver {
 public:
  // Registers the families; Bind must follow once the core exists.
  static absl::StatusOr<std::unique_ptr<ServiceMetrics>> Create(metrics::Registry* registry);
  // Installs the scrape-time gauges reading `core`, which must outlive the registry's use.
  absl::Status Bind(const KvCore* core);
  // (Re)installs the per-tenant series for the configured tenants (a bounded set; without a
  // tenants file there are none) and removes those of tenants no longer configured. Called
  // by Bind and after a tenants reload.
  void BindTenants() ABSL_LOCKS_EXCLUDED(tenants_mu_);

  void OnSeal(bool fp16, absl::Duration latency) override;
  void OnEvict(EvictReason reason, uint32_t blocks) override;
  void OnQuantError(std::string_view method, double relative_l2) override;
  void OnOnboard(std::string_view tier, uint32_t blocks, absl::Duration per_block) override;
  void OnRpc(std::string_view method, grpc::StatusCode code, absl::Duration latency) override;

 private:
  explicit ServiceMetrics(metrics::Registry* registry) : registry_(registry) {}
  // The core's stats, at most 100 ms old: one scrape reads many gauges.
  CoreStats Snapshot() const ABSL_LOCKS_EXCLUDED(mu_);
  // The configured tenants' reports, at most 100 ms old; nullopt for a tenant not configured.
  std::optional<TenantReport> TenantSnapshot(const std::string& tenant) const ABSL_LOCKS_EXCLUDED(mu_);
  // The tiers' series (a fixed set: the tiers are configured at start).
  absl::Status BindTiers(const CoreStats& probe);

  metrics::Registry* registry_;
  const KvCore* core_ = nullptr;
  metrics::HistogramFamily* seal_seconds_ = nullptr;
  metrics::CounterFamily* evictions_ = nullptr;
  metrics::HistogramFamily* quant_error_ = nullptr;
  metrics::HistogramFamily* rpc_seconds_ = nullptr;
  metrics::HistogramFamily* onboard_seconds_ = nullptr;
  metrics::CounterFamily* rpc_total_ = nullptr;
  metrics::CallbackFamily* tenant_usage_ = nullptr;
  metrics::CallbackFamily* tenant_quota_ = nullptr;
  metrics::CallbackFamily* tenant_rejected_ = nullptr;
  mutable Mutex mu_;
  mutable CoreStats cached_ ABSL_GUARDED_BY(mu_);
  mutable absl::Time cached_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  mutable std::vector<TenantReport> tenants_cached_ ABSL_GUARDED_BY(mu_);
  mutable absl::Time tenants_cached_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  Mutex tenants_mu_;  // BindTenants calls, one at a time
  std::vector<std::string> bound_tenants_ ABSL_GUARDED_BY(tenants_mu_);
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_SERVICE_SERVICE_METRICS_H_
