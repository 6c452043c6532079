#include "daemon/service/server.h"

#include <fcntl.h>
#include <malloc.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/server_builder.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/interprocess/sync/file_lock.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/escaping.h"
#include "absl/strings/strip.h"
#include "common/random.h"
#include "absl/strings/ascii.h"
#include "daemon/backends/host_memory.h"
#include "daemon/core/cpu_sealer.h"
#include "daemon/service/log.h"
#include "daemon/tiers/disk_tier.h"
#include "daemon/tiers/memcached_tier.h"

#if KVARN_HAVE_CUDA_BACKEND
#include "daemon/backends/cuda_backend.h"
#endif

namespace kvarn {

// The exclusive lock that makes one daemon per socket path.
class InstanceLock {
 public:
  static absl::StatusOr<std::unique_ptr<InstanceLock>> Acquire(const std::string& path) {
    const int fd = open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot create the lock file ", path));
    close(fd);
    try {
      auto lock = std::unique_ptr<InstanceLock>(new InstanceLock(path));
      if (!lock->lock_.try_lock()) {
        return absl::FailedPreconditionError(absl::StrCat("another kvarnd serves this socket (", path,
                                                          " is locked); stop it first or choose another listen path"));
      }
      return lock;
    } catch (const boost::interprocess::interprocess_exception& e) {
      return absl::FailedPreconditionError(absl::StrCat("cannot lock ", path, ": ", e.what()));
    }
  }

 private:
  explicit InstanceLock(const std::string& path) : lock_(path.c_str()) {}
  boost::interprocess::file_lock lock_;
};

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

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::FailedPreconditionError(absl::StrCat("cannot read ", what, " ", path));
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TcpCredentials(const DaemonConfig& c, bool* insecure) {
  *insecure = false;
  if (c.tls_cert.empty()) {
    auto hp = SplitHostPort(c.tcp);
    if (!hp.ok()) return hp.status();
    if (!IsLoopback(hp->first)) {
      if (!c.allow_insecure_tcp) {
        return absl::FailedPreconditionError(absl::StrCat(
            "tcp ", c.tcp, " is not a loopback address and no TLS is configured: set tls_cert and tls_key (and tls_client_ca "
            "for mutual TLS), or allow_insecure_tcp=true to serve it in the clear"));
      }
      *insecure = true;
    }
    return grpc::InsecureServerCredentials();
  }
  auto cert = ReadFile(c.tls_cert, "tls_cert");
  if (!cert.ok()) return cert.status();
  auto key = ReadFile(c.tls_key, "tls_key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions o(c.tls_client_ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                                              : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  if (!c.tls_client_ca.empty()) {
    auto ca = ReadFile(c.tls_client_ca, "tls_client_ca");
    if (!ca.ok()) return ca.status();
    o.pem_root_certs = *ca;
  }
  o.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(o);
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
  const int threads = c.seal_threads;
  *sealer = [threads](const Preset& p, const BlockLayout& l) { return std::make_unique<CpuSealer>(p, l, threads); };
  const HugePages huge = c.huge_pages == "on" ? HugePages::kOn : c.huge_pages == "try" ? HugePages::kTry : HugePages::kOff;
  return std::unique_ptr<MemoryBackend>(new HostMemoryBackend(c.instance, huge));
}

// The socket's directory must exist and be writable by kvarnd's uid: say which, and how to fix
// it, before anything else fails with a vaguer "cannot listen".
absl::Status CheckListenDirectory(const std::string& listen) {
  const size_t slash = listen.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : listen.substr(0, slash);
  struct stat st;
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("cannot listen on ", listen, ": directory ", dir, " does not exist; create it (install -d -o ",
                                                      geteuid(), " ", dir, ") or set listen to a path in a directory kvarnd can write"));
  }
  if (access(dir.c_str(), W_OK | X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot listen on ", listen, ": directory ", dir, " (owner uid ", st.st_uid, ", mode 0",
                                                      (st.st_mode & 0777) >> 6, (st.st_mode & 070) >> 3, st.st_mode & 07,
                                                      ") is not writable by kvarnd's uid ", geteuid()));
  }
  return absl::OkStatus();
}

// Writes `token` to `path` (mode 0600) through a temporary file and a rename.
absl::Status WriteTokenFile(const std::string& path, const std::string& token) {
  const std::string tmp = path + ".tmp";
  const int fd = open(tmp.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0) return absl::FailedPreconditionError(absl::StrCat("cannot write admin_token_file ", tmp, ": ", std::strerror(errno)));
  const std::string line = token + "\n";
  const bool ok = write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  close(fd);
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    unlink(tmp.c_str());
    return absl::FailedPreconditionError(absl::StrCat("cannot write admin_token_file ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

// The admin token: admin_token as given (also written to admin_token_file when both are set);
// else the token in admin_token_file when it exists (a mounted Secret); else a fresh random
// one written there; else none.
absl::StatusOr<std::string> ResolveAdminToken(const DaemonConfig& c) {
  if (c.admin_token_file.empty()) return c.core.admin_token;
  if (!c.core.admin_token.empty()) {
    if (absl::Status w = WriteTokenFile(c.admin_token_file, c.core.admin_token); !w.ok()) return w;
    return c.core.admin_token;
  }
  struct stat st;
  if (stat(c.admin_token_file.c_str(), &st) == 0) {
    if (absl::Status ok = CheckSecretFile(c.admin_token_file, "admin_token_file"); !ok.ok()) return ok;
    auto text = ReadFile(c.admin_token_file, "admin_token_file");
    if (!text.ok()) return text.status();
    const std::string token(absl::StripAsciiWhitespace(*text));
    if (token.empty()) return absl::InvalidArgumentError(absl::StrCat("admin_token_file ", c.admin_token_file, " is empty"));
    if (token.size() > 1024 || absl::StrContains(token, "\n")) {
      return absl::InvalidArgumentError(absl::StrCat("admin_token_file ", c.admin_token_file, " must hold one token of 1..1024 bytes"));
    }
    return token;
  }
  if (errno != ENOENT) {
    return absl::FailedPreconditionError(absl::StrCat("cannot stat admin_token_file ", c.admin_token_file, ": ", std::strerror(errno)));
  }
  uint8_t bytes[32];
  if (absl::Status r = FillRandom(bytes, sizeof bytes); !r.ok()) return r;
  const std::string token = absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(bytes), sizeof bytes));
  if (absl::Status w = WriteTokenFile(c.admin_token_file, token); !w.ok()) return w;
  Log(LogLevel::kInfo, "admin_token_generated", {{"file", c.admin_token_file}});
  return token;
}

}  // namespace

absl::Status CheckSecretFile(const std::string& path, const std::string& what) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot stat ", what, " ", path, ": ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) return absl::FailedPreconditionError(absl::StrCat(what, " ", path, " is not a regular file"));
  // No access for others, and the group may only read, when it is one of kvarnd's own groups
  // (a Kubernetes Secret volume with fsGroup: root-owned, mode 0440, kvarnd's group).
  bool own_group = st.st_gid == getegid();
  gid_t groups[256];
  const int n = getgroups(256, groups);
  for (int i = 0; i < n && !own_group; ++i) own_group = groups[i] == st.st_gid;
  if ((st.st_mode & 037) != 0 || ((st.st_mode & 040) != 0 && !own_group)) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " ", path, " has mode 0", (st.st_mode & 0777) >> 6, (st.st_mode & 070) >> 3, st.st_mode & 07,
        (st.st_mode & 037) == 0 ? absl::StrCat(" and group ", st.st_gid, ", not one of kvarnd's") : "",
        ": it holds credentials; make it 0600 (chmod 600 ", path, "), or 0440 with kvarnd's group"));
  }
  if (st.st_uid != geteuid() && st.st_uid != 0) {
    return absl::FailedPreconditionError(absl::StrCat(what, " ", path, " belongs to uid ", st.st_uid, ", neither kvarnd's uid ",
                                                      geteuid(), " nor root"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TenantSpec>> LoadTenantsFile(const std::string& path) {
  if (absl::Status ok = CheckSecretFile(path, "tenants file"); !ok.ok()) return ok;
  auto text = ReadFile(path, "tenants file");
  if (!text.ok()) return text.status();
  auto specs = ParseTenants(*text);
  if (!specs.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", specs.status().message()));
  return specs;
}

Server::Server() = default;

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const DaemonConfig& config) {
  std::unique_ptr<Server> s(new Server());
  s->config_ = config;
  LogLevel level;
  if (!ParseLogLevel(config.log_level, &level)) return absl::InvalidArgumentError("log_level must be debug, info, warning or error");
  SetLogLevel(level);

  if (!config.listen.empty()) {
    if (absl::Status dir = CheckListenDirectory(config.listen); !dir.ok()) return dir;
    auto lock = InstanceLock::Acquire(config.listen + ".lock");
    if (!lock.ok()) return lock.status();
    s->lock_ = std::move(*lock);
  }
  std::vector<TenantSpec> tenants;
  if (!config.tenants_file.empty()) {
    auto t = LoadTenantsFile(config.tenants_file);
    if (!t.ok()) return t.status();
    tenants = std::move(*t);
  }
  bool insecure_tcp = false;
  std::shared_ptr<grpc::ServerCredentials> tcp_creds;
  if (!config.tcp.empty()) {
    auto creds = TcpCredentials(config, &insecure_tcp);
    if (!creds.ok()) return creds.status();
    tcp_creds = *creds;
  }

  SealerFactory sealer;
  auto backend = MakeBackend(config, &sealer);
  if (!backend.ok()) return backend.status();
  s->backend_ = std::move(*backend);
  auto m = ServiceMetrics::Create(&s->registry_);
  if (!m.ok()) return m.status();
  s->metrics_ = std::move(*m);
  auto admin = ResolveAdminToken(config);
  if (!admin.ok()) return admin.status();
  s->config_.core.admin_token = *admin;
  auto core = KvCore::Create(s->config_.core, s->backend_.get(), SystemClock::Get(), sealer, s->metrics_.get());
  if (!core.ok()) return core.status();
  s->core_ = std::move(*core);
  if (!config.tenants_file.empty()) {
    if (absl::Status t = s->core_->ConfigureTenants(tenants); !t.ok()) return t;
  }
  if (absl::Status t = s->OpenTiers(); !t.ok()) return t;
  if (absl::Status b = s->metrics_->Bind(s->core_.get()); !b.ok()) return b;
  auto info = s->registry_.AddCallbackGauge("kvarn_build_info", "Always 1: the kvarnd version, memory backend, preset and model it serves.",
                                            {"version", "backend", "preset", "model_id"});
  if (!info.ok()) return info.status();
  (*info)->SetCallback({KVARN_VERSION, s->backend_->name(), s->core_->preset().Name(), config.core.model.model_id},
                       [] { return 1.0; }).IgnoreError();

  const uint64_t message_limit = MessageLimitBytes(config);
  KvService::Options so;
  so.max_inline_bytes = message_limit;
  so.max_batch = config.max_batch_items;
  so.watch_poll = config.watch_poll;
  s->service_ = std::make_unique<KvService>(s->core_.get(), so, s->metrics_.get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  if (!config.listen.empty()) {
    unlink(config.listen.c_str());  // a socket file left by a dead predecessor (we hold the lock)
    builder.AddListeningPort(absl::StrCat("unix:", config.listen), grpc::InsecureServerCredentials());
  }
  if (!config.tcp.empty()) builder.AddListeningPort(config.tcp, tcp_creds, &s->tcp_port_);
  builder.RegisterService(s->service_.get());
  // Bounded memory. The largest request the layout needs (a whole tile inline in fp32, or a
  // prompt of max_prompt_tokens) is the receive limit: bigger ones get RESOURCE_EXHAUSTED from
  // gRPC itself before any buffer grows. Replies are bounded by max_read_bytes (Read chunks).
  // The resource quota bounds the buffers of all calls in flight together, and the threads
  // that handle unary calls (a call beyond them gets RESOURCE_EXHAUSTED; streams are
  // callbacks and take none).
  builder.SetMaxReceiveMessageSize(static_cast<int>(message_limit));
  builder.SetMaxSendMessageSize(static_cast<int>(std::max<uint64_t>(message_limit, config.max_read_bytes + (1u << 20))));
  grpc::ResourceQuota quota("kvarnd");
  quota.Resize(config.grpc_memory_bytes);
  quota.SetMaxThreads(config.grpc_max_threads);
  builder.SetResourceQuota(quota);
  // The server sends no HTTP/2 pings of its own: the lease (keep-alive stream, TTL) is the
  // authority on session liveness, and clients ping (every 10 s) to find a dead daemon. Accept
  // their pings even between calls.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  // gRPC sets SO_REUSEPORT by default, which would let a second daemon bind the same TCP
  // port and take half the connections. One daemon per port.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // The synchronous pool's pollers wake at least this often; gRPC's 10 s default is how long
  // a stopped server could linger in its teardown.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::CQ_TIMEOUT_MSEC, 100);
  s->grpc_ = builder.BuildAndStart();
  if (s->grpc_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("cannot listen on ", config.listen.empty() ? config.tcp : config.listen,
                                                      config.tcp.empty() ? "" : absl::StrCat(" / ", config.tcp)));
  }
  if (!config.listen.empty()) {
    chmod(config.listen.c_str(), config.socket_mode);
    // Commit rings live in shared memory, so only local clients (the descriptor channel) get them.
    auto rings = CommitRingServer::Start(s->core_.get(), {.follow_client_cpu = config.ring_follow_cpu, .watch = config.ring_watch}, s->metrics_.get());
    if (!rings.ok()) return rings.status();
    s->rings_ = std::move(*rings);
    DescriptorServer::Options d;
    d.path = DescriptorSocketPath(config.listen);
    d.mode = config.socket_mode;
    d.rings = s->rings_.get();
    auto ds = DescriptorServer::Start(s->core_.get(), d);
    if (!ds.ok()) return ds.status();
    s->descriptors_ = std::move(*ds);
  }
  grpc::HealthCheckServiceInterface* health = s->grpc_->GetHealthCheckService();
  if (health != nullptr) {
    health->SetServingStatus("", true);
    health->SetServingStatus("kvarn.v1.KvCache", true);
  }

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
  if (s->exporter_) s->exporter_->SetServing(metrics::HttpExporter::Serving::kServing);
  s->housekeeping_ = std::thread([p = s.get()] { p->Housekeeping(); });
  if (insecure_tcp) {
    Log(LogLevel::kWarning, "insecure_tcp", {{"tcp", config.tcp}, {"reason", "allow_insecure_tcp=true: anyone who can reach this "
                                                                              "address can open sessions; configure TLS"}});
  }
  const CoreStats st = s->core_->Stats(std::nullopt).value();
  if (config.huge_pages != "off" && std::string_view(s->backend_->name()) != "host") {
    Log(LogLevel::kWarning, "huge_pages_ignored", {{"backend", s->backend_->name()},
                                                    {"reason", "huge_pages applies to the host backend; this pool is device memory"}});
  }
  if (st.huge_page_fallbacks > 0) {
    Log(LogLevel::kWarning, "huge_pages_unavailable",
        {{"regions", st.huge_page_fallbacks},
         {"reason", "too few huge pages available (HugePages_Free less HugePages_Rsvd in /proc/meminfo), or no hugetlbfs: "
                    "those segments are on base pages"}});
  }
  const std::string trust = config.tenants_file.empty()
      ? std::string("one trust domain: tenant names are unauthenticated labels (configure tenants_file to authenticate tenants)")
      : absl::StrCat("authenticated tenants: ", tenants.size(), " from ", config.tenants_file);
  Log(LogLevel::kInfo, "kvarnd_started",
      {{"pid", static_cast<int64_t>(getpid())}, {"epoch", s->core_->epoch()}, {"backend", s->backend_->name()},
       {"listen", config.listen}, {"tcp", config.tcp}, {"tcp_port", s->tcp_port_},
       {"tls", config.tls_cert.empty() ? "off" : config.tls_client_ca.empty() ? "server" : "mutual"},
       {"metrics", config.metrics}, {"metrics_port", static_cast<int>(s->metrics_port())},
       {"preset", s->core_->preset().Name()}, {"layers", config.core.model.num_layers},
       {"kv_heads", config.core.model.num_kv_heads}, {"head_dim", config.core.model.head_dim},
       {"capacity_bytes", st.capacity_bytes}, {"quant_blocks", st.quant_total}, {"sink_blocks", st.sink_total},
       {"tail_slots", st.tail_slots_budget}, {"huge_pages", config.huge_pages},
       {"huge_page_bytes", st.huge_page_bytes[static_cast<int>(RegionKind::kQuant)] + st.huge_page_bytes[static_cast<int>(RegionKind::kSink)]},
       {"max_message_bytes", message_limit},
       {"read_tokens_per_call", config.core.max_read_tokens}, {"trust", trust}});
  return s;
}

absl::Status Server::ReloadTenants() {
  if (config_.tenants_file.empty()) return absl::FailedPreconditionError("no tenants_file is configured");
  auto specs = LoadTenantsFile(config_.tenants_file);
  absl::Status s = specs.ok() ? core_->ConfigureTenants(*specs) : specs.status();
  if (!s.ok()) {
    Log(LogLevel::kError, "tenants_reload_failed", {{"file", config_.tenants_file}, {"error", s.ToString()}});
    return s;
  }
  metrics_->BindTenants();
  Log(LogLevel::kInfo, "tenants_reloaded", {{"file", config_.tenants_file}, {"tenants", static_cast<int64_t>(specs->size())}});
  return absl::OkStatus();
}

void Server::Housekeeping() {
  absl::Time last_trim = absl::Now();
  while (!stop_housekeeping_.WaitForNotificationWithTimeout(config_.expiry_scan)) {
    const int n = core_->ExpireSessions();
    if (n > 0) Log(LogLevel::kInfo, "sessions_expired", {{"count", n}});
    backend_->Sweep();  // may read /proc and call the device: never under the core's lock
    // Give the heap that a burst of large requests left free back to the system.
    if (absl::Now() - last_trim >= absl::Seconds(1)) {
      malloc_trim(0);
      last_trim = absl::Now();
    }
  }
}

void Server::BeginDrain() {
  // A Start that failed part-way (e.g. --backend=cuda without a device) leaves later
  // members unset.
  if (!core_ || draining_.exchange(true)) return;
  core_->BeginDrain();
  if (grpc_) {
    grpc::HealthCheckServiceInterface* health = grpc_->GetHealthCheckService();
    if (health != nullptr) {
      health->SetServingStatus("", false);
      health->SetServingStatus("kvarn.v1.KvCache", false);
    }
  }
  if (exporter_) exporter_->SetServing(metrics::HttpExporter::Serving::kDraining);
  Log(LogLevel::kInfo, "kvarnd_draining", {{"sessions", static_cast<int64_t>(ClientSessions())}});
}

absl::Status Server::OpenTiers() {
  const DaemonConfig& c = config_;
  if (!c.disk_tier_dir.empty()) {
    DiskTierOptions o;
    o.dir = c.disk_tier_dir;
    o.capacity_bytes = c.disk_tier_bytes;
    o.queue_bytes = c.tier_queue_bytes;
    o.write = c.disk_tier_write == "seal" ? TierWrite::kOnSeal : TierWrite::kOnEvict;
    o.fsync = c.disk_tier_fsync;
    const absl::Time start = absl::Now();
    absl::Time last_report = start;
    auto disk = DiskTier::Open(o, core_->tier_identity(), [&](uint64_t done, uint64_t total) {
      if (done != total && absl::Now() - last_report < absl::Seconds(2)) return;
      last_report = absl::Now();
      Log(LogLevel::kInfo, "disk_tier_scan", {{"files_done", static_cast<int64_t>(done)}, {"files", static_cast<int64_t>(total)}});
    });
    if (!disk.ok()) return absl::Status(disk.status().code(), absl::StrCat("disk tier: ", disk.status().message()));
    const TierStats st = (*disk)->Stats();
    uint64_t rejected = 0;
    for (uint64_t r : st.rejected) rejected += r;
    // A warm start: the prefixes the disk holds are found by Lookup and onboarded by
    // CreateSequence from now on.
    Log(LogLevel::kInfo, "disk_tier_open", {{"dir", c.disk_tier_dir}, {"blocks", static_cast<int64_t>(st.blocks)},
                                            {"bytes", static_cast<int64_t>(st.bytes)}, {"rejected", static_cast<int64_t>(rejected)},
                                            {"scan_ms", absl::ToInt64Milliseconds(absl::Now() - start)}});
    tiers_.push_back(std::move(*disk));
  }
  if (!c.memcached_servers.empty()) {
    MemcachedTierOptions o;
    o.servers = c.memcached_servers;
    o.key_prefix = c.memcached_key_prefix;
    o.queue_bytes = c.tier_queue_bytes;
    o.write = c.memcached_write == "evict" ? TierWrite::kOnEvict : TierWrite::kOnSeal;
    o.chunk_bytes = static_cast<uint32_t>(std::min<uint64_t>(c.memcached_chunk_bytes, UINT32_MAX));
    o.timeout = c.memcached_timeout;
    auto mc = MemcachedTier::Open(o, core_->tier_identity());
    if (!mc.ok()) return absl::Status(mc.status().code(), absl::StrCat("memcached tier: ", mc.status().message()));
    Log(LogLevel::kInfo, "memcached_tier_open", {{"servers", absl::StrJoin(c.memcached_servers, ",")}, {"write", c.memcached_write}});
    tiers_.push_back(std::move(*mc));
  }
  if (tiers_.empty()) return absl::OkStatus();
  if (c.core.tenant_salt_secret.empty()) {
    Log(LogLevel::kWarning, "tier_without_secret",
        {{"why", "tenant_salt_secret is empty: tier records carry a MAC anyone can compute; set it (the same on every node)"}});
  }
  std::vector<BlockTier*> raw;
  for (const auto& t : tiers_) raw.push_back(t.get());
  core_->SetTiers(std::move(raw));
  return absl::OkStatus();
}

uint32_t Server::ClientSessions() const {
  if (!core_) return 0;
  auto st = core_->Stats(std::nullopt);
  return st.ok() ? st->client_sessions : 0;
}

void Server::Shutdown(absl::Duration deadline) {
  if (shut_down_.exchange(true)) return;
  BeginDrain();
  Log(LogLevel::kInfo, "kvarnd_stopping", {{"sessions", static_cast<int64_t>(ClientSessions())}});
  if (exporter_) exporter_->SetServing(metrics::HttpExporter::Serving::kStopped);
  if (descriptors_) descriptors_->Stop();
  if (grpc_) {
    grpc::HealthCheckServiceInterface* health = grpc_->GetHealthCheckService();
    if (health != nullptr) health->Shutdown();
  }
  if (service_) service_->Stop();
  if (grpc_) {
    grpc_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(deadline));
    grpc_->Wait();
  }
  if (service_) service_->WaitForCalls();
  // Rings commit through the core like the handlers: served until the handlers are done.
  if (rings_) rings_->Stop();
  stop_housekeeping_.Notify();
  if (housekeeping_.joinable()) housekeeping_.join();
  if (exporter_) exporter_->Stop();
  if (!config_.listen.empty() && lock_) unlink(config_.listen.c_str());
  if (core_ && !tiers_.empty()) {
    // The pool goes to the tiers that lack it, so a restart finds it on the disk tier.
    const absl::Time start = absl::Now();
    const uint64_t spilled = config_.tier_spill_on_stop ? core_->SpillAll(start + config_.tier_stop) : 0;
    bool flushed = true;
    for (const auto& t : tiers_) flushed = t->Flush(start + config_.tier_stop) && flushed;
    Log(flushed ? LogLevel::kInfo : LogLevel::kWarning, "tiers_flushed",
        {{"spilled_blocks", static_cast<int64_t>(spilled)}, {"complete", flushed ? "true" : "false"},
         {"ms", absl::ToInt64Milliseconds(absl::Now() - start)}});
    // The tiers' threads stop (and their last events reach the core) before the core goes.
    tiers_.clear();
  }
  // No handler runs any more and nothing scrapes: release the pool now rather than when
  // gRPC's own teardown finishes.
  core_.reset();
  Log(LogLevel::kInfo, "kvarnd_stopped", {});
}

Server::~Server() {
  Shutdown(absl::Seconds(1));
  // Members go in reverse order: the core (and its segments) after the gRPC server.
}

}  // namespace kvarn
