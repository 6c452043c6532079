#include "daemon/service/kv_service.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/tsan.h"
#include "daemon/service/convert.h"
#include "daemon/service/log.h"
#include "proto/fp16_layout_name.h"

namespace kvarn {
namespace {

grpc::Status Invalid(const std::string& msg) { return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, msg); }

std::span<const uint32_t> Ids(const google::protobuf::RepeatedField<uint32_t>& r) {
  return std::span<const uint32_t>(r.data(), static_cast<size_t>(r.size()));
}

void FillAppend(const AppendResult& r, v1::AppendResponse* resp) {
  ToProto(r.table, resp->mutable_table());
  resp->set_sealed(r.sealed);
}

}  // namespace

KvService::KvService(KvCore* core, Options options, RpcObserver* observer)
    : core_(core), options_(options), observer_(observer), watch_(core, options.watch_poll) {}

KvService::~KvService() { Stop(); }

template <typename F>
grpc::Status KvService::Timed(std::string_view method, F&& body) {
  {
    MutexLock lock(&calls_mu_);
    ++calls_in_flight_;
  }
  const absl::Time start = absl::Now();
  grpc::Status s = body();
  if (observer_ != nullptr) observer_->OnRpc(method, s.error_code(), absl::Now() - start);
  MutexLock lock(&calls_mu_);
  if (--calls_in_flight_ == 0) calls_done_.SignalAll();
  return s;
}

void KvService::WaitForCalls() {
  MutexLock lock(&calls_mu_);
  while (calls_in_flight_ > 0) calls_done_.Wait(&calls_mu_);
}

// The session's lease. The first message attaches the stream to the session; each one is a
// heartbeat answered with the epoch; the stream's end (client exit, crash, network loss)
// detaches it and starts the grace period. Registered with the service so Stop() can end it.
class KvService::KeepAliveReactor final
    : public grpc::ServerBidiReactor<v1::KeepAliveRequest, v1::KeepAliveResponse> {
 public:
  explicit KeepAliveReactor(KvService* service) : service_(service), core_(service->core_) {
    bool refused = false;
    {
      MutexLock lock(&service_->reactors_mu_);
      // Under the lock Stop() takes to drain: a stream opened after it is refused here.
      refused = service_->stopping_.load();
      if (!refused) service_->reactors_.insert(this);
    }
    // Callbacks run on gRPC's threads, ordered after this constructor by gRPC's own
    // (uninstrumented) locking: say so to ThreadSanitizer.
    KVARN_TSAN_RELEASE(this);
    if (refused) {
      FinishOnce(grpc::Status(grpc::StatusCode::UNAVAILABLE, "kvarnd is shutting down"));
      return;
    }
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    KVARN_TSAN_ACQUIRE(this);
    if (!ok) {
      FinishOnce(grpc::Status::OK);
      return;
    }
    const SessionRef ref = FromProto(request_.session());
    absl::Status s;
    bool attached;
    SessionId session;
    {
      MutexLock lock(&mu_);
      attached = attached_;
      session = session_;
    }
    if (!attached) {
      s = core_->AttachStream(ref);
      if (s.ok()) {
        MutexLock lock(&mu_);
        attached_ = true;
        session_ = ref.session;
      }
    } else if (ref.session != session) {
      s = absl::InvalidArgumentError("a keep-alive stream serves one session");
    } else {
      s = core_->KeepAlive(ref);
    }
    if (!s.ok()) {
      FinishOnce(ToGrpc(s));
      return;
    }
    response_.set_epoch(core_->epoch());
    response_.set_server_time_ms(static_cast<uint64_t>(absl::ToUnixMillis(absl::Now())));
    KVARN_TSAN_RELEASE(this);
    StartWrite(&response_);
  }
  void OnWriteDone(bool ok) override {
    KVARN_TSAN_ACQUIRE(this);
    if (!ok) {
      FinishOnce(grpc::Status::OK);
      return;
    }
    KVARN_TSAN_RELEASE(this);
    StartRead(&request_);
  }
  // Called by Stop() with the service's reactor lock held (OnDone waits for it).
  void Drain() { FinishOnce(grpc::Status(grpc::StatusCode::UNAVAILABLE, "kvarnd is shutting down")); }
  void OnDone() override {
    KVARN_TSAN_ACQUIRE(this);
    bool attached;
    SessionId session;
    {
      MutexLock lock(&mu_);
      attached = attached_;
      session = session_;
    }
    if (attached) core_->DetachStream(session);
    {
      MutexLock lock(&service_->reactors_mu_);
      service_->reactors_.erase(this);
    }
    delete this;
  }

 private:
  // Finish exactly once. Nothing of this object is touched after Finish: OnDone (which
  // deletes it) may run before Finish returns.
  void FinishOnce(const grpc::Status& s) {
    {
      MutexLock lock(&mu_);
      if (finished_) return;
      finished_ = true;
    }
    KVARN_TSAN_RELEASE(this);
    Finish(s);
  }

  KvService* service_;
  KvCore* core_;
  v1::KeepAliveRequest request_;
  v1::KeepAliveResponse response_;
  Mutex mu_;
  bool attached_ ABSL_GUARDED_BY(mu_) = false;
  SessionId session_ ABSL_GUARDED_BY(mu_) = 0;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

void KvService::Stop() {
  {
    MutexLock lock(&reactors_mu_);
    if (stopping_.exchange(true)) return;
    for (KeepAliveReactor* r : reactors_) r->Drain();
  }
  watch_.Stop();
}

grpc::ServerBidiReactor<v1::KeepAliveRequest, v1::KeepAliveResponse>* KvService::KeepAlive(
    grpc::CallbackServerContext*) {
  return new KeepAliveReactor(this);
}

grpc::Status KvService::Describe(grpc::ServerContext*, const v1::DescribeRequest*, v1::DescribeResponse* resp) {
  return Timed("Describe", [&] {
    ToProto(core_->config().model, resp->mutable_layout());
    resp->set_epoch(core_->epoch());
    resp->set_backend(core_->backend_name());
    resp->set_tile_tokens(static_cast<uint32_t>(core_->preset().tile_tokens));
    resp->set_record_bytes(core_->layout().record_bytes);
    resp->set_capacity_bytes(core_->config().capacity_bytes);
    resp->set_version(KVARN_VERSION);
    resp->set_tenants_authenticated(core_->tenants_configured());
    resp->set_max_message_bytes(options_.max_inline_bytes);
    resp->set_read_tokens_per_call(core_->config().max_read_tokens);
    return grpc::Status::OK;
  });
}

grpc::Status KvService::OpenSession(grpc::ServerContext* ctx, const v1::OpenSessionRequest* req,
                                    v1::OpenSessionResponse* resp) {
  return Timed("OpenSession", [&] {
    if (req->fp16_layout() != v1::FP16_LAYOUT_TOKEN_MAJOR) {
      const std::string why = absl::StrCat(
          "this kvarnd's fp16 blocks (sink blocks, tail slots) are token-major "
          "(FP16_LAYOUT_TOKEN_MAJOR); the client declared ",
          Fp16LayoutName(req->fp16_layout()),
          " (a client library from before 2026-12-04 declares nothing): upgrade the client");
      Log(LogLevel::kWarning, "session_refused",
          {{"tenant", req->tenant()}, {"peer", ctx->peer()}, {"reason", why}});
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, why);
    }
    OpenParams p;
    p.tenant = req->tenant();
    p.tenant_token = req->tenant_token();
    p.layout = FromProto(req->layout());
    p.max_sequences = req->max_sequences();
    p.admin_token = req->admin_token();
    p.client_name = req->client_name();
    p.observer = req->observer();
    auto r = core_->OpenSession(p);
    if (!r.ok()) {
      Log(LogLevel::kWarning, "session_refused", {{"tenant", p.tenant}, {"peer", ctx->peer()}, {"reason", r.status().ToString()}});
      return ToGrpc(r.status());
    }
    resp->set_session_id(r->session);
    resp->set_session_secret(std::string(r->secret.begin(), r->secret.end()));
    ToProto(r->pool, core_->config().model, resp->mutable_pool());
    resp->set_keepalive_interval_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(core_->config().keepalive_interval)));
    resp->set_lease_ttl_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(core_->config().lease_ttl)));
    resp->set_grace_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(core_->config().grace)));
    resp->set_read_tokens_per_call(core_->config().max_read_tokens);
    resp->set_prefix_namespace(std::string(r->prefix_namespace.begin(), r->prefix_namespace.end()));
    Log(LogLevel::kInfo, "session_open", {{"session", r->session}, {"tenant", p.tenant}, {"client", p.client_name},
                                          {"client_pid", req->client_pid()}, {"tail_slots", r->pool.tail_slots}});
    return grpc::Status::OK;
  });
}

grpc::Status KvService::CloseSession(grpc::ServerContext*, const v1::CloseSessionRequest* req,
                                     v1::CloseSessionResponse* resp) {
  return Timed("CloseSession", [&] {
    auto r = core_->CloseSession(FromProto(req->session()));
    if (!r.ok()) return ToGrpc(r.status());
    resp->set_released_sequences(*r);
    Log(LogLevel::kInfo, "session_close", {{"session", req->session().session_id()}, {"released", *r}});
    return grpc::Status::OK;
  });
}

grpc::Status KvService::CreateSequence(grpc::ServerContext*, const v1::CreateSequenceRequest* req,
                                       v1::CreateSequenceResponse* resp) {
  return Timed("CreateSequence", [&] {
    auto r = core_->CreateSequence(FromProto(req->session()), Ids(req->prompt_tokens()));
    if (!r.ok()) return ToGrpc(r.status());
    resp->set_sequence_id(r->sequence);
    resp->set_cached_tokens(r->cached_tokens);
    ToProto(r->table, resp->mutable_table());
    return grpc::Status::OK;
  });
}

grpc::Status KvService::Append(grpc::ServerContext*, const v1::AppendRequest* req, v1::AppendResponse* resp) {
  return Timed("Append", [&] {
    auto r = core_->Append(FromProto(req->session()), req->sequence_id(), Ids(req->token_ids()));
    if (!r.ok()) return ToGrpc(r.status());
    FillAppend(*r, resp);
    return grpc::Status::OK;
  });
}

grpc::Status KvService::AppendBatch(grpc::ServerContext*, const v1::AppendBatchRequest* req,
                                    v1::AppendBatchResponse* resp) {
  return Timed("AppendBatch", [&] {
    if (static_cast<uint32_t>(req->items_size()) > options_.max_batch) {
      return Invalid(absl::StrCat("batch of ", req->items_size(), " items exceeds ", options_.max_batch));
    }
    std::vector<std::pair<SequenceId, std::span<const uint32_t>>> items;
    items.reserve(static_cast<size_t>(req->items_size()));
    for (const v1::AppendRequest& item : req->items()) items.emplace_back(item.sequence_id(), Ids(item.token_ids()));
    const auto results = core_->AppendBatch(FromProto(req->session()), items);
    if (!results.ok()) return ToGrpc(results.status());
    for (const auto& r : *results) {
      auto* out = resp->add_items();
      out->set_code(static_cast<int>(r.status().code()));
      if (!r.ok()) {
        out->set_message(std::string(r.status().message()));
        continue;
      }
      FillAppend(*r, out->mutable_result());
    }
    return grpc::Status::OK;
  });
}

grpc::Status KvService::AppendInline(grpc::ServerContext*, const v1::AppendInlineRequest* req,
                                     v1::AppendResponse* resp) {
  return Timed("AppendInline", [&] {
    const BlockLayout& l = core_->layout();
    size_t elem = 0;
    DType dtype = DType::kF16;
    if (req->dtype() == v1::AppendInlineRequest::DTYPE_F16) {
      elem = 2;
    } else if (req->dtype() == v1::AppendInlineRequest::DTYPE_F32) {
      elem = 4;
      dtype = DType::kF32;
    } else {
      return Invalid("dtype must be DTYPE_F16 or DTYPE_F32");
    }
    const size_t n = static_cast<size_t>(req->token_ids_size());
    const size_t want = n * l.slots() * static_cast<size_t>(l.head_dim) * elem;
    if (req->keys().size() + req->values().size() > options_.max_inline_bytes) {
      return Invalid(absl::StrCat("inline K/V of ", req->keys().size() + req->values().size(), " bytes exceeds ", options_.max_inline_bytes));
    }
    if (req->keys().size() != want || req->values().size() != want) {
      return Invalid(absl::StrCat("keys and values must be ", want, " bytes each for ", n, " tokens of ", l.num_layers, " layers x ",
                                  l.num_kv_heads, " kv-heads x ", l.head_dim, " channels; got ", req->keys().size(), " and ",
                                  req->values().size()));
    }
    if (n == 0) return Invalid("append of 0 tokens");
    // The codec reads elements of `elem` bytes: protobuf's strings are heap blocks and in
    // practice aligned, but nothing guarantees it; only a misaligned one is copied.
    std::vector<uint32_t> k_copy, v_copy;
    const auto aligned = [&](const std::string& bytes, std::vector<uint32_t>* copy) -> const void* {
      if (reinterpret_cast<uintptr_t>(bytes.data()) % elem == 0) return bytes.data();
      copy->resize((want + 3) / 4);
      std::memcpy(copy->data(), bytes.data(), want);
      return copy->data();
    };
    const void* keys = aligned(req->keys(), &k_copy);
    const void* values = aligned(req->values(), &v_copy);
    auto r = core_->AppendInline(FromProto(req->session()), req->sequence_id(), Ids(req->token_ids()), keys, values, dtype);
    if (!r.ok()) return ToGrpc(r.status());
    FillAppend(*r, resp);
    return grpc::Status::OK;
  });
}

grpc::Status KvService::Fork(grpc::ServerContext*, const v1::ForkRequest* req, v1::ForkResponse* resp) {
  return Timed("Fork", [&] {
    auto r = core_->Fork(FromProto(req->session()), req->sequence_id());
    if (!r.ok()) return ToGrpc(r.status());
    resp->set_sequence_id(r->sequence);
    ToProto(r->table, resp->mutable_table());
    return grpc::Status::OK;
  });
}

grpc::Status KvService::Release(grpc::ServerContext*, const v1::ReleaseRequest* req, v1::ReleaseResponse* resp) {
  return Timed("Release", [&] {
    std::vector<SequenceId> ids(req->sequence_ids().begin(), req->sequence_ids().end());
    auto r = core_->Release(FromProto(req->session()), ids);
    if (!r.ok()) return ToGrpc(r.status());
    resp->set_released(*r);
    return grpc::Status::OK;
  });
}

grpc::Status KvService::Lookup(grpc::ServerContext*, const v1::LookupRequest* req, v1::LookupResponse* resp) {
  return Timed("Lookup", [&] {
    auto r = core_->Lookup(FromProto(req->session()), Ids(req->prompt_tokens()), req->prefetch());
    if (!r.ok()) return ToGrpc(r.status());
    resp->set_cached_tokens(r->total_tokens());
    resp->set_pool_tokens(r->pool_tokens);
    for (const auto& [tier, tokens] : r->tier_tokens) {
      v1::LookupResponse::TierTokens* t = resp->add_tiers();
      t->set_tier(tier);
      t->set_tokens(tokens);
    }
    return grpc::Status::OK;
  });
}

grpc::Status KvService::Read(grpc::ServerContext*, const v1::ReadRequest* req, v1::ReadResponse* resp) {
  return Timed("Read", [&] {
    const BlockLayout& l = core_->layout();
    if (req->count() == 0 || req->count() > core_->config().max_read_tokens) {
      return Invalid(absl::StrCat("count must be in 1..", core_->config().max_read_tokens));
    }
    const size_t n = static_cast<size_t>(req->count()) * l.num_kv_heads * l.head_dim;
    resp->mutable_keys()->Resize(static_cast<int>(n), 0.0f);
    resp->mutable_values()->Resize(static_cast<int>(n), 0.0f);
    absl::Status s = core_->Read(FromProto(req->session()), req->sequence_id(), req->layer(), req->start(), req->count(),
                                 resp->mutable_keys()->mutable_data(), resp->mutable_values()->mutable_data());
    if (!s.ok()) {
      resp->Clear();
      return ToGrpc(s);
    }
    return grpc::Status::OK;
  });
}

grpc::Status KvService::Evict(grpc::ServerContext*, const v1::EvictRequest* req, v1::EvictResponse* resp) {
  return Timed("Evict", [&] {
    EvictScope scope;
    switch (req->scope()) {
      case v1::EvictRequest::SCOPE_TENANT: scope = EvictScope::kTenant; break;
      case v1::EvictRequest::SCOPE_BYTES: scope = EvictScope::kBytes; break;
      case v1::EvictRequest::SCOPE_ALL: scope = EvictScope::kAll; break;
      default: return Invalid("scope must be SCOPE_TENANT, SCOPE_BYTES or SCOPE_ALL");
    }
    if (scope == EvictScope::kBytes && req->bytes() == 0) return Invalid("SCOPE_BYTES needs bytes > 0");
    auto r = core_->Evict(FromProto(req->session()), scope, req->bytes(), req->tenant());
    if (!r.ok()) return ToGrpc(r.status());
    resp->set_blocks(r->blocks);
    resp->set_bytes(r->bytes);
    Log(LogLevel::kInfo, "evict_request", {{"session", req->session().session_id()}, {"blocks", r->blocks}, {"bytes", r->bytes}});
    return grpc::Status::OK;
  });
}

grpc::Status KvService::Stats(grpc::ServerContext*, const v1::StatsRequest* req, v1::StatsResponse* resp) {
  return Timed("Stats", [&] {
    auto r = core_->Stats(FromProto(req->session()));
    if (!r.ok()) return ToGrpc(r.status());
    ToProto(*r, core_->preset().Name(), resp);
    return grpc::Status::OK;
  });
}

grpc::Status KvService::ListSequences(grpc::ServerContext*, const v1::ListSequencesRequest* req,
                                      v1::ListSequencesResponse* resp) {
  return Timed("ListSequences", [&] {
    auto r = core_->ListSequences(FromProto(req->session()));
    if (!r.ok()) return ToGrpc(r.status());
    for (const SequenceStats& q : *r) {
      auto* o = resp->add_sequences();
      o->set_sequence_id(q.id);
      o->set_session_id(q.session);
      o->set_tenant(q.tenant);
      o->set_tokens(q.tokens);
      o->set_quant_blocks(q.quant_blocks);
      o->set_has_sink(q.has_sink);
      o->set_tail_tokens(q.tail_tokens);
    }
    return grpc::Status::OK;
  });
}

grpc::ServerWriteReactor<v1::BlockEvent>* KvService::Watch(grpc::CallbackServerContext*, const v1::WatchRequest* req) {
  return watch_.Open(FromProto(req->session()));
}

}  // namespace kvarn
