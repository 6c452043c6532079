// The descriptor channel: a Unix SOCK_SEQPACKET socket beside the gRPC socket (at its path plus
// ".fd") where a local client trades its session credential for the session's memory.
//
// Protocol (kvarn.proto, DescriptorRequest / DescriptorReply): the client connects, sends one
// DescriptorRequest (at most 4 KiB, no descriptors), and receives one DescriptorReply with the
// segments' descriptors attached (SCM_RIGHTS); then the daemon closes the connection. A
// request with commit_ring set gets the session's commit ring instead (commit_ring_server.h). The
// daemon reads the peer's pid from the kernel (SO_PEERCRED), never from the request, and the
// core lends the memory to that process only (KvCore::LendMemory). Quantized and sink
// segments are sealed read-only (common/shared_memory.h); the session's tail is writable and
// goes to nobody else. On the CUDA backend the reply carries the slabs' IPC handles instead.
//
// One thread serves the socket with poll(2) over non-blocking connections: a client that
// connects and sends nothing costs one slot until request_timeout; when every slot is taken
// the oldest waiting connection is dropped for a new one. Malformed input (garbage, oversize,
// descriptors sent to the daemon) gets an INVALID_ARGUMENT reply or a closed connection and
// changes nothing.
//
// Thread safety: Stop may be called from any thread.
#ifndef KVARN_DAEMON_SERVICE_DESCRIPTOR_SERVER_H_
#define KVARN_DAEMON_SERVICE_DESCRIPTOR_SERVER_H_

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"
#include "daemon/core/kv_core.h"
#include "daemon/service/commit_ring_server.h"

namespace kvarn {

class DescriptorServer {
 public:
  struct Options {
    std::string path;               // socket path; an existing socket file there is replaced
    mode_t mode = 0600;             // who may connect (the gRPC socket's mode)
    int max_connections = 64;       // connections waiting for their request at once
    absl::Duration request_timeout = absl::Seconds(2);
    // Serves commit_ring requests when set (not owned; outlives the server).
    CommitRingServer* rings = nullptr;
  };

  static absl::StatusOr<std::unique_ptr<DescriptorServer>> Start(KvCore* core, Options options);
  ~DescriptorServer();
  DescriptorServer(const DescriptorServer&) = delete;
  DescriptorServer& operator=(const DescriptorServer&) = delete;

  // Stops serving and removes the socket file. Idempotent.
  void Stop();
  uint64_t lent() const { return lent_.load(); }
  uint64_t refused() const { return refused_.load(); }

 private:
  DescriptorServer(KvCore* core, Options options, UniqueFd listener, UniqueFd wake)
      : core_(core), options_(std::move(options)), listener_(std::move(listener)), wake_(std::move(wake)) {}
  void Serve();
  // Answers one request on connection `fd`.
  void Answer(int fd);
  void AnswerRing(int fd, const SessionRef& ref, int pid);

  KvCore* const core_;
  const Options options_;
  UniqueFd listener_;
  UniqueFd wake_;
  std::thread thread_;
  std::atomic<bool> stopped_{false};
  std::atomic<uint64_t> lent_{0}, refused_{0};
};

// The descriptor channel's path for a gRPC Unix socket path.
std::string DescriptorSocketPath(const std::string& grpc_socket_path);

}  // namespace kvarn

#endif  // KVARN_DAEMON_SERVICE_DESCRIPTOR_SERVER_H_
