// A sequence: the blocks one session's stream of tokens occupies (sink, quantized body, fp16
// tail), as KvCore keeps it. Not thread-safe: KvCore serializes access.
#ifndef KVARN_DAEMON_CORE_SEQUENCE_H_
#define KVARN_DAEMON_CORE_SEQUENCE_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "daemon/core/block_ref.h"
#include "daemon/core/core_types.h"
#include "common/prefix_hash.h"

namespace kvarn {

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
  // A call runs on it outside the core's lock (append, fork, read): its blocks, slot and any
  // pending block are that call's alone, and other calls on it are refused.
  bool busy = false;
  bool doomed = false;              // its session ended while busy: released when the call ends
  std::optional<BlockRef> pending;  // block held by the in-flight append

  uint64_t sealed_tiles() const { return (has_sink ? 1 : 0) + quant.size(); }
  std::optional<BlockRef> last_block() const {
    if (!quant.empty()) return BlockRef{BlockClass::kQuant, quant.back()};
    if (has_sink) return BlockRef{BlockClass::kSink, sink};
    return std::nullopt;
  }
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_CORE_SEQUENCE_H_
