#include "client/lib/descriptor_client.h"

#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/fd_passing.h"

namespace kvarn {

namespace {

absl::StatusOr<LentSegments> Fetch(const std::string& socket_path, const v1::DescriptorRequest& req,
                                   absl::Duration timeout) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof(addr.sun_path)) return absl::InvalidArgumentError("descriptor socket path too long");
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return absl::ErrnoToStatus(errno, "socket");
  if (connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot reach kvarnd's descriptor channel ", socket_path, ": ", strerror(errno)));
  }
  if (absl::Status s = SendWithFds(fd.get(), req.SerializeAsString(), {}); !s.ok()) return s;
  absl::StatusOr<ReceivedMessage> msg = ReceiveWithFds(fd.get(), 64 * 1024, 8, timeout);
  if (!msg.ok()) return msg.status();
  v1::DescriptorReply reply;
  if (!reply.ParseFromString(msg->bytes)) return absl::InternalError("kvarnd's descriptor reply does not parse");
  if (reply.code() != 0) return absl::Status(static_cast<absl::StatusCode>(reply.code()), reply.message());
  LentSegments out;
  size_t next = 0;
  for (const auto& e : reply.segments()) {
    LentSegments::Segment s;
    s.entry = e;
    if (e.has_fd()) {
      if (next >= msg->fds.size()) return absl::InternalError("kvarnd's descriptor reply lacks a descriptor it announced");
      s.fd = std::move(msg->fds[next++]);
    }
    out.segments.push_back(std::move(s));
  }
  if (next != msg->fds.size()) return absl::InternalError("kvarnd sent descriptors its reply does not describe");
  return out;
}

}  // namespace

absl::StatusOr<LentSegments> FetchSessionMemory(const std::string& socket_path, const v1::SessionRef& session,
                                                absl::Duration timeout) {
  v1::DescriptorRequest req;
  *req.mutable_session() = session;
  return Fetch(socket_path, req, timeout);
}

absl::StatusOr<LentSegments> FetchCommitRing(const std::string& socket_path, const v1::SessionRef& session,
                                             absl::Duration timeout) {
  v1::DescriptorRequest req;
  *req.mutable_session() = session;
  req.set_commit_ring(true);
  return Fetch(socket_path, req, timeout);
}

}  // namespace kvarn
