// Append, fork and read: the calls whose data-plane work runs outside the core's lock.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "daemon/core/check.h"
#include "daemon/core/kv_core.h"
#include "daemon/core/quant_error.h"

namespace kvarn {

// What phase A of an append decided, for phases B (unlocked work) and C (publish).
struct KvCore::AppendPlan {
  SessionId session = 0;
  SequenceId seq = 0;
  uint8_t* slot = nullptr;
  int first = 0;  // first token position written by this append
  int n = 0;
  bool seal = false;
  BlockClass cls = BlockClass::kQuant;
  BlockHash hash{};
  std::optional<BlockRef> parent;
  bool own_block = false;  // a kSealing block to fill; else `block` is an existing indexed one
  BlockRef block;
  // The appended ids: the caller's, valid for the whole call (no copy per item).
  std::span<const uint32_t> ids;
  // For the tiers' record of a sealed block: its chain position, parent and tenant; and the
  // tiers that took it at the seal (bits).
  uint32_t tile_index = 0;
  BlockHash parent_hash{};
  BlockHash ns{};
  uint32_t tenant = 0;
  uint8_t stored_in = 0;
};

absl::StatusOr<AppendResult> KvCore::Append(const SessionRef& ref, SequenceId seq, std::span<const uint32_t> token_ids) {
  return AppendImpl(ref, seq, token_ids, nullptr, nullptr, DType::kF16);
}

absl::StatusOr<AppendResult> KvCore::AppendInline(const SessionRef& ref, SequenceId seq,
                                                  std::span<const uint32_t> token_ids, const void* keys,
                                                  const void* values, DType dtype) {
  if (keys == nullptr || values == nullptr) return absl::InvalidArgumentError("inline append without K/V");
  return AppendImpl(ref, seq, token_ids, keys, values, dtype);
}

absl::Status KvCore::PlanAppend(SessionState& s, SequenceId seq, std::span<const uint32_t> ids,
                                absl::Time now, AppendPlan* plan) {
  auto q = FindSequence(&s, seq);
  if (!q.ok()) return q.status();
  Sequence& sq = **q;
  if (sq.busy) return absl::FailedPreconditionError(absl::StrCat("sequence ", seq, " has another call in flight"));
  const int g = preset_.tile_tokens;
  const int room = g - static_cast<int>(sq.tail_tokens);
  if (ids.empty()) return absl::InvalidArgumentError("append of 0 tokens");
  if (static_cast<int64_t>(ids.size()) > room) {
    return absl::InvalidArgumentError(absl::StrCat("append of ", ids.size(), " tokens goes past the tail: ", room, " of ", g,
                                                   " tail positions are free"));
  }
  if (absl::Status pinned = PinTail(s); !pinned.ok()) return pinned;
  plan->session = s.id;
  plan->seq = seq;
  plan->slot = SlotPtr(s, sq.tail_slot);
  plan->first = static_cast<int>(sq.tail_tokens);
  plan->n = static_cast<int>(ids.size());
  plan->seal = plan->n == room;
  if (plan->seal) {
    plan->cls = ClassAt(sq.sealed_tiles());
    std::vector<uint32_t> tile = sq.tail_ids;
    tile.insert(tile.end(), ids.begin(), ids.end());
    plan->ns = tenants_.get(s.tenant).ns;
    plan->hash = ChainHash(sq.last_hash, plan->ns, tile);
    plan->parent = sq.last_block();
    plan->tile_index = static_cast<uint32_t>(sq.sealed_tiles());
    plan->parent_hash = sq.last_hash;
    plan->tenant = s.tenant;
    if (const std::optional<BlockRef> hit = pools_.Find(plan->hash); hit.has_value() && hit->cls == plan->cls) {
      // The same tile is cached already: adopt it (held now, so it cannot be evicted).
      pools_.Acquire(*hit, ++tick_);
      plan->block = *hit;
    } else {
      auto id = AllocateBlock(plan->cls, s.tenant);
      if (!id.ok()) return id.status();
      plan->own_block = true;
      plan->block = BlockRef{plan->cls, *id};
    }
    sq.pending = plan->block;
  }
  plan->ids = ids;
  sq.busy = true;
  sessions_.Renew(s, now);
  return absl::OkStatus();
}

absl::StatusOr<AppendResult> KvCore::AppendImpl(const SessionRef& ref, SequenceId seq, std::span<const uint32_t> token_ids,
                                                const void* keys, const void* values, DType dtype) {
  AppendPlan plan;
  {
    Locked lock(this);
    auto s = sessions_.Find(ref);
    if (!s.ok()) return s.status();
    if (absl::Status st = PlanAppend(**s, seq, token_ids, clock_->Now(), &plan); !st.ok())
      return st;
  }
  absl::Status work = AppendWork(plan, keys, values, dtype);
  Locked lock(this);
  return FinishAppend(plan, work);
}

absl::StatusOr<std::vector<absl::StatusOr<AppendResult>>> KvCore::AppendBatch(
    const SessionRef& ref, std::span<const std::pair<SequenceId, std::span<const uint32_t>>> items) {
  // Same three phases as Append, each taken once for the whole batch (and one clock reading
  // for all its items). Every entry of `out` is set below.
  std::vector<absl::StatusOr<AppendResult>> out(items.size());
  std::vector<AppendPlan> plans(items.size());
  std::vector<bool> planned(items.size(), false);
  {
    Locked lock(this);
    auto s = sessions_.Find(ref);
    if (!s.ok()) return s.status();
    const absl::Time now = clock_->Now();
    for (size_t i = 0; i < items.size(); ++i) {
      absl::Status st = PlanAppend(**s, items[i].first, items[i].second, now, &plans[i]);
      if (!st.ok()) {
        out[i] = st;
      } else {
        planned[i] = true;
      }
    }
  }
  // The last item first: its staged rows are the ones the client wrote last, the likeliest
  // still in this core's caches when kvarnd runs on the client's CPU (a commit ring's drain
  // does). Scanning in the order they were written would evict each next run just before
  // it is read, once the step's rows (1 MiB for 64 sequences of 8 layers x 4 kv-heads x 128)
  // outgrow the L2: docs/commit_ring.md, "The scan's order".
  std::vector<absl::Status> work(items.size());
  for (size_t i = items.size(); i-- > 0;) {
    if (planned[i]) work[i] = AppendWork(plans[i], nullptr, nullptr, DType::kF16);
  }
  Locked lock(this);
  for (size_t i = 0; i < items.size(); ++i) {
    if (planned[i]) out[i] = FinishAppend(plans[i], work[i]);
  }
  return out;
}

absl::Status KvCore::AppendWork(AppendPlan& plan, const void* keys, const void* values, DType dtype) {
  // The sequence is busy, so its slot and the kSealing block are ours alone.
  absl::Status work;
  // This call encodes a tile; only then is a latency reported (no clock reading per token of a
  // decode step).
  const bool seals = plan.seal && plan.own_block;
  const absl::Time start = seals && observer_ != nullptr ? clock_->Now() : absl::Time();
  if (keys != nullptr) work = sealer_->WriteTokens(plan.slot, plan.first, plan.n, keys, values, dtype);
  // Inline K/V were checked as they were written; staged ones are checked at commit unless
  // configured not to. Either way a seal validates the whole tile again (the encoder refuses
  // NaN/Inf, the sink copy is scanned), which also catches a client rewriting committed tokens.
  if (work.ok() && keys == nullptr && config_.check_commits) work = sealer_->CheckTokens(plan.slot, plan.first, plan.n);
  bool sample = false;
  if (work.ok() && seals) {
    uint8_t* dst = BlockPtr(plan.block);
    work = plan.cls == BlockClass::kSink ? sealer_->SealSink(plan.slot, dst) : sealer_->SealQuantized(plan.slot, dst);
    if (observer_ != nullptr && work.ok()) observer_->OnSeal(plan.cls == BlockClass::kSink, clock_->Now() - start);
    sample = work.ok() && plan.cls == BlockClass::kQuant && observer_ != nullptr && plan.block.id % 16 == 0;
    if (work.ok() && !tiers_.empty()) {
      plan.stored_in =
          PutOnSeal(plan.block, RecordMeta{plan.hash, plan.parent_hash, plan.cls, plan.tile_index, plan.ns}, plan.tenant);
    }
  }
  // Every 16th quantized block (by id) has one (layer, kv-head) tile sampled, after the seal's
  // latency was taken: the stored record's error and the baselines' on the same tile.
  if (sample) SampleQuantError(plan, static_cast<int>(plan.block.id / 16 % layout_.num_layers),
                               static_cast<int>(plan.block.id / 16 % layout_.num_kv_heads));
  return work;
}

void KvCore::SampleQuantError(const AppendPlan& plan, int layer, int head) {
  const double stored = sealer_->SampleError(plan.slot, BlockPtr(plan.block), layer, head);
  if (stored < 0.0) return;
  std::vector<float> k(layout_.tile_elems()), v(layout_.tile_elems());
  if (!sealer_->DecodeTile(plan.slot, /*fp16=*/true, layer, head, k.data(), v.data()).ok()) return;
  observer_->OnQuantError("kvarn", stored);
  for (const BaselineError& b : QuantBaselines(preset_, layout_.head_dim, k.data(), v.data())) {
    if (b.relative_l2 >= 0.0) observer_->OnQuantError(b.method, b.relative_l2);
  }
}

absl::StatusOr<AppendResult> KvCore::FinishAppend(const AppendPlan& plan, absl::Status work) {
  Sequence& q = sequences_.at(plan.seq);
  q.pending.reset();
  if (!work.ok()) {
    if (plan.seal) {
      if (plan.own_block) {
        pools_.Abort(plan.block);
      } else {
        pools_.Release(plan.block, ++tick_);
      }
    }
  } else if (plan.seal) {
    BlockRef block = plan.block;
    if (plan.own_block) {
      if (const std::optional<BlockRef> dup = pools_.Find(plan.hash); dup.has_value() && dup->cls == block.cls) {
        // Another sequence sealed the same tile meanwhile: share that one.
        pools_.Abort(block);
        pools_.Acquire(*dup, ++tick_);
        block = *dup;
        ++counters_.dedup_seals;
      } else {
        KVARN_CHECK(!dup.has_value(), "a tile's hash names one chain position, hence one block class");
        pools_.Publish(block, plan.hash, plan.parent);
        if (plan.stored_in != 0) pools_.MarkInTiers(block, plan.stored_in);
        BlockEvent e;
        e.kind = BlockEvent::Kind::kStored;
        e.hash = plan.hash;
        e.parent_hash = q.last_hash;
        e.block = block.id;
        e.fp16 = block.cls == BlockClass::kSink;
        e.tenant = pools_.info(block).tenant;
        events_.Append(e);
        ++(block.cls == BlockClass::kSink ? counters_.sink_seals : counters_.seals);
      }
    } else {
      ++counters_.dedup_seals;
    }
    if (block.cls == BlockClass::kSink) {
      q.has_sink = true;
      q.sink = block.id;
    } else {
      q.quant.push_back(block.id);
    }
    q.last_hash = plan.hash;
    whatif_.Sealed(plan.hash, block.cls);
    q.tail_tokens = 0;
    q.tail_ids.clear();
    q.tokens += static_cast<uint64_t>(plan.n);
    ApplyWatermark(block.cls);
  } else {
    q.tail_tokens += static_cast<uint32_t>(plan.n);
    q.tail_ids.insert(q.tail_ids.end(), plan.ids.begin(), plan.ids.end());
    q.tokens += static_cast<uint64_t>(plan.n);
  }
  if (EndCall(q)) return absl::NotFoundError("the session ended while the append ran; its sequences are released");
  if (!work.ok()) return work;
  AppendResult r;
  r.table = TableOf(q, /*with_blocks=*/plan.seal);
  r.sealed = plan.seal;
  return r;
}

absl::StatusOr<CreateResult> KvCore::Fork(const SessionRef& ref, SequenceId seq) {
  uint8_t* src = nullptr;
  uint8_t* dst = nullptr;
  int tokens = 0;
  SequenceId child_id = 0;
  {
    Locked lock(this);
    auto s = sessions_.Find(ref);
    if (!s.ok()) return s.status();
    auto q = FindSequence(*s, seq);
    if (!q.ok()) return q.status();
    SessionState& session = **s;
    Sequence& parent = **q;
    if (parent.busy) return absl::FailedPreconditionError(absl::StrCat("sequence ", seq, " has another call in flight"));
    if (session.free_slots.empty()) {
      return absl::ResourceExhaustedError(absl::StrCat("all ", session.slots, " tail slots of this session are in use; release a sequence"));
    }
    if (absl::Status pinned = PinTail(session); !pinned.ok()) return pinned;
    sessions_.Renew(session, clock_->Now());
    Sequence child = parent;
    child.id = next_sequence_++;
    child.tail_slot = session.free_slots.back();
    session.free_slots.pop_back();
    if (child.has_sink) pools_.Acquire({BlockClass::kSink, child.sink}, ++tick_);
    for (uint32_t b : child.quant) pools_.Acquire({BlockClass::kQuant, b}, ++tick_);
    src = SlotPtr(session, parent.tail_slot);
    dst = SlotPtr(session, child.tail_slot);
    tokens = static_cast<int>(parent.tail_tokens);
    parent.busy = child.busy = true;
    child_id = child.id;
    session.sequences.insert(child.id);
    sequences_.emplace(child.id, std::move(child));
  }
  const absl::Status copied = sealer_->CopyTail(src, dst, tokens);
  Locked lock(this);
  Sequence& child = sequences_.at(child_id);
  CreateResult r;
  r.sequence = child_id;
  r.cached_tokens = child.tokens;
  r.table = TableOf(child);
  // The child dies with a failed copy; both die if the session ended meanwhile.
  if (!copied.ok()) child.doomed = true;
  EndCall(child);
  const bool parent_gone = EndCall(sequences_.at(seq));
  if (parent_gone) return absl::NotFoundError("the session ended while the fork ran");
  if (!copied.ok()) return copied;
  return r;
}

absl::Status KvCore::Read(const SessionRef& ref, SequenceId seq, uint32_t layer, uint64_t start, uint32_t count,
                          float* keys, float* values) {
  if (layer >= config_.model.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " out of range (", config_.model.num_layers, " layers)"));
  }
  if (count == 0 || count > config_.max_read_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("count must be in 1..", config_.max_read_tokens));
  }
  const uint64_t g = static_cast<uint64_t>(preset_.tile_tokens);
  struct Source {
    const uint8_t* block;
    bool fp16;
  };
  std::vector<Source> tiles;
  {
    Locked lock(this);
    auto s = sessions_.Find(ref);
    if (!s.ok()) return s.status();
    auto found = FindSequence(*s, seq);
    if (!found.ok()) return found.status();
    Sequence& q = **found;
    if (start > q.tokens || count > q.tokens - start) {
      return absl::InvalidArgumentError(absl::StrCat("tokens [", start, ", ", start + count, ") beyond the sequence's ", q.tokens));
    }
    if (q.busy) return absl::FailedPreconditionError(absl::StrCat("sequence ", seq, " has a call in flight"));
    const uint64_t sealed = q.sealed_tiles();
    if (sealed * g < start + count) {  // it reads the tail
      if (absl::Status pinned = PinTail(**s); !pinned.ok()) return pinned;
    }
    for (uint64_t tile = start / g; tile * g < start + count; ++tile) {
      if (tile < sealed && q.has_sink && tile == 0) {
        tiles.push_back({BlockPtr({BlockClass::kSink, q.sink}), true});
      } else if (tile < sealed) {
        tiles.push_back({BlockPtr({BlockClass::kQuant, q.quant[tile - (q.has_sink ? 1 : 0)]}), false});
      } else {
        tiles.push_back({SlotPtr(**s, q.tail_slot), true});
      }
    }
    q.busy = true;  // its blocks and slot stay put while we decode
  }
  const size_t d = layout_.head_dim, heads = layout_.num_kv_heads;
  std::vector<float> tk(layout_.tile_elems()), tv(layout_.tile_elems());
  absl::Status decoded;
  for (size_t i = 0; i < tiles.size() && decoded.ok(); ++i) {
    const uint64_t tile = start / g + i;
    const uint64_t lo = std::max(start, tile * g), hi = std::min(start + count, (tile + 1) * g);
    for (size_t h = 0; h < heads && decoded.ok(); ++h) {
      decoded = sealer_->DecodeTile(tiles[i].block, tiles[i].fp16, static_cast<int>(layer), static_cast<int>(h), tk.data(), tv.data());
      if (!decoded.ok()) break;
      for (uint64_t t = lo; t < hi; ++t) {
        const size_t out = ((t - start) * heads + h) * d, in = (t - tile * g) * d;
        std::copy_n(tk.data() + in, d, keys + out);
        std::copy_n(tv.data() + in, d, values + out);
      }
    }
  }
  Locked lock(this);
  if (EndCall(sequences_.at(seq))) return absl::NotFoundError("the session ended while the read ran");
  return decoded;
}

}  // namespace kvarn
