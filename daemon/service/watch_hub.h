// Watch streams on gRPC's callback API: one hub thread reads the core's event log and fans
// events out to every stream, so an open Watch holds no server thread and idles at no cost.
//
// Each stream (a ServerWriteReactor) keeps a bounded queue of events not yet written; a
// watcher that falls kMaxQueued events behind gets DATA_LOSS, as does everyone when the hub
// falls behind the core's log. A stream ends when its session ends (NOT_FOUND: checked each
// time the core reports a session ended), when the client cancels, or at Stop (OK). Streams
// never renew their session's lease. Each holds a watcher grant of the core (the tenant's
// watchers quota and the daemon's cap) until it is done.
//
// Thread safety: all methods may be called from any thread. Lock order: the hub's lock is
// never held while calling into a stream or gRPC; a stream's lock is never held while calling
// into gRPC.
#ifndef KVARN_DAEMON_SERVICE_WATCH_HUB_H_
#define KVARN_DAEMON_SERVICE_WATCH_HUB_H_

#include <grpcpp/support/server_callback.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "common/mutex.h"
#include "absl/time/time.h"
#include "daemon/core/kv_core.h"
#include "kvarn/v1/kvarn.pb.h"

namespace kvarn {

class WatchHub {
 public:
  static constexpr size_t kMaxQueued = 65536;

  // poll: longest wait for events before the hub re-checks sessions and stopping.
  WatchHub(KvCore* core, absl::Duration poll);
  ~WatchHub();  // Stop()
  WatchHub(const WatchHub&) = delete;
  WatchHub& operator=(const WatchHub&) = delete;

  // A reactor for one Watch call: grants checked here, so a refused call is a reactor that
  // finishes at once with the refusal.
  grpc::ServerWriteReactor<v1::BlockEvent>* Open(const SessionRef& ref);
  // Ends every stream with OK and joins the hub thread. Idempotent.
  void Stop();
  size_t streams() const;

 private:
  class Stream;
  void Loop(uint64_t cursor);
  void Unregister(Stream* s);

  KvCore* const core_;
  const absl::Duration poll_;
  mutable Mutex mu_;
  absl::flat_hash_set<Stream*> streams_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_SERVICE_WATCH_HUB_H_
