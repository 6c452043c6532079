// Conversions between the wire types (kvarn.v1) and the core's types.
#ifndef KVARN_DAEMON_SERVICE_CONVERT_H_
#define KVARN_DAEMON_SERVICE_CONVERT_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "daemon/core/core_types.h"
#include "daemon/core/events.h"
#include "daemon/core/whatif.h"
#include "kvarn/v1/kvarn.pb.h"

namespace kvarn {

// absl and gRPC codes share their numbers.
grpc::Status ToGrpc(const absl::Status& s);

ModelConfig FromProto(const v1::ModelLayout& m);
void ToProto(const ModelConfig& m, v1::ModelLayout* out);
SessionRef FromProto(const v1::SessionRef& r);
void ToProto(const BlockTableView& t, v1::BlockTable* out);
void ToProto(const PoolView& p, const ModelConfig& model, v1::PoolDescription* out);
void ToProto(const CoreStats& s, const std::string& preset, v1::StatsResponse* out);
// An event as a watcher sees it: its tenant's name and its tier's ("pool", "disk", ...).
struct NamedEvent {
  BlockEvent event;
  std::string tenant;
  std::string_view tier;
};
void ToProto(const BlockEvent& e, const std::string& tenant, std::string_view tier, v1::BlockEvent* out);

}  // namespace kvarn

#endif  // KVARN_DAEMON_SERVICE_CONVERT_H_
