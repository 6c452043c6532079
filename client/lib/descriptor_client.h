// The client side of kvarnd's descriptor channel (daemon/service/descriptor_server.h): trades
// a session's credential for the session's memory, as descriptors (host pools) or CUDA IPC
// handles (GPU pools).
#ifndef KVARN_CLIENT_LIB_DESCRIPTOR_CLIENT_H_
#define KVARN_CLIENT_LIB_DESCRIPTOR_CLIENT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"
#include "kvarn/v1/kvarn.pb.h"

namespace kvarn {

struct LentSegments {
  struct Segment {
    v1::DescriptorReply::Entry entry;
    UniqueFd fd;  // valid when entry.has_fd()
  };
  std::vector<Segment> segments;
};

// Connects to `socket_path` (the gRPC socket's path plus ".fd"), presents `session`, and
// returns what the daemon lends. The daemon's refusal comes back with its code (NOT_FOUND,
// PERMISSION_DENIED, ...); UNAVAILABLE when the channel cannot be reached; INTERNAL for a
// reply that does not match its descriptors.
absl::StatusOr<LentSegments> FetchSessionMemory(const std::string& socket_path, const v1::SessionRef& session,
                                                absl::Duration timeout = absl::Seconds(5));

// The session's commit ring (docs/commit_ring.md): a KIND_COMMIT_RING segment and a
// KIND_DOORBELL eventfd, for the process the session's memory was lent to. The daemon's
// refusal comes back with its code (ALREADY_EXISTS, FAILED_PRECONDITION, PERMISSION_DENIED,
// UNIMPLEMENTED, ...), as for FetchSessionMemory.
absl::StatusOr<LentSegments> FetchCommitRing(const std::string& socket_path, const v1::SessionRef& session,
                                             absl::Duration timeout = absl::Seconds(5));

}  // namespace kvarn

#endif  // KVARN_CLIENT_LIB_DESCRIPTOR_CLIENT_H_
