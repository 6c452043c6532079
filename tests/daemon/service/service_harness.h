// An in-process kvarnd for unit tests of daemon/service and client/lib: a KvCore on the host
// backend (memfd segments, as kvarnd uses) with the system clock, wrapped in a KvService and
// served by a gRPC server on a Unix socket in a fresh temporary directory, optionally with the
// descriptor channel beside it ("<socket>.fd") and a loopback TCP port. No kvarnd process:
// every handler runs in the test's own process, so tests can reach into the core.
//
// Tests wait on conditions with deadlines (WaitFor), never on sleeps.
#ifndef KVARN_TESTS_DAEMON_SERVICE_SERVICE_HARNESS_H_
#define KVARN_TESTS_DAEMON_SERVICE_SERVICE_HARNESS_H_

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/backends/host_memory.h"
#include "daemon/core/clock.h"
#include "daemon/core/kv_core.h"
#include "daemon/core/tenants.h"
#include "daemon/service/commit_ring_server.h"
#include "daemon/service/convert.h"
#include "daemon/service/descriptor_server.h"
#include "daemon/service/kv_service.h"
#include "kvarn/v1/kvarn.grpc.pb.h"
#include "tests/common/wait_for.h"

namespace kvarn::testing {

// A directory under /tmp (short: Unix socket paths are limited to 107 bytes), removed with
// everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/kvsvc.XXXXXX";
    const char* d = mkdtemp(tmpl);
    path_ = d != nullptr ? d : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Counts the unary calls KvService answers, by method.
class CountingObserver final : public RpcObserver {
 public:
  void OnRpc(std::string_view method, grpc::StatusCode, absl::Duration) override {
    MutexLock lock(&mu_);
    ++calls_[std::string(method)];
  }
  int calls(const std::string& method) const {
    MutexLock lock(&mu_);
    auto it = calls_.find(method);
    return it == calls_.end() ? 0 : it->second;
  }

 private:
  mutable Mutex mu_;
  std::map<std::string, int> calls_ ABSL_GUARDED_BY(mu_);
};

inline void SetDeadline(grpc::ClientContext* ctx, absl::Duration d = absl::Seconds(10)) {
  ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(d));
}

// 2 layers, 2 kv-heads, head_dim 64, 64-token tiles with a 64-token fp16 sink.
inline ModelConfig SmallModel() {
  ModelConfig m;
  m.model_id = "svc-model";
  m.num_layers = 2;
  m.num_kv_heads = 2;
  m.head_dim = 64;
  m.preset = "kvarn_k4v2_g64";
  m.sink_tokens = 64;
  return m;
}

// 8 MiB: 2 MiB of fp16 blocks (64 KiB each: 8 sink blocks, 24 tail slots), the rest quantized.
inline CoreConfig SmallCoreConfig() {
  CoreConfig c;
  c.model = SmallModel();
  c.capacity_bytes = 8ull << 20;
  c.fp16_share = 0.25;
  c.sink_share = 0.25;
  c.default_tail_slots = 2;
  c.max_read_tokens = 128;
  c.keepalive_interval = absl::Milliseconds(20);
  return c;
}

inline v1::ModelLayout LayoutProto(const ModelConfig& m) {
  v1::ModelLayout l;
  l.set_model_id(m.model_id);
  l.set_num_layers(m.num_layers);
  l.set_num_kv_heads(m.num_kv_heads);
  l.set_head_dim(m.head_dim);
  l.set_preset(m.preset);
  l.set_sink_tokens(m.sink_tokens);
  return l;
}

// "NAME token_sha256=HEX" for the tenants file.
inline std::string TenantLine(const std::string& name, const std::string& token, const std::string& extra = "") {
  const TokenHash h = HashToken(token);
  return absl::StrCat(name, " token_sha256=",
                      absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(h.data()), h.size())),
                      extra.empty() ? "" : " ", extra, "\n");
}

// Deterministic original-frame K/V for n tokens of the small model: [n][L][H][D] floats.
inline std::vector<float> RandomKv(int n, uint32_t seed, const ModelConfig& m = SmallModel()) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n) * m.num_layers * m.num_kv_heads * m.head_dim);
  for (float& v : x) v = dist(rng);
  return x;
}

inline std::vector<uint32_t> TokenIds(uint32_t first, int n) {
  std::vector<uint32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + static_cast<uint32_t>(i);
  return t;
}

// The core's SessionRef for a wire one, as the service converts it.
inline SessionRef CoreRef(const v1::SessionRef& r) { return FromProto(r); }

class ServiceHarness {
 public:
  struct Options {
    CoreConfig core = SmallCoreConfig();
    KvService::Options service = [] {
      KvService::Options o;
      o.max_inline_bytes = 16 << 10;  // 16 KiB: 8 tokens of f32 K+V of the small model
      o.max_batch = 8;
      o.watch_poll = absl::Milliseconds(20);
      return o;
    }();
    bool descriptors = false;  // serve the descriptor channel at "<socket>.fd"
    DescriptorServer::Options descriptor_options;  // path is filled in
    bool rings = false;        // serve commit rings on the descriptor channel (needs descriptors)
    CommitRingServer::Options ring_options;
    bool tcp = false;          // also listen on 127.0.0.1 (an ephemeral port)
    RpcObserver* observer = nullptr;  // sees every unary call the service answers
  };

  // Options that serve commit rings (on the descriptor channel, which they need).
  static Options WithRings() {
    Options o;
    o.descriptors = true;
    o.rings = true;
    return o;
  }

  ServiceHarness() = default;
  ~ServiceHarness() { Stop(); }
  ServiceHarness(const ServiceHarness&) = delete;
  ServiceHarness& operator=(const ServiceHarness&) = delete;

  absl::Status Start() { return Start(Options()); }
  absl::Status Start(Options options) {
    if (dir_.path().empty()) return absl::InternalError("mkdtemp failed");
    options_ = options;
    backend_ = std::make_unique<HostMemoryBackend>("svc-test");
    auto core = KvCore::Create(options.core, backend_.get(), SystemClock::Get());
    if (!core.ok()) return core.status();
    core_ = std::move(*core);
    service_ = std::make_unique<KvService>(core_.get(), options.service, options.observer);
    socket_ = dir_.File("k.sock");
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket_, grpc::InsecureServerCredentials());
    if (options.tcp) builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &tcp_port_);
    builder.RegisterService(service_.get());
    builder.SetMaxReceiveMessageSize(64 << 20);
    builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::CQ_TIMEOUT_MSEC, 100);
    server_ = builder.BuildAndStart();
    if (server_ == nullptr) return absl::InternalError("gRPC server did not start");
    if (options.rings) {
      auto rings = CommitRingServer::Start(core_.get(), options.ring_options, options.observer);
      if (!rings.ok()) return rings.status();
      rings_ = std::move(*rings);
    }
    if (options.descriptors) {
      DescriptorServer::Options d = options.descriptor_options;
      d.path = DescriptorSocketPath(socket_);
      d.rings = rings_.get();
      auto ds = DescriptorServer::Start(core_.get(), d);
      if (!ds.ok()) return ds.status();
      descriptors_ = std::move(*ds);
    }
    channel_ = grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials());
    stub_ = v1::KvCache::NewStub(channel_);
    return absl::OkStatus();
  }

  // Ends the streams, stops serving and releases the pool. Idempotent.
  void Stop() {
    if (descriptors_) descriptors_->Stop();
    if (service_) service_->Stop();
    if (server_) {
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
      server_->Wait();
    }
    if (service_) service_->WaitForCalls();  // as kvarnd's Server::Shutdown does
    if (rings_) rings_->Stop();
    stub_.reset();
    channel_.reset();
    descriptors_.reset();
    rings_.reset();
    server_.reset();
    service_.reset();
    core_.reset();
    backend_.reset();
  }

  bool started() const { return core_ != nullptr; }
  KvCore& core() { return *core_; }
  KvService& service() { return *service_; }
  DescriptorServer* descriptors() { return descriptors_.get(); }
  CommitRingServer* rings() { return rings_.get(); }
  v1::KvCache::Stub& stub() { return *stub_; }
  const std::string& socket() const { return socket_; }
  std::string target() const { return "unix:" + socket_; }
  std::string descriptor_socket() const { return DescriptorSocketPath(socket_); }
  int tcp_port() const { return tcp_port_; }
  const TempDir& dir() const { return dir_; }
  const Options& options() const { return options_; }

  // Opens a session over gRPC; the status of the call goes to *status when given.
  v1::OpenSessionResponse Open(const std::string& tenant, uint32_t max_sequences = 2, const std::string& token = "",
                               const std::string& admin_token = "", grpc::Status* status = nullptr) {
    v1::OpenSessionRequest req;
    req.set_tenant(tenant);
    req.set_tenant_token(token);
    *req.mutable_layout() = LayoutProto(options_.core.model);
    req.set_max_sequences(max_sequences);
    req.set_admin_token(admin_token);
    req.set_client_name("service-test");
    req.set_fp16_layout(v1::FP16_LAYOUT_TOKEN_MAJOR);
    v1::OpenSessionResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    const grpc::Status s = stub_->OpenSession(&ctx, req, &resp);
    if (status != nullptr) *status = s;
    return resp;
  }

  static v1::SessionRef RefOf(const v1::OpenSessionResponse& open) {
    v1::SessionRef r;
    r.set_session_id(open.session_id());
    r.set_epoch(open.pool().epoch());
    r.set_secret(open.session_secret());
    return r;
  }

  // Creates a sequence with an empty prompt; 0 on failure.
  uint64_t CreateSequence(const v1::SessionRef& ref) {
    v1::CreateSequenceRequest req;
    *req.mutable_session() = ref;
    v1::CreateSequenceResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    if (!stub_->CreateSequence(&ctx, req, &resp).ok()) return 0;
    return resp.sequence_id();
  }

  // Commits n tokens of whatever the tail holds (zeros in a fresh session).
  grpc::Status Commit(const v1::SessionRef& ref, uint64_t seq, const std::vector<uint32_t>& ids,
                      v1::AppendResponse* resp = nullptr) {
    v1::AppendRequest req;
    *req.mutable_session() = ref;
    req.set_sequence_id(seq);
    for (uint32_t id : ids) req.add_token_ids(id);
    v1::AppendResponse local;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    return stub_->Append(&ctx, req, resp != nullptr ? resp : &local);
  }

  grpc::Status CloseSession(const v1::SessionRef& ref) {
    v1::CloseSessionRequest req;
    *req.mutable_session() = ref;
    v1::CloseSessionResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    return stub_->CloseSession(&ctx, req, &resp);
  }

 private:
  TempDir dir_;
  Options options_;
  std::unique_ptr<HostMemoryBackend> backend_;
  std::unique_ptr<KvCore> core_;
  std::unique_ptr<KvService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<CommitRingServer> rings_;
  std::unique_ptr<DescriptorServer> descriptors_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KvCache::Stub> stub_;
  std::string socket_;
  int tcp_port_ = 0;
};

}  // namespace kvarn::testing

#endif  // KVARN_TESTS_DAEMON_SERVICE_SERVICE_HARNESS_H_
