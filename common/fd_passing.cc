#include "common/fd_passing.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvarn {
namespace {

constexpr size_t kMaxMessage = 64 * 1024;
constexpr size_t kMaxFds = 16;

}  // namespace

absl::Status SendWithFds(int socket, std::string_view bytes, std::span<const int> fds) {
  if (bytes.size() > kMaxMessage || fds.size() > kMaxFds) {
    return absl::InvalidArgumentError(absl::StrCat("message of ", bytes.size(), " bytes and ", fds.size(), " descriptors is too large"));
  }
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
  if (!fds.empty()) {
    std::memset(control, 0, sizeof(control));
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  for (;;) {
    const ssize_t n = sendmsg(socket, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) {
      if (static_cast<size_t>(n) != bytes.size()) return absl::InternalError("short send of a descriptor message");
      return absl::OkStatus();
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return absl::UnavailableError("descriptor channel is full");
    return absl::ErrnoToStatus(errno, "sendmsg");
  }
}

absl::StatusOr<ReceivedMessage> ReceiveWithFds(int socket, size_t max_bytes, size_t max_fds, absl::Duration timeout) {
  if (max_fds > kMaxFds) max_fds = kMaxFds;
  pollfd p{socket, POLLIN, 0};
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    const int r = poll(&p, 1, static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(left, 1 << 30))));
    if (r > 0) break;
    if (r == 0) return absl::DeadlineExceededError("no message on the descriptor channel in time");
    if (errno != EINTR) return absl::ErrnoToStatus(errno, "poll");
  }
  ReceivedMessage out;
  out.bytes.resize(max_bytes + 1);  // one more, to see a message that is too long
  iovec iov{out.bytes.data(), out.bytes.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = recvmsg(socket, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return absl::ErrnoToStatus(errno, "recvmsg");
  // Take ownership of whatever arrived before judging the message, so nothing leaks.
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      out.fds.emplace_back(fd);
    }
  }
  if (n == 0 && out.fds.empty()) return absl::UnavailableError("the peer closed the descriptor channel");
  if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 || static_cast<size_t>(n) > max_bytes || out.fds.size() > max_fds) {
    return absl::InvalidArgumentError(absl::StrCat("descriptor channel message too large (", n, " bytes, ", out.fds.size(),
                                                   " descriptors; at most ", max_bytes, " and ", max_fds, ")"));
  }
  out.bytes.resize(static_cast<size_t>(n));
  return out;
}

absl::StatusOr<PeerCredentials> PeerOf(int socket) {
  ucred c{};
  socklen_t len = sizeof(c);
  if (getsockopt(socket, SOL_SOCKET, SO_PEERCRED, &c, &len) != 0) return absl::ErrnoToStatus(errno, "SO_PEERCRED");
  return PeerCredentials{c.pid, c.uid, c.gid};
}

}  // namespace kvarn
