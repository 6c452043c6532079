// KvCore: the pool of quantized and fp16 blocks, the sequences that reference them, the
// prefix index, eviction, and the sessions whose leases own the sequences.
//
// The core does no I/O of its own: memory comes from a MemoryBackend, block bytes are read
// and written only by a Sealer, and time from a Clock, so every rule here is unit-tested
// with heap memory and a fake clock.
//
// Thread safety: all methods may be called concurrently. One mutex guards the bookkeeping;
// the expensive data-plane work of an append (validation, quantization) runs outside it
// while the sequence is marked busy and the new block is in the kSealing state, invisible
// to everyone else (promise: a block is visible only once fully written and sealed).
//
// Errors follow DESIGN.md: INVALID_ARGUMENT fix the request, NOT_FOUND unknown (or not
// yours), RESOURCE_EXHAUSTED nothing left to evict, FAILED_PRECONDITION stale epoch or busy
// sequence, UNAVAILABLE draining, PERMISSION_DENIED admin-only. A rejected call changes no
// state.
#ifndef KVARN_DAEMON_CORE_KV_CORE_H_
#define KVARN_DAEMON_CORE_KV_CORE_H_

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/core/block_pool.h"
#include "daemon/core/clock.h"
#include "daemon/core/core_types.h"
#include "daemon/core/events.h"
#include "daemon/core/memory.h"
#include "daemon/core/sealer.h"
#include "kernels/block_layout.h"
#include "kernels/preset.h"

namespace kvarn {

using SealerFactory = std::function<std::unique_ptr<Sealer>(const Preset&, const BlockLayout&)>;

class KvCore {
 public:
  // Validates the config, sizes the pools and creates their regions. epoch 0 draws a
  // random one. The default sealer factory builds a CpuSealer.
  static absl::StatusOr<std::unique_ptr<KvCore>> Create(const CoreConfig& config,
                                                        MemoryBackend* backend, const Clock* clock,
                                                        SealerFactory sealer = nullptr,
                                                        CoreObserver* observer = nullptr,
                                                        uint64_t epoch = 0);
  ~KvCore();

  uint64_t epoch() const { return epoch_; }
  const Preset& preset() const { return preset_; }
  const BlockLayout& layout() const { return layout_; }
  const CoreConfig& config() const { return config_; }
  Region& quant_region() const { return *quant_region_; }
  Region* sink_region() const { return sink_region_.get(); }
  EventLog& events() { return events_; }
  const char* backend_name() const { return backend_->name(); }

  absl::StatusOr<OpenResult> OpenSession(const OpenParams& params);
  // Lease: a keep-alive message; stream attach/detach of the session's keep-alive stream.
  absl::Status KeepAlive(SessionRef ref);
  absl::Status AttachStream(SessionRef ref);
  void DetachStream(SessionId session);
  absl::StatusOr<uint32_t> CloseSession(SessionRef ref);
  // Ends sessions whose lease ran out; returns how many.
  int ExpireSessions();

  absl::StatusOr<CreateResult> CreateSequence(SessionRef ref, std::span<const uint32_t> prompt);
  absl::StatusOr<uint64_t> Lookup(SessionRef ref, std::span<const uint32_t> prompt);
  // Commits token_ids.size() tokens already written into the tail slot.
  absl::StatusOr<AppendResult> Append(SessionRef ref, SequenceId seq,
                                      std::span<const uint32_t> token_ids);
  // Writes the K/V ([n][layers][kv_heads][head_dim], original frame) into the tail, then
  // commits them. keys/values hold n * layers * kv_heads * head_dim elements of dtype.
  // Many appends of one session: one result per item, in order, each as Append would give.
  std::vector<absl::StatusOr<AppendResult>> AppendBatch(
      SessionRef ref, std::span<const std::pair<SequenceId, std::span<const uint32_t>>> items);
  absl::StatusOr<AppendResult> AppendInline(SessionRef ref, SequenceId seq,
                                            std::span<const uint32_t> token_ids,
                                            const void* keys, const void* values, DType dtype);
  absl::StatusOr<CreateResult> Fork(SessionRef ref, SequenceId seq);
  // All ids must be the session's; then all are released.
  absl::StatusOr<uint32_t> Release(SessionRef ref, std::span<const SequenceId> seqs);
  absl::StatusOr<BlockTableView> Table(SessionRef ref, SequenceId seq);
  // Dequantized K/V of tokens [start, start + count) of one layer, original frame,
  // [count][kv_heads][head_dim] each.
  absl::Status Read(SessionRef ref, SequenceId seq, uint32_t layer, uint64_t start,
                    uint32_t count, float* keys, float* values);
  absl::StatusOr<EvictResult> Evict(SessionRef ref, EvictScope scope, uint64_t bytes,
                                    const std::string& tenant);
  // Global figures; session listings limited to the caller's tenant unless admin. With no
  // ref (metrics), everything.
  absl::StatusOr<CoreStats> Stats(std::optional<SessionRef> ref) const;
  absl::StatusOr<std::vector<SequenceStats>> ListSequences(SessionRef ref) const;
  // Whether the session may watch all tenants; its tenant id for event filtering.
  absl::StatusOr<std::pair<bool, uint32_t>> WatchScope(SessionRef ref) const;
  std::string TenantName(uint32_t tenant) const;

  // Refuse new sessions, sequences and appends (UNAVAILABLE) from now on.
  void BeginDrain();
  // Every block in one state, every reference owned, counts consistent.
  absl::Status CheckInvariants() const;

 private:
  struct Session {
    SessionId id = 0;
    uint32_t tenant = 0;
    std::string client_name;
    bool admin = false;
    std::unique_ptr<Region> tail_region;
    uint32_t slots = 0;
    std::vector<uint32_t> free_slots;
    absl::flat_hash_set<SequenceId> sequences;
    int streams = 0;
    bool stream_seen = false;
    bool closing = false;  // ended; waiting for in-flight appends
    absl::Time last_seen;
    absl::Time disconnected_at;
  };
  struct Sequence {
    SequenceId id = 0;
    SessionId session = 0;
    bool has_sink = false;
    uint32_t sink = 0;
    std::vector<uint32_t> quant;
    uint32_t tail_slot = 0;
    uint32_t tail_tokens = 0;
    std::vector<uint32_t> tail_ids;
    BlockHash last_hash = kRootHash;
    uint64_t tokens = 0;
    bool busy = false;    // an append or fork runs outside the lock
    bool doomed = false;  // its session ended while busy: release when done
    std::optional<BlockRef> pending;  // block held by the in-flight append
  };
  struct Tenant {
    std::string name;
    BlockHash ns{};
  };
  struct AppendPlan;

  KvCore(const CoreConfig& config, const Preset& preset, const BlockLayout& layout,
         MemoryBackend* backend, const Clock* clock, CoreObserver* observer, uint64_t epoch);

  absl::StatusOr<Session*> FindSession(SessionRef ref) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Sequence*> FindSequence(Session* s, SequenceId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t InternTenant(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  BlockTableView TableOf(const Sequence& q, bool with_blocks = true) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint8_t* SlotPtr(const Session& s, uint32_t slot) const;
  uint8_t* BlockPtr(BlockRef b) const;
  size_t BlockBytes(BlockClass c) const;
  // Chain hashes of the full tiles of a prompt that may be adopted (at most len - 1 tokens,
  // so the worker still computes the last prompt token).
  std::vector<BlockHash> PrefixHashes(const BlockHash& ns, std::span<const uint32_t> prompt) const;
  // Checks the prompt's size and the session, then hashes its adoptable tiles.
  absl::StatusOr<std::vector<BlockHash>> PromptHashes(SessionRef ref, std::span<const uint32_t> prompt)
      ABSL_LOCKS_EXCLUDED(mu_);
  std::optional<BlockRef> LastBlock(const Sequence& q) const;

  // Frees one block of class c by evicting the least recently used cached leaf; false when
  // nothing is evictable. Sink blocks also respect the fp16 budget shared with tail slots.
  bool EvictOne(BlockClass c, EvictReason reason, std::optional<uint32_t> tenant)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EvictBlock(BlockRef b, EvictReason reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<uint32_t> AllocateBlock(BlockClass c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyWatermark(BlockClass c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t Fp16SlotsInUse() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void ReleaseSequence(Sequence& q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndSession(Session& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishSessionIfDone(SessionId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::StatusOr<AppendResult> AppendImpl(SessionRef ref, SequenceId seq,
                                          std::span<const uint32_t> token_ids, const void* keys,
                                          const void* values, DType dtype);
  // Phase B of an append: the data-plane work outside the lock.
  absl::Status AppendWork(const AppendPlan& plan, const void* keys, const void* values, DType dtype);
  absl::Status PlanAppend(SessionRef ref, SequenceId seq, std::span<const uint32_t> ids,
                          AppendPlan* plan) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<AppendResult> FinishAppend(const AppendPlan& plan, absl::Status work)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CoreConfig config_;
  const Preset preset_;
  const BlockLayout layout_;
  MemoryBackend* const backend_;
  const Clock* const clock_;
  CoreObserver* const observer_;
  const uint64_t epoch_;
  std::unique_ptr<Sealer> sealer_;
  std::unique_ptr<Region> quant_region_;
  std::unique_ptr<Region> sink_region_;
  uint32_t fp16_budget_ = 0;  // fp16 blocks the fp16 share holds: sinks + tail slots
  EventLog events_;

  mutable absl::Mutex mu_;
  PoolSet pools_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<SessionId, Session> sessions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<SequenceId, Sequence> sequences_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint32_t> tenant_ids_ ABSL_GUARDED_BY(mu_);
  std::vector<Tenant> tenants_ ABSL_GUARDED_BY(mu_);
  uint64_t tick_ ABSL_GUARDED_BY(mu_) = 0;
  SessionId next_session_ ABSL_GUARDED_BY(mu_) = 1;
  SequenceId next_sequence_ ABSL_GUARDED_BY(mu_) = 1;
  uint32_t tail_slots_reserved_ ABSL_GUARDED_BY(mu_) = 0;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  CoreStats counters_ ABSL_GUARDED_BY(mu_);  // cumulative counters only
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_CORE_KV_CORE_H_
