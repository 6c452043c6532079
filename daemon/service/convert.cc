#include "daemon/service/convert.h"

#include <algorithm>
#include <string>

#include "daemon/core/block_record.h"

namespace kvarn {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(static_cast<int>(s.code())), std::string(s.message()));
}

ModelConfig FromProto(const v1::ModelLayout& m) {
  ModelConfig c;
  c.model_id = m.model_id();
  c.num_layers = m.num_layers();
  c.num_kv_heads = m.num_kv_heads();
  c.head_dim = m.head_dim();
  c.preset = m.preset();
  c.sink_tokens = m.sink_tokens();
  return c;
}

void ToProto(const ModelConfig& m, v1::ModelLayout* out) {
  out->set_model_id(m.model_id);
  out->set_num_layers(m.num_layers);
  out->set_num_kv_heads(m.num_kv_heads);
  out->set_head_dim(m.head_dim);
  out->set_preset(m.preset);
  out->set_sink_tokens(m.sink_tokens);
}

SessionRef FromProto(const v1::SessionRef& r) {
  SessionRef ref{r.session_id(), r.epoch(), {}};
  // A secret of the wrong length stays all zeros, which no session has: NOT_FOUND.
  if (r.secret().size() == ref.secret.size()) std::copy(r.secret().begin(), r.secret().end(), ref.secret.begin());
  return ref;
}

void ToProto(const BlockTableView& t, v1::BlockTable* out) {
  out->set_tokens(t.tokens);
  out->set_has_sink(t.has_sink);
  out->set_sink_block(t.sink_block);
  out->mutable_quant_blocks()->Assign(t.quant_blocks.begin(), t.quant_blocks.end());
  out->set_tail_slot(t.tail_slot);
  out->set_tail_tokens(t.tail_tokens);
  out->set_blocks_omitted(t.blocks_omitted);
}

namespace {
void SetSegment(uint64_t bytes, uint32_t blocks, v1::Segment* out) {
  out->set_bytes(bytes);
  out->set_block_offset(0);
  out->set_first_block(0);
  out->set_blocks(blocks);
}
}  // namespace

void ToProto(const PoolView& p, const ModelConfig& model, v1::PoolDescription* out) {
  out->set_backend(p.backend == "cuda" ? v1::PoolDescription::BACKEND_CUDA : v1::PoolDescription::BACKEND_HOST);
  ToProto(model, out->mutable_layout());
  out->set_tile_tokens(p.tile_tokens);
  out->set_record_bytes(p.record_bytes);
  out->set_quant_block_bytes(p.quant_block_bytes);
  out->set_fp16_block_bytes(p.fp16_block_bytes);
  SetSegment(p.quant_bytes, p.quant_blocks, out->add_quant_segments());
  if (p.sink_blocks > 0) SetSegment(p.sink_bytes, p.sink_blocks, out->add_sink_segments());
  SetSegment(p.tail_bytes, p.tail_slots, out->mutable_tail_segment());
  out->set_tail_slots(p.tail_slots);
  out->set_epoch(p.epoch);
  out->set_daemon_pid(p.daemon_pid);
  out->set_fp16_layout(v1::FP16_LAYOUT_TOKEN_MAJOR);
}

void ToProto(const CoreStats& s, const std::string& preset, v1::StatsResponse* out) {
  out->set_capacity_bytes(s.capacity_bytes);
  out->set_quant_capacity_bytes(s.quant_capacity_bytes);
  out->set_fp16_capacity_bytes(s.fp16_capacity_bytes);
  out->set_free_bytes(s.capacity_bytes - std::min(s.capacity_bytes, s.UsedBytes()));
  out->set_active_bytes(s.ActiveBytes());
  out->set_cached_bytes(s.CachedBytes());
  out->set_fp16_bytes(uint64_t{s.sink_total - s.sink_free} * s.fp16_block_bytes + s.TailBytes());
  out->set_quant_blocks_total(s.quant_total);
  out->set_quant_blocks_free(s.quant_free);
  out->set_quant_blocks_active(s.quant_active);
  out->set_quant_blocks_cached(s.quant_cached);
  out->set_sink_blocks_total(s.sink_total);
  out->set_sink_blocks_free(s.sink_free);
  out->set_sink_blocks_active(s.sink_active);
  out->set_sink_blocks_cached(s.sink_cached);
  out->set_sessions(s.sessions);
  out->set_sequences(s.sequences);
  out->set_prefix_queried_tokens(s.prefix_queried_tokens);
  out->set_prefix_hit_tokens(s.prefix_hit_tokens);
  out->set_seals(s.seals + s.sink_seals);
  uint64_t evictions = 0;
  for (uint64_t e : s.evictions) evictions += e;
  out->set_evictions(evictions);
  out->set_epoch(s.epoch);
  out->set_preset(preset);
  for (const CoreStats::PoolState& r : s.Partition()) {
    auto* e = out->add_pool();
    e->set_pool_class(r.cls);
    e->set_state(r.state);
    e->set_blocks(r.blocks);
    e->set_bytes(r.bytes);
    e->set_tokens(r.blocks * s.tile_tokens);
  }
  out->set_pool_bytes(s.PoolBytes());
  out->set_tile_tokens(s.tile_tokens);
  out->set_draining(s.draining);
  for (size_t i = 0; i < kWhatIfScales.size(); ++i) {
    auto* w = out->add_whatif();
    w->set_capacity_scale(kWhatIfScales[i]);
    w->set_hit_tokens(s.whatif_hit_tokens[i]);
  }
  for (const TierReport& t : s.tiers) {
    auto* o = out->add_tiers();
    o->set_name(t.name);
    o->set_write(t.write);
    o->set_blocks(t.blocks);
    o->set_bytes(t.bytes);
    o->set_capacity_bytes(t.capacity_bytes);
    o->set_hits(t.hits);
    o->set_misses(t.misses);
    o->set_read_bytes(t.read_bytes);
    o->set_queued_blocks(t.queued_blocks);
    o->set_queued_bytes(t.queued_bytes);
    o->set_written_blocks(t.written_blocks);
    o->set_written_bytes(t.written_bytes);
    o->set_dropped_writes(t.dropped_writes);
    o->set_evicted_blocks(t.evicted_blocks);
    o->set_errors(t.errors);
    for (int f = 0; f < kRecordFaults; ++f) (*o->mutable_rejected())[RecordFaultName(static_cast<RecordFault>(f))] = t.rejected[f];
    o->set_onboarded_blocks(t.onboarded_blocks);
    o->set_hit_tokens(t.hit_tokens);
    o->set_onboard_failures(t.onboard_failures);
    o->set_spilled_blocks(t.spilled_blocks);
    o->set_spill_dropped(t.spill_dropped);
  }
  for (const SessionStats& i : s.session_info) {
    auto* o = out->add_session_info();
    o->set_session_id(i.id);
    o->set_tenant(i.tenant);
    o->set_client_name(i.client_name);
    o->set_sequences(i.sequences);
    o->set_tail_slots(i.tail_slots);
    o->set_connected(i.connected);
  }
  for (const TenantReport& t : s.tenants) {
    auto* o = out->add_tenants();
    o->set_tenant(t.name);
    o->set_sessions(t.usage.sessions);
    o->set_max_sessions(t.quota.max_sessions);
    o->set_tail_slots(t.usage.tail_slots);
    o->set_max_tail_slots(t.quota.max_tail_slots);
    o->set_cache_bytes(t.usage.cache_bytes);
    o->set_max_cache_bytes(t.quota.max_cache_bytes);
    o->set_watchers(t.usage.watchers);
    o->set_max_watchers(t.quota.max_watchers);
  }
}

void ToProto(const BlockEvent& e, const std::string& tenant, std::string_view tier, v1::BlockEvent* out) {
  out->set_kind(e.kind == BlockEvent::Kind::kStored ? v1::BlockEvent::KIND_STORED : v1::BlockEvent::KIND_REMOVED);
  out->set_hash(std::string(e.hash.begin(), e.hash.end()));
  if (e.kind == BlockEvent::Kind::kStored) out->set_parent_hash(std::string(e.parent_hash.begin(), e.parent_hash.end()));
  out->set_block(e.block);
  out->set_fp16(e.fp16);
  out->set_tenant(tenant);
  out->set_sequence_number(e.seq);
  out->set_tier(std::string(tier));
}

}  // namespace kvarn
