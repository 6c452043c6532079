#include "daemon/service/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server_builder.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/backends/host_shm.h"
#include "daemon/core/cpu_sealer.h"
#include "daemon/service/log.h"

#if KVARN_HAVE_CUDA_BACKEND
#include "daemon/backends/cuda_backend.h"
#endif

namespace kvarn {
namespace {

absl::StatusOr<std::pair<std::string, uint16_t>> SplitHostPort(const std::string& s) {
  const size_t colon = s.rfind(':');
  uint32_t port = 0;
  if (colon == std::string::npos) {
    if (!absl::SimpleAtoi(s, &port) || port > 65535) return absl::InvalidArgumentError(absl::StrCat("'", s, "' is not host:port"));
    return std::make_pair(std::string("127.0.0.1"), static_cast<uint16_t>(port));
  }
  if (!absl::SimpleAtoi(s.substr(colon + 1), &port) || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("'", s, "' is not host:port"));
  }
  std::string host = s.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return std::make_pair(host, static_cast<uint16_t>(port));
}

absl::StatusOr<std::unique_ptr<MemoryBackend>> MakeBackend(const DaemonConfig& c, SealerFactory* sealer) {
  std::string kind = c.backend;
#if KVARN_HAVE_CUDA_BACKEND
  if (kind == "auto") kind = CudaBackend::DeviceUsable(c.cuda_device) ? "cuda" : "host";
  if (kind == "cuda") {
    auto b = CudaBackend::Create(c.cuda_device);
    if (!b.ok()) return b.status();
    *sealer = (*b)->MakeSealerFactory();
    return std::unique_ptr<MemoryBackend>(std::move(*b));
  }
#else
  if (kind == "cuda") return absl::FailedPreconditionError("this kvarnd was built without CUDA: use --backend=host");
  if (kind == "auto") kind = "host";
#endif
  const std::vector<std::string> stale = HostShmBackend::RemoveStaleSegments(c.instance);
  for (const std::string& name : stale) Log(LogLevel::kWarning, "stale_segment_removed", {{"name", name}});
  auto b = HostShmBackend::Create(c.instance);
  if (!b.ok()) return b.status();
  const int threads = c.seal_threads;
  *sealer = [threads](const Preset& p, const BlockLayout& l) { return std::make_unique<CpuSealer>(p, l, threads); };
  return std::unique_ptr<MemoryBackend>(std::move(*b));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const DaemonConfig& config) {
  std::unique_ptr<Server> s(new Server());
  s->config_ = config;
  LogLevel level;
  if (!ParseLogLevel(config.log_level, &level)) return absl::InvalidArgumentError("log_level must be debug, info, warning or error");
  SetLogLevel(level);

  SealerFactory sealer;
  auto backend = MakeBackend(config, &sealer);
  if (!backend.ok()) return backend.status();
  s->backend_ = std::move(*backend);
  auto m = ServiceMetrics::Create(&s->registry_);
  if (!m.ok()) return m.status();
  s->metrics_ = std::move(*m);
  auto core = KvCore::Create(config.core, s->backend_.get(), SystemClock::Get(), sealer, s->metrics_.get());
  if (!core.ok()) return core.status();
  s->core_ = std::move(*core);
  if (absl::Status b = s->metrics_->Bind(s->core_.get()); !b.ok()) return b;

  if (!config.core.admin_token.empty() && !config.admin_token_file.empty()) {
    const std::string tmp = config.admin_token_file + ".tmp";
    {
      std::ofstream f(tmp, std::ios::trunc);
      f << config.core.admin_token << "\n";
      if (!f) return absl::FailedPreconditionError(absl::StrCat("cannot write ", tmp));
    }
    chmod(tmp.c_str(), 0600);
    if (std::rename(tmp.c_str(), config.admin_token_file.c_str()) != 0) {
      return absl::FailedPreconditionError(absl::StrCat("cannot write ", config.admin_token_file));
    }
  }

  s->service_ = std::make_unique<KvService>(s->core_.get(), KvService::Options{}, s->metrics_.get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  if (!config.listen.empty()) {
    unlink(config.listen.c_str());  // a socket file left by a previous instance
    builder.AddListeningPort(absl::StrCat("unix:", config.listen), grpc::InsecureServerCredentials());
  }
  if (!config.tcp.empty()) builder.AddListeningPort(config.tcp, grpc::InsecureServerCredentials(), &s->tcp_port_);
  builder.RegisterService(s->service_.get());
  // Inline appends carry K/V; bigger messages get RESOURCE_EXHAUSTED from gRPC itself.
  builder.SetMaxReceiveMessageSize(config.max_message_mb << 20);
  builder.SetMaxSendMessageSize(config.max_message_mb << 20);
  // The server sends no HTTP/2 pings of its own: the lease (keep-alive stream, TTL) is the
  // authority on session liveness, and clients ping (every 10 s) to find a dead daemon. Accept
  // their pings even between calls.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  // The synchronous pool's pollers wake at least this often; gRPC's 10 s default is how long
  // a stopped server could linger in its teardown.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::CQ_TIMEOUT_MSEC, 100);
  s->grpc_ = builder.BuildAndStart();
  if (s->grpc_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("cannot listen on ", config.listen.empty() ? config.tcp : config.listen,
                                                      config.tcp.empty() ? "" : absl::StrCat(" / ", config.tcp)));
  }
  if (!config.listen.empty()) chmod(config.listen.c_str(), 0600);  // same-user clients only
  grpc::HealthCheckServiceInterface* health = s->grpc_->GetHealthCheckService();
  if (health != nullptr) health->SetServingStatus("kvarn.v1.KvCache", true);

  if (!config.metrics.empty()) {
    auto hp = SplitHostPort(config.metrics);
    if (!hp.ok()) return hp.status();
    metrics::HttpExporter::Options o;
    o.bind_address = hp->first;
    o.port = hp->second;
    auto e = metrics::HttpExporter::Start(&s->registry_, o);
    if (!e.ok()) return absl::Status(e.status().code(), absl::StrCat("metrics endpoint ", config.metrics, ": ", e.status().message()));
    s->exporter_ = std::move(*e);
  }
  s->expiry_ = std::thread([p = s.get()] { p->ExpiryLoop(); });
  const CoreStats st = s->core_->Stats(std::nullopt).value();
  Log(LogLevel::kInfo, "kvarnd_started",
      {{"pid", static_cast<int64_t>(getpid())}, {"epoch", s->core_->epoch()}, {"backend", s->backend_->name()},
       {"listen", config.listen}, {"tcp", config.tcp}, {"tcp_port", s->tcp_port_},
       {"metrics", config.metrics}, {"metrics_port", static_cast<int>(s->metrics_port())},
       {"preset", s->core_->preset().Name()}, {"layers", config.core.model.num_layers},
       {"kv_heads", config.core.model.num_kv_heads}, {"head_dim", config.core.model.head_dim},
       {"capacity_bytes", st.capacity_bytes}, {"quant_blocks", st.quant_total}, {"fp16_blocks", st.fp16_slots_budget}});
  return s;
}

void Server::ExpiryLoop() {
  while (!stop_expiry_.WaitForNotificationWithTimeout(config_.expiry_scan)) {
    const int n = core_->ExpireSessions();
    if (n > 0) Log(LogLevel::kInfo, "sessions_expired", {{"count", n}});
  }
}

void Server::Shutdown(absl::Duration deadline) {
  if (shut_down_.exchange(true)) return;
  Log(LogLevel::kInfo, "kvarnd_draining", {});
  // A Start that failed part-way (e.g. --backend=cuda without a device) leaves later
  // members unset.
  if (core_) core_->BeginDrain();
  if (grpc_) {
    grpc::HealthCheckServiceInterface* health = grpc_->GetHealthCheckService();
    if (health != nullptr) health->Shutdown();
  }
  if (service_) service_->Stop();
  if (grpc_) {
    grpc_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(deadline));
    grpc_->Wait();
  }
  stop_expiry_.Notify();
  if (expiry_.joinable()) expiry_.join();
  if (exporter_) exporter_->Stop();
  if (!config_.listen.empty()) unlink(config_.listen.c_str());
  // No handler runs any more and nothing scrapes: release the pool now (segments are
  // unlinked) rather than when gRPC's own teardown finishes.
  core_.reset();
  Log(LogLevel::kInfo, "kvarnd_stopped", {});
}

Server::~Server() {
  Shutdown(absl::Seconds(1));
  // Members go in reverse order: the core (and its segments) after the gRPC server.
}

}  // namespace kvarn
