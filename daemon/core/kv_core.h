// KvCore: the daemon's state behind one lock. A thin facade: each public call takes the lock,
// asks the component that owns the rule, and applies the result. Where each rule lives:
//   sessions.h         credentials (secret check), leases (expiry), tail slots
//   tenants.h          tenant authentication, namespaces, quota values
//   quota.h            per-tenant usage and the quota checks
//   block_pool.h       block states, reference counts, prefix index, parent links
//   eviction_policy.h  which cached block leaves first
//   sequence.h         a sequence's blocks
// The core does no I/O: memory comes from a MemoryBackend, block bytes are read and written
// only by a Sealer, time comes from a Clock, so every rule is unit-tested with heap memory and
// a fake clock.
//
// Thread safety: all methods may be called concurrently. One mutex guards the bookkeeping.
// Work that does not need it runs outside it: the data-plane work of an append (validation,
// quantization), of a fork (tail copy) and of a Read (decoding), while the sequence is marked
// busy (and a new block is kSealing, invisible to everyone else: a block is visible only once
// fully written and sealed); creating a session's tail region; and destroying regions of ended
// sessions (which may call the device).
//
// Errors follow DESIGN.md: INVALID_ARGUMENT fix the request, NOT_FOUND unknown (or not yours,
// or a wrong secret), UNAUTHENTICATED a tenant's token is wrong, RESOURCE_EXHAUSTED nothing
// left to evict or a quota reached (the message names it), FAILED_PRECONDITION stale epoch or
// busy sequence, UNAVAILABLE draining, PERMISSION_DENIED admin-only. A rejected call changes
// no state.
#ifndef KVARN_DAEMON_CORE_KV_CORE_H_
#define KVARN_DAEMON_CORE_KV_CORE_H_

#include <atomic>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "daemon/core/block_pool.h"
#include "daemon/core/clock.h"
#include "daemon/core/core_types.h"
#include "daemon/core/events.h"
#include "daemon/core/memory.h"
#include "daemon/core/quota.h"
#include "daemon/core/sealer.h"
#include "daemon/core/sequence.h"
#include "daemon/core/sessions.h"
#include "daemon/core/tenants.h"
#include "daemon/core/tier.h"
#include "daemon/core/whatif.h"
#include "kernels/block_layout.h"
#include "kernels/preset.h"

namespace kvarn {

// What a Watch stream may see.
struct WatchGrant {
  bool all_tenants = false;  // admin
  uint32_t tenant = 0;
};

// How a config divides its capacity: what Create would build, without building it.
struct PoolPlan {
  Preset preset;
  BlockLayout layout;
  uint32_t quant_blocks = 0, sink_blocks = 0, tail_slots = 0;
};

class KvCore {
 public:
  // Validates the config and sizes the pools (INVALID_ARGUMENT naming what does not fit).
  static absl::StatusOr<PoolPlan> Plan(const CoreConfig& config);
  // Validates the config, sizes the pools and creates their regions. epoch 0 draws a random
  // one. The default sealer factory builds a CpuSealer.
  static absl::StatusOr<std::unique_ptr<KvCore>> Create(const CoreConfig& config, MemoryBackend* backend,
                                                        const Clock* clock, SealerFactory sealer = nullptr,
                                                        CoreObserver* observer = nullptr, uint64_t epoch = 0);
  ~KvCore();

  uint64_t epoch() const { return epoch_; }
  const Preset& preset() const { return preset_; }
  const BlockLayout& layout() const { return layout_; }
  const CoreConfig& config() const { return config_; }
  EventLog& events() { return events_; }
  const char* backend_name() const { return backend_->name(); }
  MemoryBackend* backend() const { return backend_; }

  // Tenants: switches to authenticated tenants (the tenants file), or reloads them. Sessions
  // of tenants whose token changed or who were removed end at once.
  absl::Status ConfigureTenants(const std::vector<TenantSpec>& specs);
  bool tenants_configured() const;
  std::string TenantName(uint32_t tenant) const;
  // Holdings and quotas of the configured tenants (empty without a tenants file: labels are
  // unbounded client input, never metric labels).
  std::vector<TenantReport> TenantReports() const;

  // Sessions and leases.
  absl::StatusOr<OpenResult> OpenSession(const OpenParams& params);
  // A keep-alive message: renews the lease.
  absl::Status KeepAlive(const SessionRef& ref);
  // The session's keep-alive stream attaches (renewing the lease) or detaches (starting the
  // grace period). DetachStream takes the id: the stream was attached with the credential.
  absl::Status AttachStream(const SessionRef& ref);
  void DetachStream(SessionId session);
  absl::StatusOr<uint32_t> CloseSession(const SessionRef& ref);
  // Ends sessions whose lease ran out; returns how many.
  int ExpireSessions();
  // Incremented whenever a session ends (close, expiry, revocation): watchers re-check
  // theirs when it moves. Lock-free.
  uint64_t sessions_ended() const { return sessions_ended_.load(std::memory_order_acquire); }
  // OK while the session is live (no renewal): for streams that must end with it.
  absl::Status CheckSession(const SessionRef& ref) const;

  // The session's memory for its client process (pid verified by the kernel; identity its
  // start time): the quantized and sink segments read-only, the session's tail writable. The
  // first call binds the session to `pid`; a call from another process is PERMISSION_DENIED.
  // pid <= 0 is a peer in another PID namespace: served by backends that need no importer
  // pid (host), bound as one "foreign" peer; PERMISSION_DENIED naming the fix otherwise.
  absl::StatusOr<std::vector<LentSegment>> LendMemory(const SessionRef& ref, int pid, uint64_t identity = 0);
  // Whether the session's commit ring (daemon/service/commit_ring_server.h) may go to `pid`:
  // the session's tail slots when `pid` is the process its memory was lent to. NOT_FOUND as
  // every call; FAILED_PRECONDITION before LendMemory or for a session without tail slots;
  // PERMISSION_DENIED for another process. Renews nothing.
  absl::StatusOr<uint32_t> RingGrant(const SessionRef& ref, int pid) const;

  // Tiers below the pool (daemon/core/tier.h), in lookup order: the local disk first, then
  // shared ones. Call once, before the first session; the tiers outlive the core. Blocks the
  // pool evicts go to every tier that lacks them (exported under the lock, written behind);
  // sealed blocks go at once to tiers whose policy is kOnSeal; a prompt's prefix that leaves
  // the pool is continued from the tiers and onboarded by CreateSequence (docs/tiers.md).
  void SetTiers(std::vector<BlockTier*> tiers);
  // What the tiers' records must carry to be served by this pool (block_record.h).
  const TierIdentity& tier_identity() const { return tier_identity_; }
  size_t tier_count() const { return tiers_.size(); }
  std::string_view tier_name(size_t t) const { return tiers_[t]->name(); }
  // Hands every indexed block a tier lacks to the tiers and waits until `deadline` for their
  // queues to empty (a stopping daemon's pool survives a restart on its disk tier). Returns
  // the blocks handed over.
  uint64_t SpillAll(absl::Time deadline);

  // Sequences. The prompt's cached prefix is adopted: the pool's, continued by blocks
  // onboarded from the tiers (fetched and validated outside the lock) before the reply.
  absl::StatusOr<CreateResult> CreateSequence(const SessionRef& ref, std::span<const uint32_t> prompt);
  // How many prompt tokens CreateSequence would adopt now, by tier. With `prefetch`, the
  // blocks the tiers hold are onboarded first (left cached in the pool, held by nobody), so a
  // router can warm a node before it sends the request; otherwise no block moves. Renews
  // nothing.
  absl::StatusOr<LookupResult> Lookup(const SessionRef& ref, std::span<const uint32_t> prompt, bool prefetch = false);
  // Commits token_ids.size() tokens already written into the tail slot.
  absl::StatusOr<AppendResult> Append(const SessionRef& ref, SequenceId seq, std::span<const uint32_t> token_ids);
  // Many appends of one session. The outer status is the session's (unknown, stale epoch,
  // draining); then one result per item, in order, each as Append would give.
  absl::StatusOr<std::vector<absl::StatusOr<AppendResult>>> AppendBatch(
      const SessionRef& ref, std::span<const std::pair<SequenceId, std::span<const uint32_t>>> items);
  // Writes the K/V ([n][layers][kv_heads][head_dim], original frame) into the tail, then
  // commits them. keys/values hold n * layers * kv_heads * head_dim elements of dtype.
  absl::StatusOr<AppendResult> AppendInline(const SessionRef& ref, SequenceId seq, std::span<const uint32_t> token_ids,
                                            const void* keys, const void* values, DType dtype);
  absl::StatusOr<CreateResult> Fork(const SessionRef& ref, SequenceId seq);
  // All ids must be the session's; then all are released.
  absl::StatusOr<uint32_t> Release(const SessionRef& ref, std::span<const SequenceId> seqs);
  absl::StatusOr<BlockTableView> Table(const SessionRef& ref, SequenceId seq);
  // Dequantized K/V of tokens [start, start + count) of one layer, original frame,
  // [count][kv_heads][head_dim] each. Decodes outside the lock; FAILED_PRECONDITION while
  // another call runs on the sequence.
  absl::Status Read(const SessionRef& ref, SequenceId seq, uint32_t layer, uint64_t start, uint32_t count,
                    float* keys, float* values);

  // Eviction by request.
  absl::StatusOr<EvictResult> Evict(const SessionRef& ref, EvictScope scope, uint64_t bytes, const std::string& tenant);

  // Watch streams: a grant counts against the tenant's watchers quota and the daemon's cap
  // until ReleaseWatcher.
  absl::StatusOr<WatchGrant> AcquireWatcher(const SessionRef& ref);
  void ReleaseWatcher(SessionId session);

  // Global figures; session listings limited to the caller's tenant unless admin. With no ref
  // (metrics), everything.
  absl::StatusOr<CoreStats> Stats(std::optional<SessionRef> ref) const;
  absl::StatusOr<std::vector<SequenceStats>> ListSequences(const SessionRef& ref) const;

  // Refuse new sessions (UNAVAILABLE) from now on; open sessions keep being served (their
  // sequences, appends, forks) until they close or the daemon stops.
  void BeginDrain();
  // Every block in one state, every reference owned, every count and charge consistent.
  absl::Status CheckInvariants() const;

 private:
  struct AppendPlan;
  class Locked;

  KvCore(const CoreConfig& config, const Preset& preset, const BlockLayout& layout, MemoryBackend* backend,
         const Clock* clock, CoreObserver* observer, uint64_t epoch, uint32_t quant_blocks, uint32_t sink_blocks,
         uint32_t tail_budget);

  absl::StatusOr<Sequence*> FindSequence(SessionState* s, SequenceId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  BlockTableView TableOf(const Sequence& q, bool with_blocks = true) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Before the daemon touches a session's tail (Region::Pin): FAILED_PRECONDITION when its
  // client took pages of it away; nothing may then touch it.
  absl::Status PinTail(const SessionState& s) const;
  uint8_t* SlotPtr(const SessionState& s, uint32_t slot) const;
  uint8_t* BlockPtr(BlockRef b) const;
  // Chain hashes of the full tiles of a prompt that may be adopted (at most len - 1 tokens,
  // so the worker still computes the last prompt token).
  std::vector<BlockHash> PrefixHashes(const BlockHash& ns, std::span<const uint32_t> prompt) const;
  struct HashedPrompt {
    BlockHash ns;
    std::vector<BlockHash> hashes;
  };
  // Checks the prompt's size and the session, then hashes its adoptable tiles (unlocked).
  absl::StatusOr<HashedPrompt> PromptHashes(const SessionRef& ref, std::span<const uint32_t> prompt)
      ABSL_LOCKS_EXCLUDED(mu_);
  BlockClass ClassAt(size_t tile) const;

  // Tiers (kv_core_tiers.cc).
  struct Spill {
    RecordMeta meta;
    std::shared_ptr<std::string> record;  // payload exported; header sealed after the lock
    uint8_t tiers = 0;                    // bit t: hand to tier t; after HandOver, those that took it
    uint32_t tenant = 0;
    BlockRef block;                       // where it was (SpillAll marks the tiers that took it)
  };
  struct TierCounters {
    std::atomic<uint64_t> onboarded{0}, hit_tokens{0}, onboard_failures{0}, spilled{0}, spill_dropped{0};
  };
  // Onboards the blocks of `hashes` that continue the pool's prefix from the tiers; holds
  // every block of the prefix it returns (hashes[0, n)) for the caller, who adopts or releases
  // them. Empty when the tiers add nothing. A miss, a rejected record, a failed import or a
  // full pool ends the prefix there; it never fails the call.
  // `ns` is the namespace the hashes were computed in; a record of another is refused.
  std::vector<BlockRef> OnboardPrefix(const SessionRef& ref, const BlockHash& ns, const std::vector<BlockHash>& hashes)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Releases the blocks OnboardPrefix held (the call that wanted them failed).
  void Unpin(std::vector<BlockRef>& pins) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues block b for the tiers that lack it, before b is evicted (under the lock: the
  // export copies its bytes; sealing and writing wait for the lock's release).
  void SpillBeforeEvict(BlockRef b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Seals and hands queued spills to their tiers (after the lock is released).
  void HandOver(std::vector<Spill>& spills) ABSL_LOCKS_EXCLUDED(mu_);
  // A sealed block's record for the tiers whose policy is kOnSeal; the bits of those that took it.
  uint8_t PutOnSeal(BlockRef block, const RecordMeta& meta, uint32_t tenant) ABSL_LOCKS_EXCLUDED(mu_);
  void OnTierEvent(size_t tier, const BlockHash& hash, bool stored, uint32_t tenant);
  std::vector<TierReport> TierReports() const;

  // Eviction (policy in eviction_policy.h).
  bool EvictForPressure(BlockClass c, EvictReason reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EvictBlock(BlockRef b, EvictReason reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A free block of class c for `tenant`'s seal, evicting under pressure and within the
  // tenant's cache quota; RESOURCE_EXHAUSTED naming why when there is none.
  absl::StatusOr<uint32_t> AllocateBlock(BlockClass c, uint32_t tenant) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyWatermark(BlockClass c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void ReleaseSequence(Sequence& q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndSession(SessionState& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishSessionIfDone(SessionId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks the sequence's call finished; releases it (and maybe its session) if its session
  // ended meanwhile. Returns whether it was released.
  bool EndCall(Sequence& q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::StatusOr<AppendResult> AppendImpl(const SessionRef& ref, SequenceId seq, std::span<const uint32_t> token_ids,
                                          const void* keys, const void* values, DType dtype);
  // Phase A of an append, under the lock; `now` renews the session.
  absl::Status PlanAppend(SessionState& s, SequenceId seq, std::span<const uint32_t> ids,
                          absl::Time now, AppendPlan* plan) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Phase B of an append: the data-plane work outside the lock.
  absl::Status AppendWork(AppendPlan& plan, const void* keys, const void* values, DType dtype);
  // Reports one sealed tile's error and its baselines' to the observer (outside the lock).
  void SampleQuantError(const AppendPlan& plan, int layer, int head);
  absl::StatusOr<AppendResult> FinishAppend(const AppendPlan& plan, absl::Status work) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CoreConfig config_;
  const Preset preset_;
  const BlockLayout layout_;
  MemoryBackend* const backend_;
  const Clock* const clock_;
  CoreObserver* const observer_;
  const uint64_t epoch_;
  const uint32_t tail_budget_;  // tail slots all sessions may reserve together
  std::unique_ptr<Sealer> sealer_;
  std::unique_ptr<Region> quant_region_;
  std::unique_ptr<Region> sink_region_;
  EventLog events_;
  std::atomic<uint64_t> sessions_ended_{0};

  mutable Mutex mu_;
  UsageLedger usage_ ABSL_GUARDED_BY(mu_);
  TenantRegistry tenants_ ABSL_GUARDED_BY(mu_);
  SessionTable sessions_ ABSL_GUARDED_BY(mu_);
  PoolSet pools_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<SequenceId, Sequence> sequences_ ABSL_GUARDED_BY(mu_);
  uint64_t tick_ ABSL_GUARDED_BY(mu_) = 0;
  SessionId next_session_ ABSL_GUARDED_BY(mu_) = 1;
  SequenceId next_sequence_ ABSL_GUARDED_BY(mu_) = 1;
  // Sessions between reservation and creation (OpenSession makes the tail region unlocked).
  struct Opening {
    uint32_t tenant = 0;
    uint32_t slots = 0;
    bool observer = false;
  };
  absl::flat_hash_map<SessionId, Opening> opening_ ABSL_GUARDED_BY(mu_);
  uint32_t watchers_ ABSL_GUARDED_BY(mu_) = 0;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  CoreStats counters_ ABSL_GUARDED_BY(mu_);  // cumulative counters only
  WhatIfCache whatif_ ABSL_GUARDED_BY(mu_);
  // Regions of ended sessions, destroyed by Locked after the lock is released.
  std::vector<std::unique_ptr<Region>> graveyard_ ABSL_GUARDED_BY(mu_);
  // Tiers: set before the first session, then read-only.
  TierIdentity tier_identity_;
  std::vector<BlockTier*> tiers_;
  std::unique_ptr<TierCounters[]> tier_counters_;
  // Evicted blocks' records waiting for the lock's release (Locked hands them over), and
  // their bytes: an eviction beyond kSpillBudgetBytes in one locked call drops the block.
  std::vector<Spill> spills_ ABSL_GUARDED_BY(mu_);
  uint64_t spill_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

// The core's lock for one public call; regions of sessions that ended during the call are
// destroyed after the lock is released (destroying one may unmap memory or call the device),
// and blocks evicted during it are handed to the tiers.
class ABSL_SCOPED_LOCKABLE KvCore::Locked {
 public:
  explicit Locked(KvCore* core) ABSL_EXCLUSIVE_LOCK_FUNCTION(core->mu_) : core_(core) { core_->mu_.Lock(); }
  ~Locked() ABSL_UNLOCK_FUNCTION() {
    core_->mu_.AssertHeld();
    std::vector<std::unique_ptr<Region>> dead = std::move(core_->graveyard_);
    core_->graveyard_.clear();
    std::vector<Spill> spills = std::move(core_->spills_);
    core_->spills_.clear();
    core_->spill_bytes_ = 0;
    core_->mu_.Unlock();
    if (!spills.empty()) core_->HandOver(spills);
  }
  Locked(const Locked&) = delete;
  Locked& operator=(const Locked&) = delete;

 private:
  KvCore* const core_;
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_CORE_KV_CORE_H_
