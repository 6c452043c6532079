#include "client/kvarnctl/health_wire.h"

namespace kvarn::ctl {
namespace {

constexpr uint32_t kWireVarint = 0, kWireFixed64 = 1, kWireLengthDelimited = 2, kWireFixed32 = 5;

void PutVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// Reads a varint at bytes[*pos]; false if it is truncated or longer than 10 bytes.
bool GetVarint(std::string_view bytes, size_t* pos, uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (*pos >= bytes.size()) return false;
    const auto b = static_cast<unsigned char>(bytes[(*pos)++]);
    *v |= static_cast<uint64_t>(b & 0x7F) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

}  // namespace

std::string EncodeHealthCheckRequest(std::string_view service) {
  std::string out;
  if (service.empty()) return out;
  PutVarint((1u << 3) | kWireLengthDelimited, &out);  // field 1, string
  PutVarint(service.size(), &out);
  out.append(service);
  return out;
}

CodecStatus DecodeHealthCheckResponse(std::string_view bytes, ServingStatus* status) {
  *status = ServingStatus::kUnknown;
  size_t pos = 0;
  while (pos < bytes.size()) {
    uint64_t key = 0;
    if (!GetVarint(bytes, &pos, &key)) return InvalidArgument("health reply: truncated field key");
    const uint64_t field = key >> 3;
    const uint32_t wire = static_cast<uint32_t>(key & 7);
    if (field == 0) return InvalidArgument("health reply: field number 0");
    uint64_t v = 0;
    switch (wire) {
      case kWireVarint:
        if (!GetVarint(bytes, &pos, &v)) return InvalidArgument("health reply: truncated varint");
        // An enum is an int32 on the wire; the last occurrence wins, as protobuf reads it.
        if (field == 1) *status = static_cast<ServingStatus>(static_cast<int32_t>(v));
        break;
      case kWireFixed64:
        if (bytes.size() - pos < 8) return InvalidArgument("health reply: truncated fixed64");
        pos += 8;
        break;
      case kWireLengthDelimited:
        if (!GetVarint(bytes, &pos, &v) || v > bytes.size() - pos) {
          return InvalidArgument("health reply: truncated length-delimited field");
        }
        pos += static_cast<size_t>(v);
        break;
      case kWireFixed32:
        if (bytes.size() - pos < 4) return InvalidArgument("health reply: truncated fixed32");
        pos += 4;
        break;
      default:
        return InvalidArgument("health reply: wire type " + std::to_string(wire) + " is not supported");
    }
  }
  return {};
}

std::string ServingStatusName(ServingStatus status) {
  switch (status) {
    case ServingStatus::kUnknown: return "UNKNOWN";
    case ServingStatus::kServing: return "SERVING";
    case ServingStatus::kNotServing: return "NOT_SERVING";
    case ServingStatus::kServiceUnknown: return "SERVICE_UNKNOWN";
  }
  return "STATUS_" + std::to_string(static_cast<int32_t>(status));
}

}  // namespace kvarn::ctl
