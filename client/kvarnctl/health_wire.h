// The two messages of grpc.health.v1.Health/Check in protobuf wire format, written and read
// by hand: Debian's grpc++ ships the health service inside the server library but neither
// health.proto nor a generated client stub, and the messages are one field each in an API
// that is frozen upstream:
//   message HealthCheckRequest  { string service = 1; }
//   message HealthCheckResponse { enum ServingStatus { UNKNOWN = 0; SERVING = 1;
//                                   NOT_SERVING = 2; SERVICE_UNKNOWN = 3; }
//                                 ServingStatus status = 1; }
// `kvarnctl health` sends them through grpc::GenericStub. Std only, so unit tests link it.
#ifndef KVARN_CLIENT_KVARNCTL_HEALTH_WIRE_H_
#define KVARN_CLIENT_KVARNCTL_HEALTH_WIRE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "kernels/status.h"

namespace kvarn::ctl {

inline constexpr char kHealthCheckMethod[] = "/grpc.health.v1.Health/Check";

enum class ServingStatus : int32_t {
  kUnknown = 0,
  kServing = 1,
  kNotServing = 2,
  kServiceUnknown = 3,
};

// The serialized HealthCheckRequest for `service` ("" asks about the whole server). An
// empty service encodes as zero bytes, as proto3 omits default values.
std::string EncodeHealthCheckRequest(std::string_view service);

// Reads a serialized HealthCheckResponse: its status field (UNKNOWN when absent, as proto3
// reads it), skipping fields it does not know. INVALID_ARGUMENT for bytes that are not a
// well-formed message (a truncated varint or field, an unknown wire type).
CodecStatus DecodeHealthCheckResponse(std::string_view bytes, ServingStatus* status);

// "SERVING", "NOT_SERVING", "UNKNOWN", "SERVICE_UNKNOWN", or "STATUS_<n>" for a value this
// version does not know.
std::string ServingStatusName(ServingStatus status);

}  // namespace kvarn::ctl

#endif  // KVARN_CLIENT_KVARNCTL_HEALTH_WIRE_H_
