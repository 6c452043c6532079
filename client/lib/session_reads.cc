// kvarn::Session's reads of the pool in place (client/lib/client.h): the block pointers,
// Attend, DequantizeBlock, and Read (in place over shared memory, else by RPC).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "client/lib/client.h"
#include "client/lib/cuda_pool.h"
#include "common/codec_status.h"

namespace kvarn {

uint8_t* Session::QuantBase() const { return device_ != nullptr ? device_->quant() : quant_.data(); }
uint8_t* Session::SinkBase() const { return device_ != nullptr ? device_->sink() : sink_.data(); }
uint8_t* Session::TailBase() const { return device_ != nullptr ? device_->tail() : tail_.data(); }

const uint8_t* Session::QuantBlock(uint32_t block) const {
  return QuantBase() + static_cast<size_t>(block) * layout_.quant_block_bytes();
}

const uint8_t* Session::SinkBlock(uint32_t block) const {
  return SinkBase() + static_cast<size_t>(block) * layout_.fp16_block_bytes();
}

absl::StatusOr<SequenceTable> Session::CheckedTable(uint64_t seq, int layer, int num_q_heads) const {
  const int heads = layout_.num_kv_heads;
  if (layer < 0 || layer >= layout_.num_layers) return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " out of range"));
  if (num_q_heads < heads || num_q_heads % heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(num_q_heads, " query heads is not a multiple of ", heads, " kv-heads"));
  }
  auto table = Table(seq);
  if (!table.ok()) return table.status();
  for (uint32_t b : table->quant_blocks) {
    if (b >= pool_.quant_segments(0).blocks()) return absl::InternalError("block table names a block outside the pool");
  }
  if (device_ != nullptr &&
      ((table->has_sink && (pool_.sink_segments_size() != 1 || table->sink_block >= pool_.sink_segments(0).blocks())) ||
       table->tail_slot >= pool_.tail_slots())) {
    return absl::InternalError("block table names a block outside the pool");
  }
  return table;
}

absl::Status Session::AttendDevice(uint64_t seq, int layer, const float* queries, int num_q_heads, float* out,
                                   CUstream_st* stream) const {
  if (device_ == nullptr) return absl::FailedPreconditionError("AttendDevice needs a pool in GPU memory");
  auto table = CheckedTable(seq, layer, num_q_heads);
  if (!table.ok()) return table.status();
  return device_->Attend(*table, layer, queries, num_q_heads, out, /*lse=*/nullptr,
                         /*device_io=*/true, stream);
}

absl::Status Session::Attend(uint64_t seq, int layer, const float* queries, int num_q_heads, float* out,
                             float* lse) const {
  if (absl::Status m = CheckMapped(); !m.ok()) return m;
  const int heads = layout_.num_kv_heads;
  auto table = CheckedTable(seq, layer, num_q_heads);
  if (!table.ok()) return table.status();
  if (device_ != nullptr) {
    return device_->Attend(*table, layer, queries, num_q_heads, out, lse, /*device_io=*/false,
                           nullptr);
  }
  const int group = num_q_heads / heads;
  const size_t d = static_cast<size_t>(layout_.head_dim);
  const size_t blocks = table->quant_blocks.size();
  // Every kv-head's view first, each naming the next (SequenceView::next), so that the codec
  // fetches a head's first records and fp16 rows while it finishes the one before.
  std::vector<const uint8_t*> tiles(static_cast<size_t>(heads) * blocks);
  std::vector<SequenceView> views(static_cast<size_t>(heads));
  const uint8_t* tail = TailBase() + static_cast<size_t>(table->tail_slot) * layout_.fp16_block_bytes();
  for (int h = 0; h < heads; ++h) {
    const std::span<const uint8_t*> head_tiles(tiles.data() + static_cast<size_t>(h) * blocks,
                                               blocks);
    for (size_t i = 0; i < blocks; ++i)
      head_tiles[i] = QuantBlock(table->quant_blocks[i]) + layout_.RecordOffset(layer, h);
    SequenceView& view = views[static_cast<size_t>(h)];
    view.tiles = head_tiles;
    if (table->has_sink) {
      const uint8_t* sink = SinkBlock(table->sink_block);
      view.sink = {reinterpret_cast<const uint16_t*>(sink + layout_.Fp16KeysOffset(layer, h)),
                   reinterpret_cast<const uint16_t*>(sink + layout_.Fp16ValuesOffset(layer, h)),
                   layout_.tile_tokens, layout_.fp16_token_elems()};
    }
    view.tail = {reinterpret_cast<const uint16_t*>(tail + layout_.Fp16KeysOffset(layer, h)),
                 reinterpret_cast<const uint16_t*>(tail + layout_.Fp16ValuesOffset(layer, h)),
                 static_cast<int>(table->tail_tokens), layout_.fp16_token_elems()};
    if (h > 0) views[static_cast<size_t>(h) - 1].next = &view;
  }
  for (int h = 0; h < heads; ++h) {
    const CodecStatus s = Codec::Default().AttendDecode(
        preset_, layout_.head_dim, queries + h * group * d, group, views[static_cast<size_t>(h)],
        out + h * group * d, 0.0f, lse == nullptr ? nullptr : lse + h * group);
    if (!s.ok()) return FromCodec(s);
  }
  return absl::OkStatus();
}

absl::Status Session::DequantizeBlock(uint32_t block, int layer, int head, float* keys, float* values) const {
  if (absl::Status m = CheckMapped(); !m.ok()) return m;
  if (block >= pool_.quant_segments(0).blocks() || layer < 0 || layer >= layout_.num_layers || head < 0 ||
      head >= layout_.num_kv_heads) {
    return absl::InvalidArgumentError("block, layer or head out of range");
  }
  if (device_ != nullptr) return device_->Dequantize(block, layer, head, keys, values);
  const CodecStatus s = Codec::Default().DecodeTile(preset_, layout_.head_dim,
                                                    {QuantBlock(block) + layout_.RecordOffset(layer, head), layout_.record_bytes},
                                                    {keys, values, DType::kF32, Frame::kOriginal});
  if (!s.ok()) return FromCodec(s);
  return absl::OkStatus();
}

absl::Status Session::Read(uint64_t seq, uint32_t layer, uint64_t start, uint32_t count, std::vector<float>* keys,
                           std::vector<float>* values) {
  // One reply carries at most read_tokens_per_call tokens: longer reads take several calls.
  const uint32_t per_call = read_tokens_per_call_ > 0 ? read_tokens_per_call_ : count;
  keys->clear();
  values->clear();
  uint32_t done = 0;
  do {
    const uint32_t n = std::min(per_call, count - done);
    v1::ReadRequest req;
    *req.mutable_session() = Ref();
    req.set_sequence_id(seq);
    req.set_layer(layer);
    req.set_start(start + done);
    req.set_count(n);
    v1::ReadResponse resp;
    grpc::ClientContext ctx;
    if (absl::Status s = Check(client_->stub().Read(Prepare(&ctx), req, &resp)); !s.ok()) {
      keys->clear();
      values->clear();
      return s;
    }
    keys->insert(keys->end(), resp.keys().begin(), resp.keys().end());
    values->insert(values->end(), resp.values().begin(), resp.values().end());
    done += n;
  } while (done < count);
  return absl::OkStatus();
}

}  // namespace kvarn
