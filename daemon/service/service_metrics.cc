#include "daemon/service/service_metrics.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "daemon/core/block_record.h"

namespace kvarn {
namespace {

const char* ReasonName(EvictReason r) {
  switch (r) {
    case EvictReason::kAllocation: return "allocation";
    case EvictReason::kWatermark: return "watermark";
    case EvictReason::kRequest: return "request";
    case EvictReason::kQuota: return "quota";
  }
  return "unknown";
}

const char* CodeName(grpc::StatusCode c) {
  switch (c) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS: return "DATA_LOSS";
    case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    default: return "OTHER";
  }
}

// 0.5 -> "0.5", 1 -> "1": the capacity_scale label as Prometheus users write it.
std::string ScaleLabel(double scale) { return absl::StrCat(scale); }

}  // namespace

absl::StatusOr<std::unique_ptr<ServiceMetrics>> ServiceMetrics::Create(metrics::Registry* registry) {
  std::unique_ptr<ServiceMetrics> m(new ServiceMetrics(registry));
  auto latency = metrics::ExponentialBuckets(50e-6, 2.0, 18);  // 50 us .. 6.5 s
  if (!latency.ok()) return latency.status();
  auto seal = registry->AddHistogram("kvarn_seal_duration_seconds",
                                     "Time to seal a full tail: quantize it (quant) or copy it (sink), every layer and kv-head.",
                                     *latency, {"kind"});
  if (!seal.ok()) return seal.status();
  m->seal_seconds_ = *seal;
  // Both kinds exported from the start: a node whose sinks all come from a tier may never seal one.
  for (const char* kind : {"quant", "sink"}) m->seal_seconds_->WithLabels({kind});
  auto ev = registry->AddCounter("kvarn_evictions_total", "Cached blocks evicted, by reason.", {"reason"});
  if (!ev.ok()) return ev.status();
  m->evictions_ = *ev;
  for (EvictReason r : {EvictReason::kAllocation, EvictReason::kWatermark, EvictReason::kRequest, EvictReason::kQuota}) {
    m->evictions_->WithLabels({ReasonName(r)});
  }
  auto err = registry->AddHistogram(
      "kvarn_sampled_quantization_error_ratio",
      "Relative L2 error of sampled freshly sealed tiles against their fp16 source, by method: kvarn (the stored "
      "record) and the baselines hadamard and kivi on the same tile at the same bit widths.",
      {0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0}, {"method"});
  if (!err.ok()) return err.status();
  m->quant_error_ = *err;
  auto rpc = registry->AddHistogram("kvarn_rpc_duration_seconds", "gRPC handler latency, by method.", *latency, {"method"});
  if (!rpc.ok()) return rpc.status();
  m->rpc_seconds_ = *rpc;
  auto onboard = registry->AddHistogram("kvarn_tier_onboard_seconds_per_block",
                                        "Time to bring one block from a tier below the pool into it (fetch, validation, import), by tier.",
                                        *latency, {"tier"});
  if (!onboard.ok()) return onboard.status();
  m->onboard_seconds_ = *onboard;
  auto rpct = registry->AddCounter("kvarn_rpc_requests_total", "gRPC calls handled, by method and status code.", {"method", "code"});
  if (!rpct.ok()) return rpct.status();
  m->rpc_total_ = *rpct;
  return m;
}

CoreStats ServiceMetrics::Snapshot() const {
  MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (now - cached_at_ > absl::Milliseconds(100)) {
    auto s = core_->Stats(std::nullopt);
    if (s.ok()) cached_ = *std::move(s);
    cached_at_ = now;
  }
  return cached_;
}

absl::Status ServiceMetrics::Bind(const KvCore* core) {
  core_ = core;
  using metrics::CallbackFamily;
  const auto gauge = [&](const char* name, const char* help, std::vector<std::string> labels) {
    return registry_->AddCallbackGauge(name, help, std::move(labels));
  };
  const auto counter = [&](const char* name, const char* help, std::vector<std::string> labels) {
    return registry_->AddCallbackCounter(name, help, std::move(labels));
  };
  // The pool's exact partition (CoreStats::Partition): for each class, the states' bytes sum
  // to the class's capacity; the classes' capacities sum to the pool.
  auto capacity = gauge("kvarn_pool_capacity_bytes", "Pool memory by block class: quant (quantized tiles), sink (fp16 first tiles, shared), tail (the sessions' fp16 tail slots). Sums to the pool.", {"class"});
  if (!capacity.ok()) return capacity.status();
  auto capacity_tokens = gauge("kvarn_pool_capacity_tokens", "Pool capacity in tokens by block class (blocks x tokens per tile).", {"class"});
  if (!capacity_tokens.ok()) return capacity_tokens.status();
  auto bytes = gauge("kvarn_pool_bytes", "Pool memory by class and state; for each class the states sum to its kvarn_pool_capacity_bytes. quant, sink: free, sealing, active (referenced), cached (unreferenced, kept for prefix hits); tail: free, reserved (by open sessions), retained (kept for a client process after its session ended).", {"class", "state"});
  if (!bytes.ok()) return bytes.status();
  auto tokens = gauge("kvarn_pool_tokens", "kvarn_pool_bytes in tokens (blocks x tokens per tile).", {"class", "state"});
  if (!tokens.ok()) return tokens.status();
  const CoreStats probe = core->Stats(std::nullopt).value_or(CoreStats{});
  for (const char* cls : {"quant", "sink", "tail"}) {
    const auto sum = [this, cls](bool in_tokens) {
      const CoreStats s = Snapshot();
      uint64_t total = 0;
      for (const CoreStats::PoolState& r : s.Partition()) {
        if (std::string_view(r.cls) == cls) total += in_tokens ? r.blocks * s.tile_tokens : r.bytes;
      }
      return static_cast<double>(total);
    };
    (*capacity)->SetCallback({cls}, [sum] { return sum(false); }).IgnoreError();
    (*capacity_tokens)->SetCallback({cls}, [sum] { return sum(true); }).IgnoreError();
  }
  for (size_t i = 0; i < probe.Partition().size(); ++i) {
    const CoreStats::PoolState row = probe.Partition()[i];
    (*bytes)->SetCallback({row.cls, row.state}, [this, i] { return static_cast<double>(Snapshot().Partition()[i].bytes); }).IgnoreError();
    (*tokens)->SetCallback({row.cls, row.state}, [this, i] {
      const CoreStats s = Snapshot();
      return static_cast<double>(s.Partition()[i].blocks * s.tile_tokens);
    }).IgnoreError();
  }
  auto huge = gauge("kvarn_pool_huge_page_bytes", "Bytes of the pool's host segments on huge pages (huge_pages = try or on), by class; tail counts the open sessions' tails.", {"class"});
  if (!huge.ok()) return huge.status();
  for (int k = 0; k < kRegionKinds; ++k) {
    (*huge)->SetCallback({RegionKindName(static_cast<RegionKind>(k))}, [this, k] {
      return static_cast<double>(Snapshot().huge_page_bytes[k]);
    }).IgnoreError();
  }
  auto fallbacks = counter("kvarn_pool_huge_page_fallbacks_total", "Segments kvarnd asked the huge page pool for (huge_pages = try) and put on base pages, for want of free huge pages.", {});
  if (!fallbacks.ok()) return fallbacks.status();
  (*fallbacks)->SetCallback({}, [this] { return static_cast<double>(Snapshot().huge_page_fallbacks); }).IgnoreError();

  auto configured = gauge("kvarn_pool_configured_bytes", "The configured capacity; the pool is this less what fits no block (under one block per class).", {});
  if (!configured.ok()) return configured.status();
  (*configured)->SetCallback({}, [this] { return static_cast<double>(Snapshot().capacity_bytes); }).IgnoreError();

  auto blocks = gauge("kvarn_pool_blocks", "Blocks by class and state.", {"class", "state"});
  if (!blocks.ok()) return blocks.status();
  const struct {
    const char* cls;
    const char* state;
    uint32_t CoreStats::*field;
  } block_series[] = {
      {"quant", "free", &CoreStats::quant_free},     {"quant", "active", &CoreStats::quant_active},
      {"quant", "cached", &CoreStats::quant_cached}, {"quant", "sealing", &CoreStats::quant_sealing},
      {"sink", "free", &CoreStats::sink_free},       {"sink", "active", &CoreStats::sink_active},
      {"sink", "cached", &CoreStats::sink_cached},   {"sink", "sealing", &CoreStats::sink_sealing}};
  for (const auto& b : block_series) {
    const auto field = b.field;
    (*blocks)->SetCallback({b.cls, b.state}, [this, field] { return static_cast<double>(Snapshot().*field); }).IgnoreError();
  }

  auto usage = gauge("kvarn_pool_usage_ratio", "Share of the pool not free (every state but free in kvarn_pool_bytes, cached included); 1 means full.", {});
  if (!usage.ok()) return usage.status();
  (*usage)->SetCallback({}, [this] {
    const CoreStats s = Snapshot();
    uint64_t free = 0;
    for (const CoreStats::PoolState& r : s.Partition()) free += std::string_view(r.state) == "free" ? r.bytes : 0;
    const uint64_t pool = s.PoolBytes();
    return pool ? static_cast<double>(pool - std::min(pool, free)) / static_cast<double>(pool) : 0.0;
  }).IgnoreError();

  auto queried = counter("kvarn_prefix_cache_queried_tokens_total", "Prompt tokens looked up in the prefix cache by CreateSequence.", {});
  if (!queried.ok()) return queried.status();
  (*queried)->SetCallback({}, [this] { return static_cast<double>(Snapshot().prefix_queried_tokens); }).IgnoreError();
  auto hit = counter("kvarn_prefix_cache_hit_tokens_total", "Prompt tokens served from the prefix cache.", {});
  if (!hit.ok()) return hit.status();
  (*hit)->SetCallback({}, [this] { return static_cast<double>(Snapshot().prefix_hit_tokens); }).IgnoreError();
  auto whatif = counter("kvarn_whatif_prefix_hit_tokens_total",
                        "Prompt tokens that would have been prefix-cache hits with capacity_scale times the pool's "
                        "sealed-block capacity (an LRU ghost of block hashes replaying the same lookups and seals; "
                        "capacity_scale=\"1\" is the ghost of the pool itself).",
                        {"capacity_scale"});
  if (!whatif.ok()) return whatif.status();
  for (size_t i = 0; i < kWhatIfScales.size(); ++i) {
    (*whatif)->SetCallback({ScaleLabel(kWhatIfScales[i])}, [this, i] {
      return static_cast<double>(Snapshot().whatif_hit_tokens[i]);
    }).IgnoreError();
  }

  auto seals = counter("kvarn_seals_total", "Tiles sealed: quantized (quant), kept fp16 (sink), or shared with an identical cached tile (dedup).", {"kind"});
  if (!seals.ok()) return seals.status();
  (*seals)->SetCallback({"quant"}, [this] { return static_cast<double>(Snapshot().seals); }).IgnoreError();
  (*seals)->SetCallback({"sink"}, [this] { return static_cast<double>(Snapshot().sink_seals); }).IgnoreError();
  (*seals)->SetCallback({"dedup"}, [this] { return static_cast<double>(Snapshot().dedup_seals); }).IgnoreError();

  auto sessions = gauge("kvarn_sessions", "Open client sessions.", {});
  if (!sessions.ok()) return sessions.status();
  (*sessions)->SetCallback({}, [this] { return static_cast<double>(Snapshot().sessions); }).IgnoreError();
  auto sequences = gauge("kvarn_sequences", "Live sequences.", {});
  if (!sequences.ok()) return sequences.status();
  (*sequences)->SetCallback({}, [this] { return static_cast<double>(Snapshot().sequences); }).IgnoreError();
  auto expired = counter("kvarn_sessions_expired_total", "Sessions ended by their lease (stream lost past the grace period, or silent past the TTL).", {});
  if (!expired.ok()) return expired.status();
  (*expired)->SetCallback({}, [this] { return static_cast<double>(Snapshot().sessions_expired); }).IgnoreError();

  auto draining = gauge("kvarn_draining", "1 while kvarnd drains after SIGTERM (no new sessions; open ones still served), else 0.", {});
  if (!draining.ok()) return draining.status();
  (*draining)->SetCallback({}, [this] { return Snapshot().draining ? 1.0 : 0.0; }).IgnoreError();

  const Preset& p = core->preset();
  const double ratio = 16.0 / p.BitsPerElement(core->layout().head_dim);
  auto compression = gauge("kvarn_compression_ratio", "fp16 bytes over stored bytes of a sealed tile for the pool's preset, metadata included.", {"preset"});
  if (!compression.ok()) return compression.status();
  (*compression)->SetCallback({p.Name()}, [ratio] { return ratio; }).IgnoreError();

  auto usage_t = gauge("kvarn_tenant_usage", "What a configured tenant holds, by resource: sessions, tail_slots, cache (bytes), watchers.", {"tenant", "resource"});
  if (!usage_t.ok()) return usage_t.status();
  tenant_usage_ = *usage_t;
  auto quota_t = gauge("kvarn_tenant_quota", "A configured tenant's quota, by resource (same units as kvarn_tenant_usage).", {"tenant", "resource"});
  if (!quota_t.ok()) return quota_t.status();
  tenant_quota_ = *quota_t;
  auto rejected_t = counter("kvarn_tenant_quota_rejections_total", "Requests of a configured tenant refused by one of its quotas.", {"tenant", "resource"});
  if (!rejected_t.ok()) return rejected_t.status();
  tenant_rejected_ = *rejected_t;
  if (absl::Status t = BindTiers(probe); !t.ok()) return t;
  BindTenants();
  return absl::OkStatus();
}

absl::Status ServiceMetrics::BindTiers(const CoreStats& probe) {
  if (probe.tiers.empty()) return absl::OkStatus();
  struct Field {
    const char* name;
    const char* help;
    bool counter;
    uint64_t TierReport::*field;
  };
  static constexpr Field kFields[] = {
      {"kvarn_tier_blocks", "Block records a tier below the pool holds (memcached: written by this node, not known evicted).", false, &TierReport::blocks},
      {"kvarn_tier_bytes", "Bytes of the records a tier holds, headers included.", false, &TierReport::bytes},
      {"kvarn_tier_capacity_bytes", "A tier's bound in bytes (0: bounded by the servers themselves).", false, &TierReport::capacity_bytes},
      {"kvarn_tier_write_queue_blocks", "Blocks waiting in a tier's write-behind queue.", false, &TierReport::queued_blocks},
      {"kvarn_tier_write_queue_bytes", "Bytes waiting in a tier's write-behind queue.", false, &TierReport::queued_bytes},
      {"kvarn_tier_written_blocks_total", "Block records a tier wrote.", true, &TierReport::written_blocks},
      {"kvarn_tier_written_bytes_total", "Bytes a tier wrote.", true, &TierReport::written_bytes},
      {"kvarn_tier_read_bytes_total", "Bytes of valid records a tier read.", true, &TierReport::read_bytes},
      {"kvarn_tier_dropped_writes_total", "Blocks a tier did not write: its queue was full or the write failed.", true, &TierReport::dropped_writes},
      {"kvarn_tier_evicted_blocks_total", "Records a tier removed to stay within its bound.", true, &TierReport::evicted_blocks},
      {"kvarn_tier_errors_total", "I/O errors and server failures of a tier (each one a miss or a dropped write).", true, &TierReport::errors},
      {"kvarn_tier_onboarded_blocks_total", "Blocks brought into the pool from a tier.", true, &TierReport::onboarded_blocks},
      {"kvarn_tier_hit_tokens_total", "Prompt tokens served by blocks onboarded from a tier (a part of kvarn_prefix_hit_tokens_total).", true, &TierReport::hit_tokens},
      {"kvarn_tier_onboard_failures_total", "Onboards that failed after a tier's hit (a record out of place in its chain, an import error, no free block).", true, &TierReport::onboard_failures},
      {"kvarn_tier_spilled_blocks_total", "Blocks the pool handed a tier (on seal or eviction).", true, &TierReport::spilled_blocks},
      {"kvarn_tier_spill_dropped_total", "Blocks the pool could not hand a tier (its queue full, or past the spill budget of one call).", true, &TierReport::spill_dropped},
  };
  const auto tier_value = [this](size_t t, uint64_t TierReport::*const field) {
    const CoreStats s = Snapshot();
    return t < s.tiers.size() ? static_cast<double>(s.tiers[t].*field) : 0.0;
  };
  for (const Field& f : kFields) {
    auto family = f.counter ? registry_->AddCallbackCounter(f.name, f.help, {"tier"})
                            : registry_->AddCallbackGauge(f.name, f.help, {"tier"});
    if (!family.ok()) return family.status();
    for (size_t t = 0; t < probe.tiers.size(); ++t) {
      uint64_t TierReport::*const field = f.field;
      (*family)->SetCallback({probe.tiers[t].name}, [tier_value, t, field] { return tier_value(t, field); }).IgnoreError();
    }
  }
  auto lookups = registry_->AddCallbackCounter("kvarn_tier_lookups_total", "Block reads of a tier, by result: hit (a valid record) or miss (none, or rejected).", {"tier", "result"});
  if (!lookups.ok()) return lookups.status();
  auto rejected = registry_->AddCallbackCounter("kvarn_tier_rejected_blocks_total", "Records a tier refused and deleted, by reason: truncated, corrupt (bad header or MAC), foreign (another pool's), wrong_key.", {"tier", "reason"});
  if (!rejected.ok()) return rejected.status();
  for (size_t t = 0; t < probe.tiers.size(); ++t) {
    const std::string& name = probe.tiers[t].name;
    (*lookups)->SetCallback({name, "hit"}, [tier_value, t] { return tier_value(t, &TierReport::hits); }).IgnoreError();
    (*lookups)->SetCallback({name, "miss"}, [tier_value, t] { return tier_value(t, &TierReport::misses); }).IgnoreError();
    for (int f = 0; f < kRecordFaults; ++f) {
      (*rejected)->SetCallback({name, RecordFaultName(static_cast<RecordFault>(f))}, [this, t, f] {
        const CoreStats s = Snapshot();
        return t < s.tiers.size() ? static_cast<double>(s.tiers[t].rejected[f]) : 0.0;
      }).IgnoreError();
    }
    onboard_seconds_->WithLabels({name});
  }
  return absl::OkStatus();
}

std::optional<TenantReport> ServiceMetrics::TenantSnapshot(const std::string& tenant) const {
  MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (now - tenants_cached_at_ > absl::Milliseconds(100)) {
    tenants_cached_ = core_->TenantReports();
    tenants_cached_at_ = now;
  }
  for (const TenantReport& r : tenants_cached_) {
    if (r.name == tenant) return r;
  }
  return std::nullopt;
}

void ServiceMetrics::BindTenants() {
  MutexLock lock(&tenants_mu_);
  std::vector<std::string> now;
  for (const TenantReport& r : core_->TenantReports()) now.push_back(r.name);
  static constexpr QuotaLimit kLimits[] = {QuotaLimit::kSessions, QuotaLimit::kTailSlots, QuotaLimit::kCache, QuotaLimit::kWatchers};
  for (const std::string& gone : bound_tenants_) {
    if (std::find(now.begin(), now.end(), gone) != now.end()) continue;
    for (QuotaLimit l : kLimits) {
      const absl::string_view labels[] = {gone, QuotaLimitName(l)};
      tenant_usage_->RemoveCallback(labels).IgnoreError();
      tenant_quota_->RemoveCallback(labels).IgnoreError();
      // A counter's series stays (it must not go backwards); it keeps its last value.
    }
  }
  for (const std::string& name : now) {
    for (QuotaLimit l : kLimits) {
      const absl::string_view labels[] = {name, QuotaLimitName(l)};
      tenant_usage_->SetCallback(labels, [this, name, l] {
        const std::optional<TenantReport> r = TenantSnapshot(name);
        if (!r) return 0.0;
        switch (l) {
          case QuotaLimit::kSessions: return static_cast<double>(r->usage.sessions);
          case QuotaLimit::kTailSlots: return static_cast<double>(r->usage.tail_slots);
          case QuotaLimit::kCache: return static_cast<double>(r->usage.cache_bytes);
          case QuotaLimit::kWatchers: return static_cast<double>(r->usage.watchers);
        }
        return 0.0;
      }).IgnoreError();
      tenant_quota_->SetCallback(labels, [this, name, l] {
        const std::optional<TenantReport> r = TenantSnapshot(name);
        if (!r) return 0.0;
        switch (l) {
          case QuotaLimit::kSessions: return static_cast<double>(r->quota.max_sessions);
          case QuotaLimit::kTailSlots: return static_cast<double>(r->quota.max_tail_slots);
          case QuotaLimit::kCache: return static_cast<double>(r->quota.max_cache_bytes);
          case QuotaLimit::kWatchers: return static_cast<double>(r->quota.max_watchers);
        }
        return 0.0;
      }).IgnoreError();
      // A counter must not go backwards, also once its tenant is removed from the file: it
      // keeps the highest count it reported.
      auto last = std::make_shared<std::atomic<double>>(0.0);
      tenant_rejected_->SetCallback(labels, [this, name, l, last] {
        const std::optional<TenantReport> r = TenantSnapshot(name);
        const double now = r ? static_cast<double>(r->usage.rejected[static_cast<int>(l)]) : 0.0;
        if (now > last->load()) last->store(now);
        return last->load();
      }).IgnoreError();
    }
  }
  bound_tenants_ = std::move(now);
}

void ServiceMetrics::OnSeal(bool fp16, absl::Duration latency) {
  seal_seconds_->WithLabels({fp16 ? "sink" : "quant"}).Observe(absl::ToDoubleSeconds(latency));
}

void ServiceMetrics::OnEvict(EvictReason reason, uint32_t blocks) {
  evictions_->WithLabels({ReasonName(reason)}).Increment(blocks);
}

void ServiceMetrics::OnOnboard(std::string_view tier, uint32_t blocks, absl::Duration per_block) {
  auto& h = onboard_seconds_->WithLabels({absl::string_view(tier.data(), tier.size())});
  for (uint32_t i = 0; i < blocks; ++i) h.Observe(absl::ToDoubleSeconds(per_block));
}

void ServiceMetrics::OnQuantError(std::string_view method, double relative_l2) {
  quant_error_->WithLabels({std::string(method)}).Observe(relative_l2);
}

void ServiceMetrics::OnRpc(std::string_view method, grpc::StatusCode code, absl::Duration latency) {
  const absl::string_view m(method.data(), method.size());
  rpc_seconds_->WithLabels({m}).Observe(absl::ToDoubleSeconds(latency));
  rpc_total_->WithLabels({m, CodeName(code)}).Increment();
}

}  // namespace kvarn
