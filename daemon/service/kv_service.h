// The gRPC handlers of kvarn.v1.KvCache: each one validates the request's shape, calls the
// core, and maps its absl::Status to the gRPC status of the same code. Unary calls run on
// gRPC's synchronous thread pool (sealing may take milliseconds); the keep-alive and Watch
// streams are callback reactors (watch_hub.h), so thousands of idle streams hold no threads.
#ifndef KVARN_DAEMON_SERVICE_KV_SERVICE_H_
#define KVARN_DAEMON_SERVICE_KV_SERVICE_H_

#include <atomic>
#include <string_view>

#include "absl/container/flat_hash_set.h"
#include "common/mutex.h"

#include "absl/time/time.h"
#include "daemon/core/kv_core.h"
#include "daemon/service/watch_hub.h"
#include "kvarn/v1/kvarn.grpc.pb.h"

namespace kvarn {

class RpcObserver {
 public:
  virtual ~RpcObserver() = default;
  virtual void OnRpc(std::string_view method, grpc::StatusCode code, absl::Duration latency) = 0;
};

class KvService final
    : public v1::KvCache::WithCallbackMethod_KeepAlive<v1::KvCache::WithCallbackMethod_Watch<v1::KvCache::Service>> {
 public:
  struct Options {
    uint64_t max_inline_bytes = 64ull << 20;  // keys + values of one AppendInline: the message limit
    uint32_t max_batch = 4096;                // items of one AppendBatch
    // Longest a Watch hub waits for events before it re-checks sessions and shutdown.
    absl::Duration watch_poll = absl::Milliseconds(200);
  };
  KvService(KvCore* core, Options options, RpcObserver* observer = nullptr);
  ~KvService() override;

  // Ends every stream before the server shuts down: Watch streams (OK) and keep-alive
  // streams (UNAVAILABLE), so shutdown does not wait on them.
  void Stop();
  // Returns once no unary handler runs. The server calls it before it destroys the core: gRPC
  // finishes its calls first, but through locking its own (that TSan cannot see); this makes
  // the order explicit and holds whatever gRPC does.
  void WaitForCalls();
  size_t watch_streams() const { return watch_.streams(); }

  grpc::Status Describe(grpc::ServerContext* ctx, const v1::DescribeRequest* req, v1::DescribeResponse* resp) override;
  grpc::Status OpenSession(grpc::ServerContext* ctx, const v1::OpenSessionRequest* req, v1::OpenSessionResponse* resp) override;
  grpc::ServerBidiReactor<v1::KeepAliveRequest, v1::KeepAliveResponse>* KeepAlive(grpc::CallbackServerContext* ctx) override;
  grpc::Status CloseSession(grpc::ServerContext* ctx, const v1::CloseSessionRequest* req, v1::CloseSessionResponse* resp) override;
  grpc::Status CreateSequence(grpc::ServerContext* ctx, const v1::CreateSequenceRequest* req, v1::CreateSequenceResponse* resp) override;
  grpc::Status Append(grpc::ServerContext* ctx, const v1::AppendRequest* req, v1::AppendResponse* resp) override;
  grpc::Status AppendBatch(grpc::ServerContext* ctx, const v1::AppendBatchRequest* req, v1::AppendBatchResponse* resp) override;
  grpc::Status AppendInline(grpc::ServerContext* ctx, const v1::AppendInlineRequest* req, v1::AppendResponse* resp) override;
  grpc::Status Fork(grpc::ServerContext* ctx, const v1::ForkRequest* req, v1::ForkResponse* resp) override;
  grpc::Status Release(grpc::ServerContext* ctx, const v1::ReleaseRequest* req, v1::ReleaseResponse* resp) override;
  grpc::Status Lookup(grpc::ServerContext* ctx, const v1::LookupRequest* req, v1::LookupResponse* resp) override;
  grpc::Status Read(grpc::ServerContext* ctx, const v1::ReadRequest* req, v1::ReadResponse* resp) override;
  grpc::Status Evict(grpc::ServerContext* ctx, const v1::EvictRequest* req, v1::EvictResponse* resp) override;
  grpc::Status Stats(grpc::ServerContext* ctx, const v1::StatsRequest* req, v1::StatsResponse* resp) override;
  grpc::Status ListSequences(grpc::ServerContext* ctx, const v1::ListSequencesRequest* req, v1::ListSequencesResponse* resp) override;
  grpc::ServerWriteReactor<v1::BlockEvent>* Watch(grpc::CallbackServerContext* ctx, const v1::WatchRequest* req) override;

 private:
  class KeepAliveReactor;
  // Runs a handler body, timing it for the RPC latency metric.
  template <typename F>
  grpc::Status Timed(std::string_view method, F&& body);

  KvCore* core_;
  Options options_;
  RpcObserver* observer_;
  std::atomic<bool> stopping_{false};
  Mutex calls_mu_;
  CondVar calls_done_;
  int calls_in_flight_ ABSL_GUARDED_BY(calls_mu_) = 0;
  WatchHub watch_;
  Mutex reactors_mu_;
  absl::flat_hash_set<KeepAliveReactor*> reactors_ ABSL_GUARDED_BY(reactors_mu_);
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_SERVICE_KV_SERVICE_H_
