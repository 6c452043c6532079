// The in-process daemon of tests/daemon/service/service_harness.h behind a header that
// includes nothing of daemon/: client tests include client/lib/client.h, whose kvarn::Session
// is a different type from daemon/core/sessions.h's kvarn::Session (one translation unit
// cannot see both).
#ifndef KVARN_TESTS_CLIENT_LIB_IN_PROCESS_DAEMON_H_
#define KVARN_TESTS_CLIENT_LIB_IN_PROCESS_DAEMON_H_

#include <grpcpp/support/status.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvarn/v1/kvarn.pb.h"

namespace kvarn::testing {

class InProcessDaemon {
 public:
  struct Options {
    bool descriptors = true;  // the descriptor channel at "<socket>.fd"
    bool tcp = false;         // also 127.0.0.1 on an ephemeral port
    bool rings = true;        // commit rings on the descriptor channel
    // How long the ring drain thread watches a pipelining client's ring after a batch
    // (CommitRingServer::Options::watch; kvarnd's ring_watch_us).
    absl::Duration ring_watch = absl::Microseconds(50);
  };
  InProcessDaemon();
  ~InProcessDaemon();
  absl::Status Start(const Options& options);

  std::string target() const;  // "unix:<socket>"
  std::string socket() const;
  std::string File(const std::string& name) const;  // a path in the daemon's temp dir
  int tcp_port() const;

  // The core's view, without RPCs.
  uint64_t epoch();
  uint32_t sessions();
  absl::StatusOr<uint64_t> SequenceTokens(const v1::SessionRef& ref, uint64_t seq);
  absl::Status CheckSession(const v1::SessionRef& ref);
  absl::Status CheckInvariants();
  // Commit rings the daemon holds (of sessions not yet swept) and has closed.
  size_t rings();
  uint64_t rings_broken();
  // Times the ring drain thread moved to a client's CPU (CommitRingServer::cpu_moves).
  uint64_t ring_cpu_moves();
  // The descriptor channel's counters.
  uint64_t lent();
  uint64_t refused();
  // Watch streams the service holds.
  size_t watch_streams();
  // Unary calls the service answered, by method name ("AppendBatch").
  int calls(const std::string& method);
  // CloseSession over gRPC, behind a client Session's back.
  grpc::Status CloseSession(const v1::SessionRef& ref);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Deterministic original-frame K/V for n tokens of the daemon's model: [n][L][H][D] floats.
std::vector<float> TestKv(int n, uint32_t seed);
std::vector<uint32_t> TestTokenIds(uint32_t first, int n);

}  // namespace kvarn::testing

#endif  // KVARN_TESTS_CLIENT_LIB_IN_PROCESS_DAEMON_H_
