// The one bridge from the codec's status type (kernels/status.h, which carries no Abseil) to
// absl::Status. The codec's codes are a subset of absl::StatusCode with the same numbers.
#ifndef KVARN_COMMON_CODEC_STATUS_H_
#define KVARN_COMMON_CODEC_STATUS_H_

#include "absl/status/status.h"
#include "kernels/status.h"

namespace kvarn {

inline absl::Status FromCodec(const CodecStatus& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(static_cast<int>(s.code())), s.message());
}

}  // namespace kvarn

#endif  // KVARN_COMMON_CODEC_STATUS_H_
