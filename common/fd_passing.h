// Messages with file descriptors attached (SCM_RIGHTS) on Unix SOCK_SEQPACKET sockets, and
// the kernel-verified identity of the peer (SO_PEERCRED). Used by the descriptor channel
// through which kvarnd lends its memory (daemon/service/descriptor_server.h).
#ifndef KVARN_COMMON_FD_PASSING_H_
#define KVARN_COMMON_FD_PASSING_H_

#include <sys/types.h>

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"

namespace kvarn {

// Sends `bytes` (at most 64 KiB) as one message with `fds` attached (each duplicated into the
// receiver; the caller keeps its own). Does not block: UNAVAILABLE when the socket is full.
absl::Status SendWithFds(int socket, std::string_view bytes, std::span<const int> fds);

struct ReceivedMessage {
  std::string bytes;
  std::vector<UniqueFd> fds;  // close-on-exec
};

// Receives one message of at most `max_bytes` carrying at most `max_fds` descriptors, waiting
// up to `timeout` for it. A longer message, more descriptors than allowed, or a truncated
// control message is INVALID_ARGUMENT, and every descriptor that did arrive is closed;
// DEADLINE_EXCEEDED when nothing came in time; UNAVAILABLE when the peer closed.
absl::StatusOr<ReceivedMessage> ReceiveWithFds(int socket, size_t max_bytes, size_t max_fds, absl::Duration timeout);

// The peer's process, user and group as the kernel recorded them at connect(2).
struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};
absl::StatusOr<PeerCredentials> PeerOf(int socket);

}  // namespace kvarn

#endif  // KVARN_COMMON_FD_PASSING_H_
