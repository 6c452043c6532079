// A block of the pool: its class and its id within that class.
#ifndef KVARN_DAEMON_CORE_BLOCK_REF_H_
#define KVARN_DAEMON_CORE_BLOCK_REF_H_

#include <cstdint>

namespace kvarn {

enum class BlockClass : uint8_t { kQuant = 0, kSink = 1 };

struct BlockRef {
  BlockClass cls = BlockClass::kQuant;
  uint32_t id = 0;
  friend bool operator==(const BlockRef&, const BlockRef&) = default;
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_CORE_BLOCK_REF_H_
