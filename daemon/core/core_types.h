// Configuration and value types of the core's API.
#ifndef KVARN_DAEMON_CORE_CORE_TYPES_H_
#define KVARN_DAEMON_CORE_CORE_TYPES_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "common/unique_fd.h"
#include "daemon/core/memory.h"
#include "daemon/core/quota.h"

namespace kvarn {

using SessionId = uint64_t;
using SequenceId = uint64_t;
// A session's credential: 256 bits from the OS CSPRNG, presented with every call.
using SessionSecret = std::array<uint8_t, 32>;

// The model the pool serves. Every session must declare exactly this layout.
struct ModelConfig {
  std::string model_id = "model";
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 128;
  std::string preset = "kvarn_k4v2_g128";
  uint32_t sink_tokens = 128;  // 0 or the preset's tile size
  friend bool operator==(const ModelConfig&, const ModelConfig&) = default;
};

struct CoreConfig {
  ModelConfig model;
  // Total pool memory. fp16_share of it holds fp16 blocks, the rest quantized blocks. Of the
  // fp16 blocks, sink_share are sink blocks (sealed first tiles, shared by prefix) and the
  // rest tail slots that sessions reserve; without a sink (sink_tokens = 0) all are tail
  // slots. The two are separate budgets: a sink block's pages, once written, stay resident
  // (its segment is sealed read-only for clients, see common/shared_memory.h), so they could
  // not be handed to tail slots anyway.
  uint64_t capacity_bytes = 1ull << 30;
  double fp16_share = 0.25;
  double sink_share = 0.25;
  // After a seal, a block class above high_watermark of its blocks in use is evicted down to
  // low_watermark (least recently used cached leaves first).
  double high_watermark = 0.95;
  double low_watermark = 0.90;
  // Leases: clients send a keep-alive at least every keepalive_interval; a session silent for
  // lease_ttl, or whose stream broke grace ago, ends and its sequences are released.
  absl::Duration keepalive_interval = absl::Seconds(1);
  absl::Duration lease_ttl = absl::Seconds(10);
  absl::Duration grace = absl::Seconds(2);
  uint32_t default_tail_slots = 16;  // per session, when the client asks for 0
  uint32_t max_tail_slots = 4096;
  uint32_t max_prompt_tokens = 1u << 20;
  uint32_t max_read_tokens = 4096;
  // Prefix-hash namespace: per-tenant salt derived from this secret. Without a tenants file,
  // share_across_tenants lets all tenant labels share cache entries (one trust domain);
  // with one, only tenants of the same group share.
  std::string tenant_salt_secret;
  bool share_across_tenants = false;
  // Quotas of tenants that set none (quota.h, tenants.h).
  uint32_t tenant_max_sessions = 256;
  uint32_t tenant_max_watchers = 16;
  // Daemon-wide caps: observer sessions (status tools) and Watch streams.
  uint32_t max_observer_sessions = 64;
  uint32_t max_watchers = 256;
  // Grants admin operations (evict all, other tenants, global listings). Empty: nobody.
  std::string admin_token;
  // Scan every committed token for NaN/Inf at commit. Off, bad values are still refused,
  // but only when their tile seals (the sealing append fails and nothing changes); the
  // per-commit scan reads the new tokens' K/V for every layer and kv-head.
  bool check_commits = true;
};

struct SessionRef {
  SessionId session = 0;
  uint64_t epoch = 0;
  SessionSecret secret{};
};

// A sequence's blocks as a reader needs them.
struct BlockTableView {
  uint64_t tokens = 0;
  bool has_sink = false;
  uint32_t sink_block = 0;
  std::vector<uint32_t> quant_blocks;
  uint32_t tail_slot = 0;
  uint32_t tail_tokens = 0;
  bool blocks_omitted = false;  // quant_blocks unchanged since the previous table
};

struct PoolView {
  std::string backend;
  uint32_t tile_tokens = 0;
  uint64_t record_bytes = 0;
  uint64_t quant_block_bytes = 0;
  uint64_t fp16_block_bytes = 0;
  uint32_t quant_blocks = 0;
  uint32_t sink_blocks = 0;
  uint64_t quant_bytes = 0;  // segment sizes; the memory itself comes by LendMemory
  uint64_t sink_bytes = 0;
  uint64_t tail_bytes = 0;
  uint32_t tail_slots = 0;
  uint64_t epoch = 0;
  int daemon_pid = 0;
};

// A session's memory as the descriptor channel hands it over.
struct LentSegment {
  RegionKind kind = RegionKind::kQuant;
  SegmentInfo info;
  UniqueFd fd;            // a duplicate of the region's descriptor; invalid for cuda
  bool writable = false;  // only the session's own tail
};

struct OpenParams {
  std::string tenant;
  std::string tenant_token;  // checked when tenants are configured
  ModelConfig layout;
  uint32_t max_sequences = 0;
  std::string admin_token;
  std::string client_name;
  bool observer = false;  // no tail slots: for status tools
};

struct OpenResult {
  SessionId session = 0;
  SessionSecret secret{};
  PoolView pool;
  std::array<uint8_t, 32> prefix_namespace{};  // the tenant's (prefix_hash.h): for routers' own hashing
};

struct CreateResult {
  SequenceId sequence = 0;
  uint64_t cached_tokens = 0;
  BlockTableView table;
};

struct AppendResult {
  BlockTableView table;
  bool sealed = false;
};

enum class EvictScope { kTenant, kBytes, kAll };

struct EvictResult {
  uint32_t blocks = 0;
  uint64_t bytes = 0;
};

// kQuota: a tenant at its cache quota gave up its own least recently used cached block.
enum class EvictReason { kAllocation = 0, kWatermark = 1, kRequest = 2, kQuota = 3 };
inline constexpr int kEvictReasons = 4;

struct SessionStats {
  SessionId id = 0;
  std::string tenant;
  std::string client_name;
  uint32_t sequences = 0;
  uint32_t tail_slots = 0;
  bool connected = false;
};

// One tenant's holdings against its quota (metrics, status).
struct TenantReport {
  std::string name;
  bool configured = false;
  TenantUsage usage;
  TenantQuota quota;
};

// One tier below the pool (daemon/core/tier.h): its own figures and the core's use of it.
struct TierReport {
  std::string name;
  std::string write;  // "evict" or "seal"
  // The tier's own figures (TierStats, tier.h), copied field by field by the core.
  uint64_t blocks = 0, bytes = 0, capacity_bytes = 0, hits = 0, misses = 0, read_bytes = 0;
  uint64_t queued_blocks = 0, queued_bytes = 0, written_blocks = 0, written_bytes = 0, dropped_writes = 0;
  uint64_t evicted_blocks = 0, errors = 0;
  std::array<uint64_t, 4> rejected{};  // by RecordFault (block_record.h)
  // The core's: blocks onboarded into the pool from this tier, prompt tokens they served,
  // onboards that failed after a hit (import error, no free block), and blocks the core
  // handed the tier (on seal or eviction) or could not (over the spill budget).
  uint64_t onboarded_blocks = 0, hit_tokens = 0, onboard_failures = 0, spilled_blocks = 0, spill_dropped = 0;
};

// What Lookup found: the prompt's cached prefix, the pool's part first, then the part each
// tier (in lookup order) continues it by.
struct LookupResult {
  uint64_t pool_tokens = 0;
  std::vector<std::pair<std::string, uint64_t>> tier_tokens;  // (tier name, tokens)
  uint64_t total_tokens() const {
    uint64_t t = pool_tokens;
    for (const auto& [name, n] : tier_tokens) t += n;
    return t;
  }
};

struct CoreStats {
  uint64_t capacity_bytes = 0, quant_capacity_bytes = 0, fp16_capacity_bytes = 0;
  uint64_t quant_block_bytes = 0, fp16_block_bytes = 0;
  uint32_t quant_total = 0, quant_free = 0, quant_active = 0, quant_cached = 0, quant_sealing = 0;
  uint32_t sink_total = 0, sink_free = 0, sink_active = 0, sink_cached = 0, sink_sealing = 0;
  uint32_t tail_slots_budget = 0, tail_slots_reserved = 0;
  uint64_t retained_bytes = 0;  // memory the backend keeps for a client process still alive
  // Bytes of the quant, sink and tail regions on huge pages (MemoryBackend::HugePageBytes).
  std::array<uint64_t, kRegionKinds> huge_page_bytes{};  // by RegionKind
  uint64_t huge_page_fallbacks = 0;  // regions put on base pages for want of huge pages
  uint32_t sessions = 0, sequences = 0;
  uint32_t client_sessions = 0;  // sessions that are not observers (those hold a drain open)
  uint64_t prefix_queried_tokens = 0, prefix_hit_tokens = 0;
  // The what-if ghosts' hit tokens (whatif.h), in kWhatIfScales order.
  std::array<uint64_t, 4> whatif_hit_tokens{};
  uint64_t seals = 0, sink_seals = 0, dedup_seals = 0;
  uint64_t evictions[kEvictReasons] = {0, 0, 0, 0};  // by EvictReason
  uint64_t sessions_expired = 0;
  uint64_t epoch = 0;
  std::vector<SessionStats> session_info;
  std::vector<TenantReport> tenants;  // configured tenants: the caller's own, all for admins
  std::vector<TierReport> tiers;      // in lookup order

  uint32_t tile_tokens = 0;  // tokens per block (a tile), every class
  bool draining = false;     // set by the service: SIGTERM arrived, no new sessions

  // The pool's exact partition: every byte of every class's capacity in exactly one state.
  // quant and sink: free, sealing, active, cached; tail (the sessions' fp16 tail slots):
  // free, reserved, retained (slots kept for a client process after its session ended).
  struct PoolState {
    const char* cls;
    const char* state;
    uint64_t blocks;
    uint64_t bytes;
  };
  std::vector<PoolState> Partition() const {
    const uint64_t retained_slots = std::min<uint64_t>(
        fp16_block_bytes ? (retained_bytes + fp16_block_bytes - 1) / fp16_block_bytes : 0,
        tail_slots_budget - std::min(tail_slots_budget, tail_slots_reserved));
    const uint64_t reserved = std::min(tail_slots_reserved, tail_slots_budget);
    const PoolState rows[] = {
        {"quant", "free", quant_free, 0},       {"quant", "sealing", quant_sealing, 0},
        {"quant", "active", quant_active, 0},   {"quant", "cached", quant_cached, 0},
        {"sink", "free", sink_free, 0},         {"sink", "sealing", sink_sealing, 0},
        {"sink", "active", sink_active, 0},     {"sink", "cached", sink_cached, 0},
        {"tail", "free", tail_slots_budget - reserved - retained_slots, 0},
        {"tail", "reserved", reserved, 0},      {"tail", "retained", retained_slots, 0},
    };
    std::vector<PoolState> out(std::begin(rows), std::end(rows));
    for (PoolState& r : out) r.bytes = r.blocks * (r.cls[0] == 'q' ? quant_block_bytes : fp16_block_bytes);
    return out;
  }
  // The sum of Partition(): the pool's size (the configured capacity less what fits no block).
  uint64_t PoolBytes() const {
    return uint64_t{quant_total} * quant_block_bytes + (uint64_t{sink_total} + tail_slots_budget) * fp16_block_bytes;
  }

  uint64_t ActiveBytes() const { return quant_active * quant_block_bytes + sink_active * fp16_block_bytes; }
  uint64_t CachedBytes() const { return quant_cached * quant_block_bytes + sink_cached * fp16_block_bytes; }
  uint64_t TailBytes() const { return uint64_t{tail_slots_reserved} * fp16_block_bytes; }
  uint64_t UsedBytes() const {
    return uint64_t{quant_total - quant_free} * quant_block_bytes + uint64_t{sink_total - sink_free} * fp16_block_bytes +
           TailBytes() + retained_bytes;
  }
};

struct SequenceStats {
  SequenceId id = 0;
  SessionId session = 0;
  std::string tenant;
  uint64_t tokens = 0;
  uint32_t quant_blocks = 0;
  bool has_sink = false;
  uint32_t tail_tokens = 0;
};

// Hooks for metrics. OnEvict runs under the core's lock, so implementations must not call
// back into the core; the others run without it.
class CoreObserver {
 public:
  virtual ~CoreObserver() = default;
  virtual void OnSeal(bool fp16, absl::Duration latency) = 0;
  virtual void OnEvict(EvictReason reason, uint32_t blocks) = 0;
  // One sampled tile's relative L2 error, per method: "kvarn" (the stored record) and the
  // baselines "hadamard" and "kivi" on the same tile (quant_error.h).
  virtual void OnQuantError(std::string_view method, double relative_l2) = 0;
  // `blocks` blocks onboarded from tier `tier` into the pool, taking `per_block` each (fetch,
  // validation and import; outside the lock).
  virtual void OnOnboard(std::string_view /*tier*/, uint32_t /*blocks*/, absl::Duration /*per_block*/) {}
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_CORE_CORE_TYPES_H_
