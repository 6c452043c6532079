// The name a message gives an fp16 layout value it received: the enum's name, or the raw
// number when the peer sent one this build does not know (a newer or a scribbling peer).
#ifndef KVARN_PROTO_FP16_LAYOUT_NAME_H_
#define KVARN_PROTO_FP16_LAYOUT_NAME_H_

#include <string>

#include "absl/strings/str_cat.h"
#include "kvarn/v1/kvarn.pb.h"

namespace kvarn {

inline std::string Fp16LayoutName(int layout) {
  return v1::Fp16Layout_IsValid(layout) ? v1::Fp16Layout_Name(static_cast<v1::Fp16Layout>(layout))
                                        : absl::StrCat("fp16 layout ", layout);
}

}  // namespace kvarn

#endif  // KVARN_PROTO_FP16_LAYOUT_NAME_H_
