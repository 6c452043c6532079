#include "daemon/core/sealer.h"

#include "absl/strings/str_cat.h"

namespace kvarn {

absl::Status NonFiniteTokenError(const BlockLayout& layout, int first, uint64_t index) {
  const uint64_t d = static_cast<uint64_t>(layout.head_dim), per_token = layout.fp16_token_elems();
  const uint64_t row = (index % per_token) / d, slot = row / 2;  // row: slot * 2 + keys/values
  return absl::InvalidArgumentError(absl::StrCat(
      row % 2 == 0 ? "keys" : "values", " of token ", first + static_cast<int>(index / per_token),
      " (layer ", slot / layout.num_kv_heads, ", kv-head ", slot % layout.num_kv_heads,
      ", channel ", index % d, ") hold NaN or Inf"));
}

}  // namespace kvarn
