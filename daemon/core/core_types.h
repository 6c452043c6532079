// Configuration and value types of the core's API.
#ifndef KVARN_DAEMON_CORE_CORE_TYPES_H_
#define KVARN_DAEMON_CORE_CORE_TYPES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "daemon/core/memory.h"

namespace kvarn {

using SessionId = uint64_t;
using SequenceId = uint64_t;

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
  // Total pool memory. fp16_share of it holds fp16 blocks (sink tiles and session tail
  // slots); the rest holds quantized blocks.
  uint64_t capacity_bytes = 1ull << 30;
  double fp16_share = 0.25;
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
  // Prefix-hash namespace: per-tenant salt derived from this secret; tenants share cache
  // entries only if share_across_tenants.
  std::string tenant_salt_secret;
  bool share_across_tenants = false;
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
  SegmentInfo quant_segment;
  SegmentInfo sink_segment;
  SegmentInfo tail_segment;
  uint32_t tail_slots = 0;
  uint64_t epoch = 0;
  int daemon_pid = 0;
};

struct OpenParams {
  int client_pid = 0;  // the client's process, for backends that track importers
  std::string tenant;
  ModelConfig layout;
  uint32_t max_sequences = 0;
  std::string admin_token;
  std::string client_name;
  bool observer = false;  // no tail slots: for status tools
};

struct OpenResult {
  SessionId session = 0;
  PoolView pool;
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

enum class EvictReason { kAllocation = 0, kWatermark = 1, kRequest = 2, kSession = 3 };

struct SessionStats {
  SessionId id = 0;
  std::string tenant;
  std::string client_name;
  uint32_t sequences = 0;
  uint32_t tail_slots = 0;
  bool connected = false;
};

struct CoreStats {
  uint64_t capacity_bytes = 0, quant_capacity_bytes = 0, fp16_capacity_bytes = 0;
  uint64_t quant_block_bytes = 0, fp16_block_bytes = 0;
  uint32_t quant_total = 0, quant_free = 0, quant_active = 0, quant_cached = 0, quant_sealing = 0;
  uint32_t sink_total = 0, sink_free = 0, sink_active = 0, sink_cached = 0, sink_sealing = 0;
  uint32_t fp16_slots_budget = 0, tail_slots_reserved = 0;
  uint32_t sessions = 0, sequences = 0;
  uint64_t prefix_queried_tokens = 0, prefix_hit_tokens = 0;
  uint64_t seals = 0, sink_seals = 0, dedup_seals = 0;
  uint64_t evictions[4] = {0, 0, 0, 0};  // by EvictReason
  uint64_t sessions_expired = 0;
  uint64_t epoch = 0;
  std::vector<SessionStats> session_info;

  uint64_t ActiveBytes() const { return quant_active * quant_block_bytes + sink_active * fp16_block_bytes; }
  uint64_t CachedBytes() const { return quant_cached * quant_block_bytes + sink_cached * fp16_block_bytes; }
  uint64_t Fp16Bytes() const {
    return (uint64_t{sink_total - sink_free} + tail_slots_reserved) * fp16_block_bytes;
  }
  uint64_t UsedBytes() const {
    return uint64_t{quant_total - quant_free} * quant_block_bytes + Fp16Bytes();
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
  virtual void OnQuantError(double relative_l2) = 0;
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_CORE_CORE_TYPES_H_
