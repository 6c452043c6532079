#include "daemon/service/descriptor_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/fd_passing.h"
#include "daemon/backends/slab_retention.h"
#include "daemon/service/convert.h"
#include "daemon/service/log.h"
#include "kvarn/v1/kvarn.pb.h"

namespace kvarn {
namespace {

constexpr size_t kMaxRequest = 4096;

v1::DescriptorReply::Entry::Kind KindOf(RegionKind k) {
  switch (k) {
    case RegionKind::kQuant: return v1::DescriptorReply::Entry::KIND_QUANT;
    case RegionKind::kSink: return v1::DescriptorReply::Entry::KIND_SINK;
    case RegionKind::kTail: return v1::DescriptorReply::Entry::KIND_TAIL;
  }
  return v1::DescriptorReply::Entry::KIND_UNSPECIFIED;
}

void Reply(int fd, const absl::Status& status) {
  v1::DescriptorReply r;
  r.set_code(static_cast<int>(status.code()));
  r.set_message(std::string(status.message()));
  SendWithFds(fd, r.SerializeAsString(), {}).IgnoreError();
}

}  // namespace

std::string DescriptorSocketPath(const std::string& grpc_socket_path) { return grpc_socket_path + ".fd"; }

absl::StatusOr<std::unique_ptr<DescriptorServer>> DescriptorServer::Start(KvCore* core, Options options) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (options.path.empty() || options.path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("descriptor socket path '", options.path, "' is empty or longer than ",
                                                   sizeof(addr.sun_path) - 1, " bytes"));
  }
  std::memcpy(addr.sun_path, options.path.c_str(), options.path.size() + 1);
  UniqueFd listener(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!listener.valid()) return absl::ErrnoToStatus(errno, "descriptor socket");
  unlink(options.path.c_str());  // a socket file left by a previous instance (the caller holds the instance lock)
  if (bind(listener.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("bind ", options.path));
  }
  chmod(options.path.c_str(), options.mode);
  if (listen(listener.get(), 128) != 0) return absl::ErrnoToStatus(errno, absl::StrCat("listen on ", options.path));
  UniqueFd wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return absl::ErrnoToStatus(errno, "eventfd");
  std::unique_ptr<DescriptorServer> s(new DescriptorServer(core, std::move(options), std::move(listener), std::move(wake)));
  s->thread_ = std::thread([p = s.get()] { p->Serve(); });
  return s;
}

DescriptorServer::~DescriptorServer() { Stop(); }

void DescriptorServer::Stop() {
  if (stopped_.exchange(true)) return;
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t w = write(wake_.get(), &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  listener_.Reset();
  unlink(options_.path.c_str());
}

void DescriptorServer::Serve() {
  using Clock = std::chrono::steady_clock;
  struct Conn {
    UniqueFd fd;
    Clock::time_point deadline;
  };
  std::vector<Conn> conns;
  std::vector<pollfd> polled;
  const auto timeout = std::chrono::duration_cast<Clock::duration>(absl::ToChronoNanoseconds(options_.request_timeout));
  for (;;) {
    polled.clear();
    polled.push_back({wake_.get(), POLLIN, 0});
    polled.push_back({listener_.get(), POLLIN, 0});
    Clock::time_point wake_at = Clock::time_point::max();
    for (const Conn& c : conns) {
      polled.push_back({c.fd.get(), POLLIN, 0});
      wake_at = std::min(wake_at, c.deadline);
    }
    int wait_ms = -1;
    if (wake_at != Clock::time_point::max()) {
      wait_ms = static_cast<int>(std::clamp<int64_t>(
          std::chrono::ceil<std::chrono::milliseconds>(wake_at - Clock::now()).count(), 0, INT_MAX));
    }
    if (poll(polled.data(), polled.size(), wait_ms) < 0 && errno != EINTR) continue;
    if (polled[0].revents != 0) return;
    const Clock::time_point now = Clock::now();
    for (size_t i = 0; i < conns.size(); ++i) {
      if (polled[i + 2].revents != 0) {
        Answer(conns[i].fd.get());
        conns[i].fd.Reset();
      } else if (now >= conns[i].deadline) {
        refused_.fetch_add(1);
        conns[i].fd.Reset();  // said nothing in time
      }
    }
    std::erase_if(conns, [](const Conn& c) { return !c.fd.valid(); });
    if ((polled[1].revents & POLLIN) != 0) {
      for (;;) {
        const int fd = accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;  // EAGAIN, or out of descriptors: the next round retries
        if (conns.size() >= static_cast<size_t>(options_.max_connections)) {
          refused_.fetch_add(1);
          conns.erase(conns.begin());  // the oldest waiting one makes room
        }
        conns.push_back({UniqueFd(fd), now + timeout});
      }
    }
  }
}

void DescriptorServer::Answer(int fd) {
  // Descriptors sent to the daemon are refused (and closed) by ReceiveWithFds.
  absl::StatusOr<ReceivedMessage> msg = ReceiveWithFds(fd, kMaxRequest, 0, absl::ZeroDuration());
  if (!msg.ok()) {
    refused_.fetch_add(1);
    if (absl::IsInvalidArgument(msg.status())) Reply(fd, msg.status());
    return;
  }
  v1::DescriptorRequest req;
  if (!req.ParseFromString(msg->bytes) || !req.has_session()) {
    refused_.fetch_add(1);
    Reply(fd, absl::InvalidArgumentError("not a DescriptorRequest"));
    return;
  }
  absl::StatusOr<PeerCredentials> peer = PeerOf(fd);
  if (!peer.ok()) {
    refused_.fetch_add(1);
    Reply(fd, absl::PermissionDeniedError("the peer's credentials are unknown (SO_PEERCRED)"));
    return;
  }
  if (req.commit_ring()) {
    AnswerRing(fd, FromProto(req.session()), peer->pid);
    return;
  }
  // pid 0: the peer is in a PID namespace kvarnd cannot see into (a worker in another pod);
  // the core decides whether its backend can lend memory to such a peer.
  // The process's start time tells a recycled pid apart; read here, outside the core's lock.
  const uint64_t identity = peer->pid > 0 ? ProcessProbe::System()->Identity(peer->pid).value_or(0) : 0;
  auto lent = core_->LendMemory(FromProto(req.session()), peer->pid, identity);
  if (!lent.ok()) {
    refused_.fetch_add(1);
    Log(LogLevel::kWarning, "descriptors_refused",
        {{"session", req.session().session_id()}, {"pid", static_cast<int64_t>(peer->pid)},
         {"uid", static_cast<int64_t>(peer->uid)}, {"reason", lent.status().ToString()}});
    Reply(fd, lent.status());
    return;
  }
  v1::DescriptorReply reply;
  std::vector<int> fds;
  for (const LentSegment& seg : *lent) {
    auto* e = reply.add_segments();
    e->set_kind(KindOf(seg.kind));
    e->set_bytes(seg.info.bytes);
    e->set_writable(seg.writable);
    e->set_has_fd(seg.fd.valid());
    e->set_cuda_ipc_handle(seg.info.cuda_ipc_handle);
    e->set_cuda_device(seg.info.cuda_device);
    e->set_device_pointer(seg.info.device_pointer);
    if (seg.fd.valid()) fds.push_back(seg.fd.get());
  }
  if (absl::Status sent = SendWithFds(fd, reply.SerializeAsString(), fds); !sent.ok()) {
    refused_.fetch_add(1);
    return;  // the duplicates close with `lent`
  }
  lent_.fetch_add(1);
  Log(LogLevel::kDebug, "descriptors_lent", {{"session", req.session().session_id()}, {"pid", static_cast<int64_t>(peer->pid)}});
}

void DescriptorServer::AnswerRing(int fd, const SessionRef& ref, int pid) {
  if (options_.rings == nullptr) {
    refused_.fetch_add(1);
    Reply(fd, absl::UnimplementedError("this kvarnd serves no commit rings"));
    return;
  }
  auto lent = options_.rings->Open(ref, pid);
  if (!lent.ok()) {
    refused_.fetch_add(1);
    Log(LogLevel::kWarning, "commit_ring_refused",
        {{"session", ref.session}, {"pid", static_cast<int64_t>(pid)}, {"reason", lent.status().ToString()}});
    Reply(fd, lent.status());
    return;
  }
  v1::DescriptorReply reply;
  auto* ring = reply.add_segments();
  ring->set_kind(v1::DescriptorReply::Entry::KIND_COMMIT_RING);
  ring->set_bytes(lent->bytes);
  ring->set_writable(true);
  ring->set_has_fd(true);
  ring->set_ring_records(lent->capacity);
  auto* bell = reply.add_segments();
  bell->set_kind(v1::DescriptorReply::Entry::KIND_DOORBELL);
  bell->set_has_fd(true);
  const int fds[] = {lent->memory.get(), lent->doorbell.get()};
  if (!SendWithFds(fd, reply.SerializeAsString(), fds).ok()) {
    refused_.fetch_add(1);
    return;  // the ring stays the session's; the client may not ask again (ALREADY_EXISTS)
  }
  lent_.fetch_add(1);
}

}  // namespace kvarn
