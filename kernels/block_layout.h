// Where the K/V of one (layer, kv-head) live inside the pool's blocks. Shared by the daemon,
// the client library and the CUDA kernels (host and device).
//
// A quantized block holds one G-token tile of every layer and kv-head: records of
// Preset::RecordBytes(head_dim) bytes back to back, layer-major. An fp16 block holds up to
// G tokens of every layer and kv-head in the storage frame, binary16, token-major: token t's
// row is fp16_token_elems() elements, and in it each (layer, head) in order has its key row
// [D] then its value row [D]. So one token's K/V for the whole model is one contiguous run
// (what a decode step writes, and what its commit checks), and the rows of one (layer, head)
// lie fp16_token_elems() elements apart. Block id -> byte offset is arithmetic, so a block
// table is just ids.
#ifndef KVARN_KERNELS_BLOCK_LAYOUT_H_
#define KVARN_KERNELS_BLOCK_LAYOUT_H_

#include <cstddef>
#include <cstdint>

#include "kernels/hd.h"

namespace kvarn {

struct BlockLayout {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int tile_tokens = 0;
  size_t record_bytes = 0;  // one (layer, head) tile in a quantized block

  KVARN_HD size_t slots() const {
    return static_cast<size_t>(num_layers) * static_cast<size_t>(num_kv_heads);
  }
  KVARN_HD size_t slot(int layer, int head) const {
    return static_cast<size_t>(layer) * static_cast<size_t>(num_kv_heads) + static_cast<size_t>(head);
  }
  KVARN_HD size_t quant_block_bytes() const { return slots() * record_bytes; }
  // Elements of one [G][D] K or V matrix.
  KVARN_HD size_t tile_elems() const {
    return static_cast<size_t>(tile_tokens) * static_cast<size_t>(head_dim);
  }
  // Elements of one (layer, head)'s key row and value row, side by side in a token's row.
  KVARN_HD size_t fp16_pair_elems() const { return 2 * static_cast<size_t>(head_dim); }
  // Elements of one token in an fp16 block: the distance between a (layer, head)'s rows.
  KVARN_HD size_t fp16_token_elems() const { return slots() * fp16_pair_elems(); }
  KVARN_HD size_t fp16_token_bytes() const { return fp16_token_elems() * sizeof(uint16_t); }
  KVARN_HD size_t fp16_block_bytes() const {
    return static_cast<size_t>(tile_tokens) * fp16_token_bytes();
  }

  // Byte offsets inside a block; Fp16KeysOffset and Fp16ValuesOffset are token 0's rows.
  KVARN_HD size_t RecordOffset(int layer, int head) const { return slot(layer, head) * record_bytes; }
  KVARN_HD size_t Fp16KeysOffset(int layer, int head) const {
    return slot(layer, head) * fp16_pair_elems() * sizeof(uint16_t);
  }
  KVARN_HD size_t Fp16ValuesOffset(int layer, int head) const {
    return Fp16KeysOffset(layer, head) + static_cast<size_t>(head_dim) * sizeof(uint16_t);
  }
};

}  // namespace kvarn

#endif  // KVARN_KERNELS_BLOCK_LAYOUT_H_
