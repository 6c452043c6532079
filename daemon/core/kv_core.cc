#include "daemon/core/kv_core.h"

#include <algorithm>
#include <unistd.h>

#include <random>

#include "absl/strings/str_cat.h"
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
  return absl::StrCat(m.model_id, " layers=", m.num_layers, " kv_heads=", m.num_kv_heads,
                      " head_dim=", m.head_dim, " preset=", m.preset, " sink_tokens=", m.sink_tokens);
}

uint64_t RandomEpoch() {
  std::random_device rd;
  uint64_t e = 0;
  while (e == 0) e = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return e;
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvCore>> KvCore::Create(const CoreConfig& config,
                                                       MemoryBackend* backend, const Clock* clock,
                                                       SealerFactory sealer,
                                                       CoreObserver* observer, uint64_t epoch) {
  Preset preset;
  if (absl::Status s = ValidateModel(config.model, &preset); !s.ok()) return s;
  if (!(config.fp16_share > 0.0 && config.fp16_share < 1.0)) {
    return absl::InvalidArgumentError("fp16_share must be in (0, 1)");
  }
  if (!(config.low_watermark > 0.0 && config.low_watermark <= config.high_watermark &&
        config.high_watermark <= 1.0)) {
    return absl::InvalidArgumentError("watermarks must satisfy 0 < low <= high <= 1");
  }
  if (config.lease_ttl <= config.keepalive_interval) {
    return absl::InvalidArgumentError("lease_ttl must exceed keepalive_interval");
  }
  BlockLayout layout;
  layout.num_layers = static_cast<int>(config.model.num_layers);
  layout.num_kv_heads = static_cast<int>(config.model.num_kv_heads);
  layout.head_dim = static_cast<int>(config.model.head_dim);
  layout.tile_tokens = preset.tile_tokens;
  layout.record_bytes = preset.RecordBytes(layout.head_dim);
  auto core = std::unique_ptr<KvCore>(
      new KvCore(config, preset, layout, backend, clock, observer, epoch ? epoch : RandomEpoch()));
  const uint64_t fp16_capacity = static_cast<uint64_t>(static_cast<double>(config.capacity_bytes) * config.fp16_share);
  const uint64_t quant_blocks = (config.capacity_bytes - fp16_capacity) / layout.quant_block_bytes();
  const uint64_t fp16_budget = fp16_capacity / layout.fp16_block_bytes();
  if (quant_blocks < 1 || fp16_budget < 2 || quant_blocks > UINT32_MAX || fp16_budget > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "capacity ", config.capacity_bytes, " bytes does not fit this layout: a quantized block is ",
        layout.quant_block_bytes(), " bytes and an fp16 block ", layout.fp16_block_bytes(),
        "; need at least one quantized and two fp16 blocks"));
  }
  core->fp16_budget_ = static_cast<uint32_t>(fp16_budget);
  const uint32_t sink_blocks = config.model.sink_tokens > 0 ? core->fp16_budget_ : 0;
  auto quant = backend->Create(RegionKind::kQuant, quant_blocks * layout.quant_block_bytes());
  if (!quant.ok()) return quant.status();
  core->quant_region_ = std::move(*quant);
  if (sink_blocks > 0) {
    auto sink = backend->Create(RegionKind::kSink, uint64_t{sink_blocks} * layout.fp16_block_bytes());
    if (!sink.ok()) return sink.status();
    core->sink_region_ = std::move(*sink);
  }
  core->sealer_ = sealer ? sealer(preset, layout) : std::make_unique<CpuSealer>(preset, layout);
  absl::MutexLock lock(&core->mu_);
  core->pools_ = PoolSet(static_cast<uint32_t>(quant_blocks), sink_blocks);
  return core;
}

KvCore::KvCore(const CoreConfig& config, const Preset& preset, const BlockLayout& layout,
               MemoryBackend* backend, const Clock* clock, CoreObserver* observer, uint64_t epoch)
    : config_(config), preset_(preset), layout_(layout), backend_(backend), clock_(clock),
      observer_(observer), epoch_(epoch), pools_(0, 0) {}

KvCore::~KvCore() = default;

uint32_t KvCore::InternTenant(const std::string& name) {
  const std::string key = config_.share_across_tenants ? std::string("*shared*") : name;
  auto it = tenant_ids_.find(name);
  if (it != tenant_ids_.end()) return it->second;
  Tenant t;
  t.name = name;
  HashNamespaceInput in;
  in.model_id = config_.model.model_id;
  in.num_layers = config_.model.num_layers;
  in.num_kv_heads = config_.model.num_kv_heads;
  in.head_dim = config_.model.head_dim;
  in.tile_tokens = static_cast<uint32_t>(preset_.tile_tokens);
  in.preset = preset_.Name();
  in.sink_tokens = config_.model.sink_tokens;
  in.tenant_salt = TenantSalt(key, config_.tenant_salt_secret);
  t.ns = NamespaceDigest(in);
  tenants_.push_back(std::move(t));
  const uint32_t id = static_cast<uint32_t>(tenants_.size() - 1);
  tenant_ids_.emplace(name, id);
  return id;
}

std::string KvCore::TenantName(uint32_t tenant) const {
  absl::MutexLock lock(&mu_);
  return tenant < tenants_.size() ? tenants_[tenant].name : std::string();
}

absl::StatusOr<KvCore::Session*> KvCore::FindSession(SessionRef ref) {
  if (ref.epoch != epoch_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "stale epoch ", ref.epoch, ": the daemon restarted (epoch ", epoch_, "); reconnect and reopen the session"));
  }
  auto it = sessions_.find(ref.session);
  if (it == sessions_.end() || it->second.closing) {
    return absl::NotFoundError(absl::StrCat("no session ", ref.session));
  }
  it->second.last_seen = clock_->Now();
  return &it->second;
}

absl::StatusOr<KvCore::Sequence*> KvCore::FindSequence(Session* s, SequenceId id) {
  auto it = sequences_.find(id);
  // Another session's sequence looks exactly like an unknown one.
  if (it == sequences_.end() || it->second.session != s->id || it->second.doomed) {
    return absl::NotFoundError(absl::StrCat("no sequence ", id, " in this session"));
  }
  return &it->second;
}

uint8_t* KvCore::SlotPtr(const Session& s, uint32_t slot) const {
  return s.tail_region->data() + static_cast<size_t>(slot) * layout_.fp16_block_bytes();
}

size_t KvCore::BlockBytes(BlockClass c) const {
  return c == BlockClass::kQuant ? layout_.quant_block_bytes() : layout_.fp16_block_bytes();
}

uint8_t* KvCore::BlockPtr(BlockRef b) const {
  Region* r = b.cls == BlockClass::kQuant ? quant_region_.get() : sink_region_.get();
  return r->data() + static_cast<size_t>(b.id) * BlockBytes(b.cls);
}

std::optional<BlockRef> KvCore::LastBlock(const Sequence& q) const {
  if (!q.quant.empty()) return BlockRef{BlockClass::kQuant, q.quant.back()};
  if (q.has_sink) return BlockRef{BlockClass::kSink, q.sink};
  return std::nullopt;
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

std::vector<BlockHash> KvCore::PrefixHashes(const BlockHash& ns, std::span<const uint32_t> prompt) const {
  const size_t g = static_cast<size_t>(preset_.tile_tokens);
  const size_t blocks = prompt.empty() ? 0 : (prompt.size() - 1) / g;
  std::vector<BlockHash> hashes;
  hashes.reserve(blocks);
  BlockHash parent = kRootHash;
  for (size_t i = 0; i < blocks; ++i) {
    parent = ChainHash(parent, ns, prompt.subspan(i * g, g));
    hashes.push_back(parent);
  }
  return hashes;
}

uint32_t KvCore::Fp16SlotsInUse() const {
  const BlockPool& sink = pools_.pool(BlockClass::kSink);
  const uint64_t retained = backend_->RetainedBytes();
  const uint64_t retained_slots = (retained + layout_.fp16_block_bytes() - 1) / layout_.fp16_block_bytes();
  return sink.total() - sink.free_count() + tail_slots_reserved_ + static_cast<uint32_t>(retained_slots);
}

absl::StatusOr<OpenResult> KvCore::OpenSession(const OpenParams& p) {
  if (p.tenant.empty() || p.tenant.size() > 256) {
    return absl::InvalidArgumentError("tenant must be 1..256 bytes");
  }
  if (!(p.layout == config_.model)) {
    return absl::InvalidArgumentError(absl::StrCat("layout mismatch: the daemon serves ", DescribeModel(config_.model),
                                                   "; the session declared ", DescribeModel(p.layout)));
  }
  const uint32_t slots = p.observer ? 0 : p.max_sequences == 0 ? config_.default_tail_slots : p.max_sequences;
  if (slots > config_.max_tail_slots) {
    return absl::InvalidArgumentError(absl::StrCat("max_sequences ", slots, " exceeds the limit ", config_.max_tail_slots));
  }
  absl::MutexLock lock(&mu_);
  if (draining_) return absl::UnavailableError("draining: open a session elsewhere");
  // Tail slots come out of the fp16 share, which cached sink blocks may be holding.
  while (Fp16SlotsInUse() + slots > fp16_budget_) {
    if (!EvictOne(BlockClass::kSink, EvictReason::kAllocation, std::nullopt)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "no room for ", slots, " tail slots: ", fp16_budget_ - std::min(fp16_budget_, Fp16SlotsInUse()),
          " of ", fp16_budget_, " fp16 blocks are free"));
    }
  }
  std::unique_ptr<Region> tail;
  if (slots > 0) {
    auto region = backend_->Create(RegionKind::kTail, uint64_t{slots} * layout_.fp16_block_bytes(), p.client_pid);
    if (!region.ok()) return region.status();
    tail = std::move(*region);
  }
  Session s;
  s.id = next_session_++;
  s.tenant = InternTenant(p.tenant);
  s.client_name = p.client_name;
  s.admin = !config_.admin_token.empty() && p.admin_token == config_.admin_token;
  s.tail_region = std::move(tail);
  s.slots = slots;
  for (uint32_t i = slots; i > 0; --i) s.free_slots.push_back(i - 1);
  s.last_seen = clock_->Now();
  tail_slots_reserved_ += slots;
  OpenResult r;
  r.session = s.id;
  PoolView& v = r.pool;
  v.backend = backend_->name();
  v.tile_tokens = static_cast<uint32_t>(preset_.tile_tokens);
  v.record_bytes = layout_.record_bytes;
  v.quant_block_bytes = layout_.quant_block_bytes();
  v.fp16_block_bytes = layout_.fp16_block_bytes();
  v.quant_blocks = pools_.pool(BlockClass::kQuant).total();
  v.sink_blocks = pools_.pool(BlockClass::kSink).total();
  v.quant_segment = quant_region_->Describe();
  if (sink_region_) v.sink_segment = sink_region_->Describe();
  if (s.tail_region) v.tail_segment = s.tail_region->Describe();
  v.tail_slots = slots;
  v.epoch = epoch_;
  v.daemon_pid = static_cast<int>(getpid());
  sessions_.emplace(s.id, std::move(s));
  return r;
}

absl::Status KvCore::KeepAlive(SessionRef ref) {
  absl::MutexLock lock(&mu_);
  return FindSession(ref).status();
}

absl::Status KvCore::AttachStream(SessionRef ref) {
  absl::MutexLock lock(&mu_);
  auto s = FindSession(ref);
  if (!s.ok()) return s.status();
  ++(*s)->streams;
  (*s)->stream_seen = true;
  return absl::OkStatus();
}

void KvCore::DetachStream(SessionId id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  if (--it->second.streams == 0) it->second.disconnected_at = clock_->Now();
}

absl::StatusOr<uint32_t> KvCore::CloseSession(SessionRef ref) {
  absl::MutexLock lock(&mu_);
  auto s = FindSession(ref);
  if (!s.ok()) return s.status();
  const uint32_t n = static_cast<uint32_t>((*s)->sequences.size());
  EndSession(**s);
  return n;
}

int KvCore::ExpireSessions() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  std::vector<SessionId> expired;
  for (auto& [id, s] : sessions_) {
    if (s.closing) continue;
    const bool stream_gone = s.stream_seen && s.streams == 0 && now - s.disconnected_at >= config_.grace;
    const bool silent = now - s.last_seen >= config_.lease_ttl;
    if (stream_gone || silent) expired.push_back(id);
  }
  for (SessionId id : expired) {
    ++counters_.sessions_expired;
    EndSession(sessions_.at(id));
  }
  return static_cast<int>(expired.size());
}

void KvCore::EndSession(Session& s) {
  s.closing = true;
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
  auto it = sessions_.find(id);
  if (it == sessions_.end() || !it->second.closing || !it->second.sequences.empty()) return;
  tail_slots_reserved_ -= it->second.slots;
  sessions_.erase(it);  // destroys the tail region (unlinks the segment)
}

void KvCore::ReleaseSequence(Sequence& q) {
  // Children before parents, so parents are the more recently used and leave last.
  for (auto it = q.quant.rbegin(); it != q.quant.rend(); ++it) {
    pools_.pool(BlockClass::kQuant).Release(*it, ++tick_);
  }
  if (q.has_sink) pools_.pool(BlockClass::kSink).Release(q.sink, ++tick_);
  Session& s = sessions_.at(q.session);
  s.free_slots.push_back(q.tail_slot);
  s.sequences.erase(q.id);
  sequences_.erase(q.id);
}

absl::StatusOr<std::vector<BlockHash>> KvCore::PromptHashes(SessionRef ref, std::span<const uint32_t> prompt) {
  if (prompt.size() > config_.max_prompt_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("prompt of ", prompt.size(), " tokens exceeds the limit ", config_.max_prompt_tokens));
  }
  BlockHash ns;
  {
    absl::MutexLock lock(&mu_);
    auto s = FindSession(ref);
    if (!s.ok()) return s.status();
    ns = tenants_[(*s)->tenant].ns;
  }
  return PrefixHashes(ns, prompt);  // hashing runs outside the lock
}

absl::StatusOr<CreateResult> KvCore::CreateSequence(SessionRef ref, std::span<const uint32_t> prompt) {
  auto hashed = PromptHashes(ref, prompt);
  if (!hashed.ok()) return hashed.status();
  const std::vector<BlockHash>& hashes = *hashed;
  absl::MutexLock lock(&mu_);
  auto s = FindSession(ref);
  if (!s.ok()) return s.status();
  Session& session = **s;
  if (draining_) return absl::UnavailableError("draining: create the sequence elsewhere");
  if (session.free_slots.empty()) {
    return absl::ResourceExhaustedError(session.slots == 0
        ? std::string("an observer session has no tail slots: open one with max_sequences")
        : absl::StrCat("all ", session.slots, " tail slots of this session are in use; release a sequence"));
  }
  Sequence q;
  q.id = next_sequence_++;
  q.session = session.id;
  q.tail_slot = session.free_slots.back();
  session.free_slots.pop_back();
  for (size_t i = 0; i < hashes.size(); ++i) {
    const BlockClass cls = (i == 0 && config_.model.sink_tokens > 0) ? BlockClass::kSink : BlockClass::kQuant;
    BlockPool& pool = pools_.pool(cls);
    const std::optional<uint32_t> hit = pool.Find(hashes[i]);
    if (!hit.has_value()) break;
    pool.Acquire(*hit, ++tick_);
    if (cls == BlockClass::kSink) {
      q.has_sink = true;
      q.sink = *hit;
    } else {
      q.quant.push_back(*hit);
    }
    q.last_hash = hashes[i];
    q.tokens += static_cast<uint64_t>(preset_.tile_tokens);
  }
  counters_.prefix_queried_tokens += prompt.size();
  counters_.prefix_hit_tokens += q.tokens;
  CreateResult r;
  r.sequence = q.id;
  r.cached_tokens = q.tokens;
  r.table = TableOf(q);
  session.sequences.insert(q.id);
  sequences_.emplace(q.id, std::move(q));
  return r;
}

absl::StatusOr<uint64_t> KvCore::Lookup(SessionRef ref, std::span<const uint32_t> prompt) {
  auto hashed = PromptHashes(ref, prompt);
  if (!hashed.ok()) return hashed.status();
  const std::vector<BlockHash>& hashes = *hashed;
  absl::MutexLock lock(&mu_);
  uint64_t tokens = 0;
  for (size_t i = 0; i < hashes.size(); ++i) {
    const BlockClass cls = (i == 0 && config_.model.sink_tokens > 0) ? BlockClass::kSink : BlockClass::kQuant;
    if (!pools_.pool(cls).Find(hashes[i]).has_value()) break;
    tokens += static_cast<uint64_t>(preset_.tile_tokens);
  }
  return tokens;
}

absl::StatusOr<uint32_t> KvCore::Release(SessionRef ref, std::span<const SequenceId> seqs) {
  absl::MutexLock lock(&mu_);
  auto s = FindSession(ref);
  if (!s.ok()) return s.status();
  absl::flat_hash_set<SequenceId> seen;
  for (SequenceId id : seqs) {
    auto q = FindSequence(*s, id);
    if (!q.ok()) return q.status();
    if ((*q)->busy) return absl::FailedPreconditionError(absl::StrCat("sequence ", id, " has a call in flight"));
    if (!seen.insert(id).second) return absl::InvalidArgumentError(absl::StrCat("sequence ", id, " listed twice"));
  }
  for (SequenceId id : seqs) ReleaseSequence(sequences_.at(id));
  return static_cast<uint32_t>(seqs.size());
}

absl::StatusOr<BlockTableView> KvCore::Table(SessionRef ref, SequenceId seq) {
  absl::MutexLock lock(&mu_);
  auto s = FindSession(ref);
  if (!s.ok()) return s.status();
  auto q = FindSequence(*s, seq);
  if (!q.ok()) return q.status();
  return TableOf(**q);
}

void KvCore::BeginDrain() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
}

}  // namespace kvarn
