// KvCore: creation, tenants, sessions and their leases, lending memory, sequences' lifecycle.
#include "daemon/core/kv_core.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <unistd.h>

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/codec_status.h"
#include "common/random.h"
#include "daemon/core/check.h"
#include "daemon/core/cpu_sealer.h"

namespace kvarn {
namespace {

absl::Status ValidateModel(const ModelConfig& m, Preset* preset) {
  if (m.num_layers < 1 || m.num_layers > 1024) return absl::InvalidArgumentError("num_layers must be in 1..1024");
  if (m.num_kv_heads < 1 || m.num_kv_heads > 256) return absl::InvalidArgumentError("num_kv_heads must be in 1..256");
  if (const CodecStatus s = CheckHeadDim(static_cast<int>(m.head_dim)); !s.ok()) return FromCodec(s);
  if (const CodecStatus s = ParsePreset(m.preset, preset); !s.ok()) return FromCodec(s);
  if (m.sink_tokens != 0 && m.sink_tokens != static_cast<uint32_t>(preset->tile_tokens)) {
    return absl::InvalidArgumentError(absl::StrCat("sink_tokens must be 0 or ", preset->tile_tokens));
  }
  return absl::OkStatus();
}

std::string DescribeModel(const ModelConfig& m) {
  return absl::StrCat(m.model_id, " layers=", m.num_layers, " kv_heads=", m.num_kv_heads, " head_dim=", m.head_dim,
                      " preset=", m.preset, " sink_tokens=", m.sink_tokens);
}

uint64_t RandomEpoch() {
  uint64_t e = 0;
  while (e == 0) {
    if (!FillRandom(reinterpret_cast<uint8_t*>(&e), sizeof(e)).ok()) e = std::random_device{}();
  }
  return e;
}

}  // namespace

absl::StatusOr<PoolPlan> KvCore::Plan(const CoreConfig& config) {
  PoolPlan plan;
  Preset& preset = plan.preset;
  if (absl::Status s = ValidateModel(config.model, &preset); !s.ok()) return s;
  if (!(config.fp16_share > 0.0 && config.fp16_share < 1.0)) return absl::InvalidArgumentError("fp16_share must be in (0, 1)");
  if (config.model.sink_tokens > 0 && !(config.sink_share > 0.0 && config.sink_share < 1.0)) {
    return absl::InvalidArgumentError("sink_share must be in (0, 1)");
  }
  if (!(config.low_watermark > 0.0 && config.low_watermark <= config.high_watermark && config.high_watermark <= 1.0)) {
    return absl::InvalidArgumentError("watermarks must satisfy 0 < low <= high <= 1");
  }
  if (config.lease_ttl <= config.keepalive_interval) return absl::InvalidArgumentError("lease_ttl must exceed keepalive_interval");
  if (config.tenant_max_sessions < 1 || config.tenant_max_watchers < 1) {
    return absl::InvalidArgumentError("tenant_max_sessions and tenant_max_watchers must be at least 1");
  }
  plan.layout = MakeBlockLayout(preset, static_cast<int>(config.model.num_layers),
                                static_cast<int>(config.model.num_kv_heads),
                                static_cast<int>(config.model.head_dim));
  const BlockLayout& layout = plan.layout;
  const uint64_t fp16_capacity = static_cast<uint64_t>(static_cast<double>(config.capacity_bytes) * config.fp16_share);
  const uint64_t quant_blocks = (config.capacity_bytes - fp16_capacity) / layout.quant_block_bytes();
  const uint64_t fp16_blocks = fp16_capacity / layout.fp16_block_bytes();
  const uint64_t sink_blocks =
      config.model.sink_tokens > 0 ? static_cast<uint64_t>(static_cast<double>(fp16_blocks) * config.sink_share) : 0;
  const uint64_t tail_budget = fp16_blocks - sink_blocks;
  if (quant_blocks < 1 || tail_budget < 1 || (config.model.sink_tokens > 0 && sink_blocks < 1) ||
      quant_blocks > UINT32_MAX || fp16_blocks > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "capacity ", config.capacity_bytes, " bytes does not fit this layout: a quantized block is ", layout.quant_block_bytes(),
        " bytes and an fp16 block ", layout.fp16_block_bytes(), "; need at least one quantized block, one tail slot",
        config.model.sink_tokens > 0 ? " and one sink block" : "", " (fp16_share ", config.fp16_share, ", sink_share ",
        config.sink_share, " give ", quant_blocks, ", ", tail_budget, " and ", sink_blocks, ")"));
  }
  plan.quant_blocks = static_cast<uint32_t>(quant_blocks);
  plan.sink_blocks = static_cast<uint32_t>(sink_blocks);
  plan.tail_slots = static_cast<uint32_t>(tail_budget);
  return plan;
}

absl::StatusOr<std::unique_ptr<KvCore>> KvCore::Create(const CoreConfig& config, MemoryBackend* backend,
                                                       const Clock* clock, SealerFactory sealer, CoreObserver* observer,
                                                       uint64_t epoch) {
  auto plan = Plan(config);
  if (!plan.ok()) return plan.status();
  const Preset& preset = plan->preset;
  const BlockLayout& layout = plan->layout;
  const uint64_t quant_blocks = plan->quant_blocks, sink_blocks = plan->sink_blocks, tail_budget = plan->tail_slots;
  auto core = std::unique_ptr<KvCore>(new KvCore(config, preset, layout, backend, clock, observer,
                                                 epoch ? epoch : RandomEpoch(), static_cast<uint32_t>(quant_blocks),
                                                 static_cast<uint32_t>(sink_blocks), static_cast<uint32_t>(tail_budget)));
  auto quant = backend->Create(RegionKind::kQuant, quant_blocks * layout.quant_block_bytes());
  if (!quant.ok()) return quant.status();
  core->quant_region_ = std::move(*quant);
  if (sink_blocks > 0) {
    auto sink = backend->Create(RegionKind::kSink, sink_blocks * layout.fp16_block_bytes());
    if (!sink.ok()) return sink.status();
    core->sink_region_ = std::move(*sink);
  }
  core->sealer_ = sealer ? sealer(preset, layout) : std::make_unique<CpuSealer>(preset, layout);
  return core;
}

KvCore::KvCore(const CoreConfig& config, const Preset& preset, const BlockLayout& layout, MemoryBackend* backend,
               const Clock* clock, CoreObserver* observer, uint64_t epoch, uint32_t quant_blocks, uint32_t sink_blocks,
               uint32_t tail_budget)
    : config_(config), preset_(preset), layout_(layout), backend_(backend), clock_(clock), observer_(observer),
      epoch_(epoch), tail_budget_(tail_budget),
      tenants_(NamespaceBase(config.model, preset), config.tenant_salt_secret, config.share_across_tenants,
               QuotaDefaults{config.tenant_max_sessions, config.tenant_max_watchers, tail_budget,
                             uint64_t{quant_blocks} * layout.quant_block_bytes() + uint64_t{sink_blocks} * layout.fp16_block_bytes()}),
      sessions_(epoch, config.lease_ttl, config.grace, &usage_),
      pools_(quant_blocks, sink_blocks, layout.quant_block_bytes(), layout.fp16_block_bytes(), &usage_),
      whatif_(quant_blocks, sink_blocks),
      tier_identity_(MakeTierIdentity(config.model, static_cast<uint32_t>(layout.tile_tokens), layout.quant_block_bytes(),
                                      layout.fp16_block_bytes(), config.tenant_salt_secret)) {}

KvCore::~KvCore() = default;

absl::Status KvCore::ConfigureTenants(const std::vector<TenantSpec>& specs) {
  Locked lock(this);
  if (!tenants_.configured() && (!sessions_.all().empty())) {
    return absl::FailedPreconditionError("tenants can be configured only before the first session");
  }
  const std::vector<uint32_t> revoked = tenants_.Configure(specs);
  std::vector<SessionId> ending;
  for (const auto& [id, s] : sessions_.all()) {
    if (!s.closing && std::find(revoked.begin(), revoked.end(), s.tenant) != revoked.end()) ending.push_back(id);
  }
  for (SessionId id : ending) EndSession(*sessions_.Get(id));
  return absl::OkStatus();
}

bool KvCore::tenants_configured() const {
  MutexLock lock(&mu_);
  return tenants_.configured();
}

std::string KvCore::TenantName(uint32_t tenant) const {
  MutexLock lock(&mu_);
  return tenant < tenants_.size() ? tenants_.get(tenant).name : std::string();
}

std::vector<TenantReport> KvCore::TenantReports() const {
  MutexLock lock(&mu_);
  std::vector<TenantReport> out;
  if (!tenants_.configured()) return out;
  for (uint32_t t = 0; t < tenants_.size(); ++t) {
    const Tenant& ten = tenants_.get(t);
    if (!ten.configured) continue;
    TenantReport r;
    r.name = ten.name;
    r.configured = true;
    r.quota = ten.quota;
    if (t < usage_.all().size()) r.usage = usage_.all()[t];
    out.push_back(std::move(r));
  }
  return out;
}

absl::Status KvCore::PinTail(const SessionState& s) const {
  if (!s.tail_region) return absl::OkStatus();
  absl::Status pinned = s.tail_region->Pin();
  if (pinned.ok()) return pinned;
  return absl::Status(pinned.code(), absl::StrCat("this session's tail memory cannot be used: ", pinned.message()));
}

uint8_t* KvCore::SlotPtr(const SessionState& s, uint32_t slot) const {
  return s.tail_region->data() + static_cast<size_t>(slot) * layout_.fp16_block_bytes();
}

uint8_t* KvCore::BlockPtr(BlockRef b) const {
  Region* r = b.cls == BlockClass::kQuant ? quant_region_.get() : sink_region_.get();
  const size_t bytes = b.cls == BlockClass::kQuant ? layout_.quant_block_bytes() : layout_.fp16_block_bytes();
  return r->data() + static_cast<size_t>(b.id) * bytes;
}

BlockClass KvCore::ClassAt(size_t tile) const {
  return tile == 0 && config_.model.sink_tokens > 0 ? BlockClass::kSink : BlockClass::kQuant;
}

BlockTableView KvCore::TableOf(const Sequence& q, bool with_blocks) const {
  BlockTableView t;
  t.tokens = q.tokens;
  t.has_sink = q.has_sink;
  t.sink_block = q.sink;
  if (with_blocks) t.quant_blocks = q.quant;
  t.blocks_omitted = !with_blocks;
  t.tail_slot = q.tail_slot;
  t.tail_tokens = q.tail_tokens;
  return t;
}

absl::StatusOr<Sequence*> KvCore::FindSequence(SessionState* s, SequenceId id) {
  auto it = sequences_.find(id);
  // Another session's sequence looks exactly like an unknown one.
  if (it == sequences_.end() || it->second.session != s->id || it->second.doomed) {
    return absl::NotFoundError(absl::StrCat("no sequence ", id, " in this session"));
  }
  return &it->second;
}

std::vector<BlockHash> KvCore::PrefixHashes(const BlockHash& ns, std::span<const uint32_t> prompt) const {
  return PromptBlockHashes(ns, static_cast<uint32_t>(preset_.tile_tokens), prompt);
}

absl::StatusOr<OpenResult> KvCore::OpenSession(const OpenParams& p) {
  if (p.tenant.empty() || p.tenant.size() > 256) return absl::InvalidArgumentError("tenant must be 1..256 bytes");
  if (!(p.layout == config_.model)) {
    return absl::InvalidArgumentError(absl::StrCat("layout mismatch: the daemon serves ", DescribeModel(config_.model),
                                                   "; the session declared ", DescribeModel(p.layout)));
  }
  const uint32_t slots = p.observer ? 0 : p.max_sequences == 0 ? config_.default_tail_slots : p.max_sequences;
  if (slots > config_.max_tail_slots) {
    return absl::InvalidArgumentError(absl::StrCat("max_sequences ", slots, " exceeds the limit ", config_.max_tail_slots));
  }
  // A presented admin token must be the daemon's: a wrong one is refused, never quietly
  // taken for a tenant's session (a tool would then report a tenant's view as the daemon's).
  const bool admin = !config_.admin_token.empty() && p.admin_token.size() == config_.admin_token.size() &&
                     CRYPTO_memcmp(p.admin_token.data(), config_.admin_token.data(), p.admin_token.size()) == 0;
  if (!p.admin_token.empty() && !admin) {
    return absl::PermissionDeniedError(config_.admin_token.empty()
                                           ? "this kvarnd has no admin token; open the session without one"
                                           : "the admin token does not match this kvarnd's");
  }
  SessionState s;
  if (absl::Status r = FillRandom(s.secret.data(), s.secret.size()); !r.ok()) return r;
  {
    Locked lock(this);
    if (draining_) return absl::UnavailableError("draining: open a session elsewhere");
    auto tenant = tenants_.Authenticate(p.tenant, p.tenant_token);
    if (!tenant.ok()) return tenant.status();
    const Tenant& t = tenants_.get(*tenant);
    uint32_t opening_observers = 0;
    for (const auto& [id, o] : opening_) opening_observers += o.observer;
    if (p.observer && sessions_.observer_count() + opening_observers >= config_.max_observer_sessions) {
      return absl::ResourceExhaustedError(absl::StrCat("all ", config_.max_observer_sessions,
                                                       " observer sessions are in use (max_observer_sessions)"));
    }
    if (absl::Status q = CheckSessionQuota(t.name, t.quota, usage_.of(*tenant), slots); !q.ok()) return q;
    // Tail memory the backend still keeps for the processes of ended sessions counts too.
    const uint64_t retained = (backend_->RetainedBytes() + layout_.fp16_block_bytes() - 1) / layout_.fp16_block_bytes();
    const uint64_t in_use = sessions_.tail_slots_reserved() + retained;
    if (in_use + slots > tail_budget_) {
      return absl::ResourceExhaustedError(absl::StrCat("no room for ", slots, " tail slots: ",
                                                       tail_budget_ - std::min<uint64_t>(tail_budget_, in_use), " of ",
                                                       tail_budget_, " are free; close a session or ask for fewer"));
    }
    sessions_.Reserve(*tenant, slots);
    s.id = next_session_++;
    s.tenant = *tenant;
    opening_.emplace(s.id, Opening{*tenant, slots, p.observer});
  }
  // The tail region is created outside the lock (it may map memory or call the device); its
  // slots are reserved meanwhile.
  std::unique_ptr<Region> tail;
  absl::Status created;
  if (slots > 0) {
    auto region = backend_->Create(RegionKind::kTail, uint64_t{slots} * layout_.fp16_block_bytes());
    if (region.ok()) {
      tail = std::move(*region);
    } else {
      created = region.status();
    }
  }
  Locked lock(this);
  opening_.erase(s.id);
  if (!created.ok()) {
    sessions_.Unreserve(s.tenant, slots);
    return created;
  }
  s.client_name = p.client_name;
  s.admin = admin;
  s.observer = p.observer;
  s.tail_region = std::move(tail);
  s.slots = slots;
  for (uint32_t i = slots; i > 0; --i) s.free_slots.push_back(i - 1);
  s.renewed = clock_->Now();
  OpenResult r;
  r.session = s.id;
  r.secret = s.secret;
  r.prefix_namespace = tenants_.get(s.tenant).ns;
  PoolView& v = r.pool;
  v.backend = backend_->name();
  v.tile_tokens = static_cast<uint32_t>(preset_.tile_tokens);
  v.record_bytes = layout_.record_bytes;
  v.quant_block_bytes = layout_.quant_block_bytes();
  v.fp16_block_bytes = layout_.fp16_block_bytes();
  v.quant_blocks = pools_.pool(BlockClass::kQuant).total();
  v.sink_blocks = pools_.pool(BlockClass::kSink).total();
  v.quant_bytes = quant_region_->size();
  v.sink_bytes = sink_region_ ? sink_region_->size() : 0;
  v.tail_bytes = s.tail_region ? s.tail_region->size() : 0;
  v.tail_slots = slots;
  v.epoch = epoch_;
  v.daemon_pid = static_cast<int>(getpid());
  if (draining_) {
    // Drain began while the region was made: refuse after all.
    sessions_.Unreserve(s.tenant, slots);
    graveyard_.push_back(std::move(s.tail_region));
    return absl::UnavailableError("draining: open a session elsewhere");
  }
  sessions_.Add(std::move(s));
  return r;
}

absl::Status KvCore::KeepAlive(const SessionRef& ref) {
  Locked lock(this);
  auto s = sessions_.Find(ref);
  if (!s.ok()) return s.status();
  sessions_.Renew(**s, clock_->Now());
  return absl::OkStatus();
}

absl::Status KvCore::AttachStream(const SessionRef& ref) {
  Locked lock(this);
  auto s = sessions_.Find(ref);
  if (!s.ok()) return s.status();
  sessions_.StreamAttached(**s, clock_->Now());
  return absl::OkStatus();
}

void KvCore::DetachStream(SessionId id) {
  Locked lock(this);
  if (SessionState* s = sessions_.Get(id); s != nullptr) sessions_.StreamDetached(*s, clock_->Now());
}

absl::Status KvCore::CheckSession(const SessionRef& ref) const {
  MutexLock lock(&mu_);
  return sessions_.Find(ref).status();
}

absl::StatusOr<uint32_t> KvCore::CloseSession(const SessionRef& ref) {
  Locked lock(this);
  auto s = sessions_.Find(ref);
  if (!s.ok()) return s.status();
  const uint32_t n = static_cast<uint32_t>((*s)->sequences.size());
  EndSession(**s);
  return n;
}

int KvCore::ExpireSessions() {
  Locked lock(this);
  const std::vector<SessionId> expired = sessions_.Expired(clock_->Now());
  for (SessionId id : expired) {
    ++counters_.sessions_expired;
    EndSession(*sessions_.Get(id));
  }
  return static_cast<int>(expired.size());
}

void KvCore::EndSession(SessionState& s) {
  sessions_.MarkClosing(s);
  sessions_ended_.fetch_add(1, std::memory_order_release);
  if (s.watchers > 0) {
    // Its Watch streams end when they see sessions_ended move; their grants go with it.
    usage_.of(s.tenant).watchers -= s.watchers;
    watchers_ -= s.watchers;
    s.watchers = 0;
  }
  std::vector<SequenceId> seqs(s.sequences.begin(), s.sequences.end());
  for (SequenceId id : seqs) {
    Sequence& q = sequences_.at(id);
    if (q.busy) {
      q.doomed = true;  // released by the in-flight call when it finishes
    } else {
      ReleaseSequence(q);
    }
  }
  FinishSessionIfDone(s.id);
}

void KvCore::FinishSessionIfDone(SessionId id) {
  const SessionState* s = sessions_.Get(id);
  if (s == nullptr || !s->closing || !s->sequences.empty()) return;
  graveyard_.push_back(sessions_.Remove(id));  // the tail region goes once the lock is released
}

bool KvCore::EndCall(Sequence& q) {
  q.busy = false;
  if (!q.doomed) return false;
  const SessionId session = q.session;
  ReleaseSequence(q);
  FinishSessionIfDone(session);
  return true;
}

void KvCore::ReleaseSequence(Sequence& q) {
  // Children before parents, so parents are the more recently used and leave last.
  for (auto it = q.quant.rbegin(); it != q.quant.rend(); ++it) pools_.Release({BlockClass::kQuant, *it}, ++tick_);
  if (q.has_sink) pools_.Release({BlockClass::kSink, q.sink}, ++tick_);
  SessionState* s = sessions_.Get(q.session);
  KVARN_CHECK(s != nullptr, "a sequence's session exists");
  s->free_slots.push_back(q.tail_slot);
  s->sequences.erase(q.id);
  sequences_.erase(q.id);
}

absl::StatusOr<std::vector<LentSegment>> KvCore::LendMemory(const SessionRef& ref, int pid, uint64_t identity) {
  Locked lock(this);
  auto found = sessions_.Find(ref);
  if (!found.ok()) return found.status();
  SessionState& s = **found;
  const bool foreign = pid <= 0;
  if (foreign && backend_->NeedsImporterPid()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the peer is in another PID namespace (SO_PEERCRED gives no pid) and the ", backend_->name(),
        " backend must know the process it lends memory to: run the worker in kvarnd's PID namespace "
        "(a sidecar with shareProcessNamespace: true)"));
  }
  const int peer = foreign ? SessionState::kForeignPeer : pid;
  if (s.peer_pid != 0 && s.peer_pid != peer) {
    return absl::PermissionDeniedError(absl::StrCat("session ", s.id, " is bound to another process"));
  }
  std::vector<LentSegment> out;
  const auto lend = [&](Region* r, RegionKind kind, bool writable) -> absl::Status {
    LentSegment seg;
    seg.kind = kind;
    seg.info = r->Describe();
    seg.writable = writable;
    if (r->fd() >= 0) {
      seg.fd = UniqueFd(fcntl(r->fd(), F_DUPFD_CLOEXEC, 0));
      if (!seg.fd.valid()) return absl::ResourceExhaustedError("no descriptor left to lend memory");
    }
    out.push_back(std::move(seg));
    return absl::OkStatus();
  };
  if (absl::Status st = lend(quant_region_.get(), RegionKind::kQuant, false); !st.ok()) return st;
  if (sink_region_) {
    if (absl::Status st = lend(sink_region_.get(), RegionKind::kSink, false); !st.ok()) return st;
  }
  if (s.tail_region) {
    if (absl::Status st = lend(s.tail_region.get(), RegionKind::kTail, true); !st.ok()) return st;
    if (!foreign) s.tail_region->LendTo(pid, identity);
  }
  s.peer_pid = peer;
  return out;
}

absl::StatusOr<uint32_t> KvCore::RingGrant(const SessionRef& ref, int pid) const {
  MutexLock lock(&mu_);
  auto found = sessions_.Find(ref);
  if (!found.ok()) return found.status();
  const SessionState& s = **found;
  if (s.slots == 0) return absl::FailedPreconditionError("a session without tail slots commits nothing");
  if (s.peer_pid == 0) return absl::FailedPreconditionError("the session's memory is not lent yet: map the pool first");
  if (s.peer_pid != (pid <= 0 ? SessionState::kForeignPeer : pid)) {
    return absl::PermissionDeniedError(absl::StrCat("session ", s.id, " is bound to another process"));
  }
  return s.slots;
}

absl::StatusOr<KvCore::HashedPrompt> KvCore::PromptHashes(const SessionRef& ref, std::span<const uint32_t> prompt) {
  if (prompt.size() > config_.max_prompt_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("prompt of ", prompt.size(), " tokens exceeds the limit ",
                                                   config_.max_prompt_tokens));
  }
  BlockHash ns;
  {
    MutexLock lock(&mu_);
    auto s = sessions_.Find(ref);
    if (!s.ok()) return s.status();
    ns = tenants_.get((*s)->tenant).ns;
  }
  return HashedPrompt{ns, PrefixHashes(ns, prompt)};  // hashing runs outside the lock
}

absl::StatusOr<CreateResult> KvCore::CreateSequence(const SessionRef& ref, std::span<const uint32_t> prompt) {
  auto hashed = PromptHashes(ref, prompt);
  if (!hashed.ok()) return hashed.status();
  // Blocks of the prefix the tiers continue, held for this call (hashes[0, pins.size())).
  std::vector<BlockRef> pins = OnboardPrefix(ref, hashed->ns, hashed->hashes);
  Locked lock(this);
  auto s = sessions_.Find(ref);
  if (!s.ok()) {
    Unpin(pins);
    return s.status();
  }
  SessionState& session = **s;
  if (session.free_slots.empty()) {
    Unpin(pins);
    return absl::ResourceExhaustedError(session.slots == 0
        ? std::string("an observer session has no tail slots: open one with max_sequences")
        : absl::StrCat("all ", session.slots, " tail slots of this session are in use; release a sequence"));
  }
  std::vector<BlockHash> rehashed;
  if (const BlockHash& ns = tenants_.get(session.tenant).ns; ns != hashed->ns) {
    // A tenants reload moved the tenant to another namespace while the prompt was hashed.
    rehashed = PrefixHashes(ns, prompt);
    Unpin(pins);
  }
  const std::vector<BlockHash>& hashes = rehashed.empty() ? hashed->hashes : rehashed;
  sessions_.Renew(session, clock_->Now());
  Sequence q;
  q.id = next_sequence_++;
  q.session = session.id;
  q.tail_slot = session.free_slots.back();
  session.free_slots.pop_back();
  for (size_t i = 0; i < hashes.size(); ++i) {
    BlockRef b;
    if (i < pins.size()) {
      b = pins[i];  // held already
    } else {
      const std::optional<BlockRef> hit = pools_.Find(hashes[i]);
      if (!hit.has_value() || hit->cls != ClassAt(i)) break;
      pools_.Acquire(*hit, ++tick_);
      b = *hit;
    }
    if (b.cls == BlockClass::kSink) {
      q.has_sink = true;
      q.sink = b.id;
    } else {
      q.quant.push_back(b.id);
    }
    q.last_hash = hashes[i];
    q.tokens += static_cast<uint64_t>(preset_.tile_tokens);
  }
  counters_.prefix_queried_tokens += prompt.size();
  counters_.prefix_hit_tokens += q.tokens;
  whatif_.Query(hashes, [this](size_t i) { return ClassAt(i); }, static_cast<uint64_t>(preset_.tile_tokens));
  CreateResult r;
  r.sequence = q.id;
  r.cached_tokens = q.tokens;
  r.table = TableOf(q);
  session.sequences.insert(q.id);
  sequences_.emplace(q.id, std::move(q));
  return r;
}

absl::StatusOr<LookupResult> KvCore::Lookup(const SessionRef& ref, std::span<const uint32_t> prompt, bool prefetch) {
  auto hashed = PromptHashes(ref, prompt);
  if (!hashed.ok()) return hashed.status();
  const std::vector<BlockHash>& hashes = hashed->hashes;
  if (prefetch) {
    std::vector<BlockRef> pins = OnboardPrefix(ref, hashed->ns, hashes);
    if (!pins.empty()) {
      Locked lock(this);
      Unpin(pins);
    }
  }
  const uint64_t g = static_cast<uint64_t>(preset_.tile_tokens);
  LookupResult r;
  size_t i = 0;
  {
    MutexLock lock(&mu_);
    for (; i < hashes.size(); ++i) {
      const std::optional<BlockRef> hit = pools_.Find(hashes[i]);
      if (!hit.has_value() || hit->cls != ClassAt(i)) break;
    }
  }
  r.pool_tokens = i * g;
  for (BlockTier* t : tiers_) r.tier_tokens.emplace_back(std::string(t->name()), 0);
  // The tiers continue the prefix block by block, each block from the first tier holding it
  // (no block is read: the disk tier's index, one round trip per memcached block).
  for (; i < hashes.size(); ++i) {
    size_t t = 0;
    while (t < tiers_.size() && !tiers_[t]->Contains(hashes[i])) ++t;
    if (t == tiers_.size()) break;
    r.tier_tokens[t].second += g;
  }
  return r;
}

absl::StatusOr<uint32_t> KvCore::Release(const SessionRef& ref, std::span<const SequenceId> seqs) {
  Locked lock(this);
  auto s = sessions_.Find(ref);
  if (!s.ok()) return s.status();
  absl::flat_hash_set<SequenceId> seen;
  for (SequenceId id : seqs) {
    auto q = FindSequence(*s, id);
    if (!q.ok()) return q.status();
    if ((*q)->busy) return absl::FailedPreconditionError(absl::StrCat("sequence ", id, " has a call in flight"));
    if (!seen.insert(id).second) return absl::InvalidArgumentError(absl::StrCat("sequence ", id, " listed twice"));
  }
  sessions_.Renew(**s, clock_->Now());
  for (SequenceId id : seqs) ReleaseSequence(sequences_.at(id));
  return static_cast<uint32_t>(seqs.size());
}

absl::StatusOr<BlockTableView> KvCore::Table(const SessionRef& ref, SequenceId seq) {
  Locked lock(this);
  auto s = sessions_.Find(ref);
  if (!s.ok()) return s.status();
  auto q = FindSequence(*s, seq);
  if (!q.ok()) return q.status();
  return TableOf(**q);
}

void KvCore::BeginDrain() {
  MutexLock lock(&mu_);
  draining_ = true;
}

}  // namespace kvarn
