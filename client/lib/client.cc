#include "client/lib/client.h"

#include <grpcpp/create_channel.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/lib/cuda_pool.h"
#include "client/lib/descriptor_client.h"
#include "common/codec_status.h"
#include "common/commit_ring.h"
#include "proto/fp16_layout_name.h"

namespace kvarn {
namespace {

SequenceTable FromProto(const v1::BlockTable& t) {
  SequenceTable s;
  s.tokens = t.tokens();
  s.has_sink = t.has_sink();
  s.sink_block = t.sink_block();
  s.quant_blocks.assign(t.quant_blocks().begin(), t.quant_blocks().end());
  s.tail_slot = t.tail_slot();
  s.tail_tokens = t.tail_tokens();
  return s;
}

template <typename T>
void SetIds(std::span<const T> ids, google::protobuf::RepeatedField<T>* out) {
  out->Reserve(static_cast<int>(ids.size()));
  for (T t : ids) out->Add(t);
}

// now + d for a gRPC deadline, saturated: a duration too long for the clock (an infinite one
// included) is no deadline at all (gRPC reads time_point::max() as infinite).
std::chrono::system_clock::time_point DeadlineAfter(absl::Duration d) {
  if (d >= absl::Hours(24 * 365 * 100)) return std::chrono::system_clock::time_point::max();
  return std::chrono::system_clock::now() +
         absl::ToChronoMilliseconds(std::max(d, absl::ZeroDuration()));
}

}  // namespace

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(static_cast<int>(s.error_code())), s.error_message());
}

Client::Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options, std::string socket_path)
    : channel_(std::move(channel)), stub_(v1::KvCache::NewStub(channel_)), options_(std::move(options)),
      socket_path_(std::move(socket_path)) {}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& target, ClientOptions options,
                                                        absl::Duration connect_timeout) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  // HTTP/2 pings find a dead daemon even while no call is in flight.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // A Client is its own connection. gRPC otherwise shares one connection among all channels
  // of the process with the same target, and between calls nobody polls it: after a daemon
  // restart on the same socket, a new Client would be handed the dead daemon's connection
  // as ready and fail its first call with "Broken pipe".
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // "unix:/path" and "unix:///path" name a local daemon; its descriptor channel is beside it.
  std::string socket_path;
  if (absl::StartsWith(target, "unix://")) {
    socket_path = target.substr(7);
  } else if (absl::StartsWith(target, "unix:")) {
    socket_path = target.substr(5);
  }
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (options.tls) {
    if (!socket_path.empty()) return absl::InvalidArgumentError("TLS is for TCP targets; a Unix socket is local");
    grpc::SslCredentialsOptions tls;
    tls.pem_root_certs = options.tls_root_certs;
    tls.pem_cert_chain = options.tls_cert_chain;
    tls.pem_private_key = options.tls_private_key;
    creds = grpc::SslCredentials(tls);
    if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  }
  auto channel = grpc::CreateCustomChannel(target, creds, args);
  if (!channel->WaitForConnected(DeadlineAfter(connect_timeout))) {
    return absl::UnavailableError(absl::StrCat("kvarnd is not reachable at ", target, options.tls ? " (over TLS)" : ""));
  }
  return std::unique_ptr<Client>(new Client(std::move(channel), options, std::move(socket_path)));
}

absl::StatusOr<std::unique_ptr<Session>> Client::OpenSession(const SessionOptions& o) {
  Preset preset;
  if (CodecStatus s = ParsePreset(o.layout.preset, &preset); !s.ok()) {
    return absl::InvalidArgumentError(s.message());
  }
  v1::OpenSessionRequest req;
  req.set_tenant(o.tenant);
  req.set_tenant_token(o.tenant_token);
  v1::ModelLayout* l = req.mutable_layout();
  l->set_model_id(o.layout.model_id);
  l->set_num_layers(o.layout.num_layers);
  l->set_num_kv_heads(o.layout.num_kv_heads);
  l->set_head_dim(o.layout.head_dim);
  l->set_preset(o.layout.preset);
  l->set_sink_tokens(o.layout.sink_tokens);
  req.set_max_sequences(o.max_sequences);
  req.set_admin_token(o.admin_token);
  req.set_client_name(o.client_name);
  req.set_client_pid(static_cast<int32_t>(getpid()));  // for the daemon's logs
  req.set_observer(o.observer);
  req.set_fp16_layout(v1::FP16_LAYOUT_TOKEN_MAJOR);
  v1::OpenSessionResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineAfter(options_.rpc_timeout));
  if (grpc::Status s = stub_->OpenSession(&ctx, req, &resp); !s.ok()) return FromGrpc(s);
  if (resp.pool().fp16_layout() != v1::FP16_LAYOUT_TOKEN_MAJOR) {
    // A kvarnd from before the field: its fp16 blocks are laid out otherwise. Hand the session
    // back rather than misread them.
    v1::CloseSessionRequest close;
    close.mutable_session()->set_session_id(resp.session_id());
    close.mutable_session()->set_secret(resp.session_secret());
    close.mutable_session()->set_epoch(resp.pool().epoch());
    v1::CloseSessionResponse closed;
    grpc::ClientContext close_ctx;
    close_ctx.set_deadline(DeadlineAfter(options_.rpc_timeout));
    (void)stub_->CloseSession(&close_ctx, close, &closed);
    return absl::FailedPreconditionError(
        absl::StrCat("kvarnd's fp16 blocks are ", Fp16LayoutName(resp.pool().fp16_layout()),
                     " (a kvarnd from before 2026-12-04 says FP16_LAYOUT_UNSPECIFIED); this client "
                     "reads and writes "
                     "FP16_LAYOUT_TOKEN_MAJOR: upgrade kvarnd"));
  }
  std::unique_ptr<Session> session(new Session(this, resp, preset));
  if (absl::Status m = session->MapPool(); !m.ok()) return m;
  session->keepalive_ = std::thread([p = session.get()] { p->KeepAliveLoop(); });
  return session;
}

absl::StatusOr<v1::DescribeResponse> Client::Describe() {
  v1::DescribeRequest req;
  v1::DescribeResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineAfter(options_.rpc_timeout));
  if (grpc::Status s = stub_->Describe(&ctx, req, &resp); !s.ok()) return FromGrpc(s);
  return resp;
}

Layout Client::LayoutOf(const v1::DescribeResponse& d) {
  Layout l;
  l.model_id = d.layout().model_id();
  l.num_layers = d.layout().num_layers();
  l.num_kv_heads = d.layout().num_kv_heads();
  l.head_dim = d.layout().head_dim();
  l.preset = d.layout().preset();
  l.sink_tokens = d.layout().sink_tokens();
  return l;
}

Session::Session(Client* client, const v1::OpenSessionResponse& open, const Preset& preset)
    : client_(client), id_(open.session_id()), epoch_(open.pool().epoch()), secret_(open.session_secret()),
      pool_(open.pool()), prefix_namespace_(open.prefix_namespace()), read_tokens_per_call_(open.read_tokens_per_call()), preset_(preset),
      keepalive_interval_(absl::Milliseconds(open.keepalive_interval_ms())) {
  layout_.num_layers = static_cast<int>(pool_.layout().num_layers());
  layout_.num_kv_heads = static_cast<int>(pool_.layout().num_kv_heads());
  layout_.head_dim = static_cast<int>(pool_.layout().head_dim());
  layout_.tile_tokens = static_cast<int>(pool_.tile_tokens());
  layout_.record_bytes = pool_.record_bytes();
}

absl::Status Session::MapPool() {
  if (pool_.backend() != v1::PoolDescription::BACKEND_HOST && pool_.backend() != v1::PoolDescription::BACKEND_CUDA) {
    return absl::InvalidArgumentError(absl::StrCat("unknown pool backend ", static_cast<int>(pool_.backend())));
  }
  // A remote client (TCP) has no shared memory; nor does one that asked for none.
  if (client_->socket_path().empty() || !client_->options().map_pool) return absl::OkStatus();
  if (pool_.quant_segments_size() != 1) return absl::FailedPreconditionError("expected one quantized segment");
  auto lent = FetchSessionMemory(client_->socket_path() + ".fd", Ref());
  if (!lent.ok()) return lent.status();
  const v1::DescriptorReply::Entry* quant = nullptr;
  const v1::DescriptorReply::Entry* sink = nullptr;
  const v1::DescriptorReply::Entry* tail = nullptr;
  UniqueFd quant_fd, sink_fd, tail_fd;
  for (LentSegments::Segment& seg : lent->segments) {
    switch (seg.entry.kind()) {
      case v1::DescriptorReply::Entry::KIND_QUANT: quant = &seg.entry; quant_fd = std::move(seg.fd); break;
      case v1::DescriptorReply::Entry::KIND_SINK: sink = &seg.entry; sink_fd = std::move(seg.fd); break;
      case v1::DescriptorReply::Entry::KIND_TAIL: tail = &seg.entry; tail_fd = std::move(seg.fd); break;
      default: return absl::InternalError("kvarnd lent a segment of unknown kind");
    }
  }
  if (quant == nullptr || (pool_.sink_segments_size() == 1) != (sink != nullptr) || (pool_.tail_slots() > 0) != (tail != nullptr)) {
    return absl::InternalError("kvarnd's descriptor reply does not match the pool it described");
  }
  if (pool_.backend() == v1::PoolDescription::BACKEND_CUDA) {
#if KVARN_CLIENT_CUDA
    // The IPC handles came on the authenticated channel; the device pool reads them from the
    // description.
    const auto fill = [](const v1::DescriptorReply::Entry* e, v1::Segment* seg) {
      seg->set_cuda_ipc_handle(e->cuda_ipc_handle());
      seg->set_cuda_device(e->cuda_device());
      seg->set_device_pointer(e->device_pointer());
    };
    fill(quant, pool_.mutable_quant_segments(0));
    if (sink != nullptr) fill(sink, pool_.mutable_sink_segments(0));
    if (tail != nullptr) fill(tail, pool_.mutable_tail_segment());
    auto d = OpenDevicePool(pool_, preset_, layout_);
    if (!d.ok()) return d.status();
    device_ = std::move(*d);
    mapped_ = true;
    return absl::OkStatus();
#else
    return absl::FailedPreconditionError("the pool is in GPU memory (kvarnd --backend=cuda) and this client library "
                                         "was built without CUDA");
#endif
  }
  auto q = FdMapping::Map(std::move(quant_fd), pool_.quant_segments(0).bytes(), /*writable=*/false);
  if (!q.ok()) return q.status();
  quant_ = std::move(*q);
  if (sink != nullptr) {
    auto m = FdMapping::Map(std::move(sink_fd), pool_.sink_segments(0).bytes(), false);
    if (!m.ok()) return m.status();
    sink_ = std::move(*m);
  }
  if (tail != nullptr) {
    auto t = FdMapping::Map(std::move(tail_fd), pool_.tail_segment().bytes(), /*writable=*/true);
    if (!t.ok()) return t.status();
    tail_ = std::move(*t);
  }
  mapped_ = true;
  return absl::OkStatus();
}

absl::StatusOr<Session::MemoryUse> Session::Resident() const {
  if (absl::Status m = CheckMapped(); !m.ok()) return m;
  if (device_ != nullptr) return absl::FailedPreconditionError("device memory has no page accounting");
  return MemoryUse{quant_.AllocatedBytes(), sink_.AllocatedBytes(), tail_.AllocatedBytes()};
}

absl::Status Session::CheckMapped() const {
  if (mapped_) return absl::OkStatus();
  return absl::FailedPreconditionError("this session has no shared memory (a TCP client, or map_pool=false): use "
                                       "AppendInline and Read");
}

Session::~Session() {
  stop_.store(true);
  {
    MutexLock lock(&mu_);
    if (keepalive_ctx_) keepalive_ctx_->TryCancel();
  }
  if (keepalive_.joinable()) keepalive_.join();
  if (alive_.load()) {
    v1::CloseSessionRequest req;
    *req.mutable_session() = Ref();
    v1::CloseSessionResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    client_->stub().CloseSession(&ctx, req, &resp);
  }
}

void Session::KeepAliveLoop() {
  while (!stop_.load() && alive_.load()) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    {
      MutexLock lock(&mu_);
      if (stop_.load()) return;
      keepalive_ctx_ = std::move(ctx);
    }
    grpc::ClientContext* c = keepalive_ctx_.get();
    auto stream = client_->stub().KeepAlive(c);
    v1::KeepAliveRequest req;
    *req.mutable_session() = Ref();
    v1::KeepAliveResponse resp;
    while (!stop_.load() && stream->Write(req) && stream->Read(&resp)) {
      if (resp.epoch() != epoch_) break;
      // Sleep one interval, waking early to stop.
      const absl::Time until = absl::Now() + keepalive_interval_;
      while (!stop_.load() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(20));
    }
    stream->WritesDone();
    const grpc::Status s = stream->Finish();
    if (stop_.load()) return;
    // The daemon no longer knows the session (expired, closed, restarted): the lease is gone.
    if (s.error_code() == grpc::StatusCode::NOT_FOUND || s.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
        (resp.epoch() != 0 && resp.epoch() != epoch_)) {
      alive_.store(false);
      return;
    }
    absl::SleepFor(absl::Milliseconds(100));  // transient: reconnect within the grace period
  }
}

v1::SessionRef Session::Ref() const {
  v1::SessionRef r;
  r.set_session_id(id_);
  r.set_epoch(epoch_);
  r.set_secret(secret_);
  return r;
}

grpc::ClientContext* Session::Prepare(grpc::ClientContext* ctx) const {
  ctx->set_deadline(DeadlineAfter(client_->options().rpc_timeout));
  return ctx;
}

absl::Status Session::Check(const grpc::Status& s) {
  if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION && s.error_message().find("epoch") != std::string::npos) {
    alive_.store(false);
  }
  return FromGrpc(s);
}

SequenceTable Session::Remember(uint64_t seq, const v1::BlockTable& table) {
  MutexLock lock(&mu_);
  return RememberLocked(seq, table);
}

SequenceTable Session::RememberLocked(uint64_t seq, const v1::BlockTable& table) {
  SeqState& st = seqs_[seq];
  if (table.blocks_omitted()) {
    // The daemon left out the block ids: unchanged since the table we hold.
    BlockIds blocks = std::move(st.table.quant_blocks);
    st.table = FromProto(table);
    st.table.quant_blocks = std::move(blocks);
  } else {
    st.table = FromProto(table);
  }
  st.staged = 0;
  return st.table;
}

absl::Status Session::CheckIdle(uint64_t seq, const SeqState& st) {
  if (st.outcome_unknown) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence ", seq,
                     "'s last ring commit has an unknown outcome (the ring failed before kvarnd "
                     "answered it): its table may be stale; Release it"));
  }
  if (st.in_ring) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sequence ", seq, " has a ring commit in flight: CommitRing::Collect it first"));
  }
  if (!st.claimed) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "sequence ", seq, " has a call staging or committing it in flight (on another thread)"));
}

absl::Status Session::Claim(uint64_t seq) {
  MutexLock lock(&mu_);
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrCat("no sequence ", seq, " in this session"));
  }
  if (absl::Status f = CheckIdle(seq, it->second); !f.ok()) return f;
  it->second.claimed = true;
  return absl::OkStatus();
}

void Session::Unclaim(uint64_t seq) {
  MutexLock lock(&mu_);
  if (auto it = seqs_.find(seq); it != seqs_.end()) it->second.claimed = false;
}

void Session::EndRingFlight(std::span<const uint64_t> seqs, bool unknown) {
  MutexLock lock(&mu_);
  for (uint64_t q : seqs) EndRingFlightLocked(q, unknown);
}

void Session::EndRingFlightLocked(uint64_t seq, bool unknown) {
  if (auto it = seqs_.find(seq); it != seqs_.end()) {
    it->second.in_ring = false;
    it->second.outcome_unknown = it->second.outcome_unknown || unknown;
  }
}

absl::StatusOr<SequenceTable> Session::RememberCommitLocked(uint64_t seq,
                                                            const ring::Completion& c) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence ", seq, " was released while its ring commit was in flight"));
  }
  SeqState& st = it->second;
  st.in_ring = false;
  SequenceTable& t = st.table;
  if (c.sealed != 0) {
    if (c.quant_blocks == t.quant_blocks.size() + 1) {
      t.quant_blocks.push_back(c.last_quant);
    } else if (c.quant_blocks != t.quant_blocks.size() || c.has_sink == 0) {
      // Applied by kvarnd, but the table held cannot take it: stale from here on.
      st.outcome_unknown = true;
      return absl::InternalError("kvarnd's ring completion does not follow the sequence's table");
    }
  }
  t.tokens = c.tokens;
  t.has_sink = c.has_sink != 0;
  t.sink_block = c.sink_block;
  t.tail_slot = c.tail_slot;
  t.tail_tokens = c.tail_tokens;
  st.staged = 0;
  return t;
}

absl::StatusOr<SequenceInfo> Session::CreateSequence(std::span<const uint32_t> prompt) {
  v1::CreateSequenceRequest req;
  *req.mutable_session() = Ref();
  SetIds(prompt, req.mutable_prompt_tokens());
  v1::CreateSequenceResponse resp;
  grpc::ClientContext ctx;
  if (absl::Status s = Check(client_->stub().CreateSequence(Prepare(&ctx), req, &resp)); !s.ok()) return s;
  Remember(resp.sequence_id(), resp.table());
  return SequenceInfo{resp.sequence_id(), resp.cached_tokens(), FromProto(resp.table())};
}

absl::StatusOr<uint64_t> Session::Lookup(std::span<const uint32_t> prompt) {
  auto r = LookupTiers(prompt);
  if (!r.ok()) return r.status();
  return r->cached_tokens();
}

absl::StatusOr<v1::LookupResponse> Session::LookupTiers(std::span<const uint32_t> prompt, bool prefetch) {
  v1::LookupRequest req;
  *req.mutable_session() = Ref();
  SetIds(prompt, req.mutable_prompt_tokens());
  req.set_prefetch(prefetch);
  v1::LookupResponse resp;
  grpc::ClientContext ctx;
  if (absl::Status s = Check(client_->stub().Lookup(Prepare(&ctx), req, &resp)); !s.ok()) return s;
  return resp;
}

absl::Status Session::Stage(uint64_t seq, int n, const void* keys, const void* values, DType dtype) {
  if (absl::Status m = CheckMapped(); !m.ok()) return m;
  if (absl::Status c = Claim(seq); !c.ok()) return c;
  absl::Cleanup unclaim = [this, seq] { Unclaim(seq); };
  return StageClaimed(seq, n, keys, values, dtype, /*device_input=*/false, nullptr);
}

absl::Status Session::StageDevice(uint64_t seq, int n, const void* keys, const void* values,
                                  DType dtype, CUstream_st* stream) {
  if (device_ == nullptr) {
    return absl::FailedPreconditionError("StageDevice needs a pool in GPU memory");
  }
  if (absl::Status c = Claim(seq); !c.ok()) return c;
  absl::Cleanup unclaim = [this, seq] { Unclaim(seq); };
  return StageClaimed(seq, n, keys, values, dtype, /*device_input=*/true, stream);
}

absl::Status Session::StageClaimed(uint64_t seq, int n, const void* keys, const void* values,
                                   DType dtype, bool device_input, CUstream_st* stream) {
  uint8_t* slot;
  int first;
  {
    MutexLock lock(&mu_);
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) {
      return absl::NotFoundError(absl::StrCat("no sequence ", seq, " in this session"));
    }
    slot = TailBase() + static_cast<size_t>(it->second.table.tail_slot) * layout_.fp16_block_bytes();
    first = static_cast<int>(it->second.table.tail_tokens) + it->second.staged;
  }
  if (device_ != nullptr) {
    const absl::Status d =
        device_->Store(slot, first, n, keys, values, dtype, device_input, stream);
    if (!d.ok()) return d;
  } else {
    const CodecStatus s = Codec::Default().StoreTokens(preset_, layout_, slot, first, n, keys, values, dtype);
    if (!s.ok()) return absl::InvalidArgumentError(s.message());
  }
  MutexLock lock(&mu_);
  seqs_[seq].staged += n;
  return absl::OkStatus();
}

absl::Status Session::MarkStaged(uint64_t seq, int n) {
  if (absl::Status m = CheckMapped(); !m.ok()) return m;
  MutexLock lock(&mu_);
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("no sequence ", seq, " in this session"));
  if (absl::Status f = CheckIdle(seq, it->second); !f.ok()) return f;
  const int first = static_cast<int>(it->second.table.tail_tokens) + it->second.staged;
  if (n < 1 || first + n > layout_.tile_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("tokens [", first, ", ", first + n, ") do not fit a ",
                                                   layout_.tile_tokens, "-token slot"));
  }
  it->second.staged += n;
  return absl::OkStatus();
}

absl::StatusOr<AppendInfo> Session::Commit(uint64_t seq, std::span<const uint32_t> ids) {
  if (absl::Status c = Claim(seq); !c.ok()) return c;
  absl::Cleanup unclaim = [this, seq] { Unclaim(seq); };
  return CommitClaimed(seq, ids);
}

absl::StatusOr<AppendInfo> Session::CommitClaimed(uint64_t seq, std::span<const uint32_t> ids) {
  {
    MutexLock lock(&mu_);
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) {
      return absl::NotFoundError(absl::StrCat("no sequence ", seq, " in this session"));
    }
    if (static_cast<int>(ids.size()) != it->second.staged) {
      return absl::InvalidArgumentError(absl::StrCat(ids.size(), " token ids for ", it->second.staged, " staged tokens"));
    }
  }
  v1::AppendRequest req;
  *req.mutable_session() = Ref();
  req.set_sequence_id(seq);
  SetIds(ids, req.mutable_token_ids());
  v1::AppendResponse resp;
  grpc::ClientContext ctx;
  if (absl::Status s = Check(client_->stub().Append(Prepare(&ctx), req, &resp)); !s.ok()) return s;
  return AppendInfo{Remember(seq, resp.table()), resp.sealed()};
}

absl::StatusOr<AppendInfo> Session::Commit(uint64_t seq, std::span<const uint32_t> ids, CUevent_st* ready) {
  if (ready != nullptr) {
    if (device_ == nullptr) return absl::FailedPreconditionError("a CUDA event needs a pool in GPU memory");
    if (absl::Status s = device_->WaitForEvent(ready); !s.ok()) return s;
  }
  return Commit(seq, ids);
}

absl::StatusOr<AppendInfo> Session::Append(uint64_t seq, std::span<const uint32_t> ids, const void* keys,
                                           const void* values, DType dtype) {
  if (absl::Status m = CheckMapped(); !m.ok()) return m;
  // One claim for both: no other thread's Stage or Commit comes between them.
  if (absl::Status c = Claim(seq); !c.ok()) return c;
  absl::Cleanup unclaim = [this, seq] { Unclaim(seq); };
  if (absl::Status s = StageClaimed(seq, static_cast<int>(ids.size()), keys, values, dtype,
                                    /*device_input=*/false, nullptr);
      !s.ok()) {
    return s;
  }
  return CommitClaimed(seq, ids);
}

absl::StatusOr<std::vector<absl::StatusOr<AppendInfo>>> Session::CommitBatch(
    const std::vector<std::pair<uint64_t, std::vector<uint32_t>>>& items) {
  // Every entry of `out` is set below: a refused item's error here, a sent one's from the answer.
  std::vector<absl::StatusOr<AppendInfo>> out(items.size());
  std::vector<size_t> sent;  // items in the request, by their index in `items`
  sent.reserve(items.size());
  absl::flat_hash_set<uint64_t> claimed;  // for the call
  v1::AppendBatchRequest req;
  *req.mutable_session() = Ref();
  {
    MutexLock lock(&mu_);
    for (size_t i = 0; i < items.size(); ++i) {
      const auto& [seq, ids] = items[i];
      auto it = seqs_.find(seq);
      if (it == seqs_.end()) {
        out[i] = absl::NotFoundError(absl::StrCat("no sequence ", seq, " in this session"));
        continue;
      }
      // An item listed twice goes to kvarnd, which refuses the second (busy) with its message.
      const bool again = claimed.contains(seq);
      if (absl::Status f = again ? absl::OkStatus() : CheckIdle(seq, it->second); !f.ok()) {
        out[i] = f;
        continue;
      }
      if (static_cast<int>(ids.size()) != it->second.staged) {
        out[i] = absl::InvalidArgumentError(absl::StrCat(ids.size(), " token ids for ", it->second.staged, " staged tokens"));
        continue;
      }
      it->second.claimed = true;
      claimed.insert(seq);
      v1::AppendRequest* item = req.add_items();
      item->set_sequence_id(seq);
      SetIds(std::span<const uint32_t>(ids), item->mutable_token_ids());
      sent.push_back(i);
    }
  }
  if (sent.empty()) return out;
  v1::AppendBatchResponse resp;
  grpc::ClientContext ctx;
  absl::Status call = Check(client_->stub().AppendBatch(Prepare(&ctx), req, &resp));
  if (call.ok() && resp.items_size() != static_cast<int>(sent.size())) {
    call = absl::InternalError("kvarnd answered a different number of items");
  }
  MutexLock lock(&mu_);  // one lock for the batch's tables
  for (uint64_t seq : claimed) {
    if (auto it = seqs_.find(seq); it != seqs_.end()) it->second.claimed = false;
  }
  if (!call.ok()) return call;
  for (int k = 0; k < resp.items_size(); ++k) {
    const auto& it = resp.items(k);
    const size_t i = sent[static_cast<size_t>(k)];
    if (it.code() != 0) {
      out[i] = absl::Status(static_cast<absl::StatusCode>(it.code()), it.message());
      continue;
    }
    out[i] = AppendInfo{RememberLocked(items[i].first, it.result().table()), it.result().sealed()};
  }
  return out;
}

absl::Status Session::CheckIdleIfKnown(uint64_t seq) const {
  MutexLock lock(&mu_);
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? absl::OkStatus() : CheckIdle(seq, it->second);
}

absl::StatusOr<AppendInfo> Session::AppendInline(uint64_t seq, std::span<const uint32_t> ids, const void* keys,
                                                 const void* values, DType dtype) {
  // A ring commit in flight would land after these tokens, at a position nobody staged; the
  // claim keeps another thread's answer from being recorded after this one's. A sequence
  // this session does not know is kvarnd's to refuse.
  const absl::Status claim = Claim(seq);
  if (!claim.ok() && claim.code() != absl::StatusCode::kNotFound) return claim;
  absl::Cleanup unclaim = [&] {
    if (claim.ok()) Unclaim(seq);
  };
  v1::AppendInlineRequest req;
  *req.mutable_session() = Ref();
  req.set_sequence_id(seq);
  SetIds(ids, req.mutable_token_ids());
  const size_t bytes = ids.size() * layout_.slots() * layout_.head_dim * (dtype == DType::kF32 ? 4 : 2);
  req.set_keys(keys, bytes);
  req.set_values(values, bytes);
  req.set_dtype(dtype == DType::kF32 ? v1::AppendInlineRequest::DTYPE_F32 : v1::AppendInlineRequest::DTYPE_F16);
  v1::AppendResponse resp;
  grpc::ClientContext ctx;
  if (absl::Status s = Check(client_->stub().AppendInline(Prepare(&ctx), req, &resp)); !s.ok())
    return s;
  return AppendInfo{Remember(seq, resp.table()), resp.sealed()};
}

absl::StatusOr<SequenceInfo> Session::Fork(uint64_t seq) {
  // With a commit in flight the fork would take the sequence before or after it.
  if (absl::Status f = CheckIdleIfKnown(seq); !f.ok()) return f;
  v1::ForkRequest req;
  *req.mutable_session() = Ref();
  req.set_sequence_id(seq);
  v1::ForkResponse resp;
  grpc::ClientContext ctx;
  if (absl::Status s = Check(client_->stub().Fork(Prepare(&ctx), req, &resp)); !s.ok()) return s;
  Remember(resp.sequence_id(), resp.table());
  return SequenceInfo{resp.sequence_id(), 0, FromProto(resp.table())};
}

absl::Status Session::Release(std::span<const uint64_t> seqs) {
  v1::ReleaseRequest req;
  *req.mutable_session() = Ref();
  SetIds(seqs, req.mutable_sequence_ids());
  v1::ReleaseResponse resp;
  grpc::ClientContext ctx;
  if (absl::Status s = Check(client_->stub().Release(Prepare(&ctx), req, &resp)); !s.ok()) return s;
  MutexLock lock(&mu_);
  for (uint64_t q : seqs) seqs_.erase(q);
  return absl::OkStatus();
}

absl::StatusOr<SequenceTable> Session::Table(uint64_t seq) const {
  MutexLock lock(&mu_);
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("no sequence ", seq, " in this session"));
  return it->second.table;
}

absl::StatusOr<std::pair<uint8_t*, int>> Session::TailSlot(uint64_t seq) const {
  MutexLock lock(&mu_);
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("no sequence ", seq, " in this session"));
  if (absl::Status f = CheckIdle(seq, it->second); !f.ok()) return f;
  return std::make_pair(TailBase() + static_cast<size_t>(it->second.table.tail_slot) * layout_.fp16_block_bytes(),
                        static_cast<int>(it->second.table.tail_tokens) + it->second.staged);
}

absl::StatusOr<v1::StatsResponse> Session::Stats() {
  v1::StatsRequest req;
  *req.mutable_session() = Ref();
  v1::StatsResponse resp;
  grpc::ClientContext ctx;
  if (absl::Status s = Check(client_->stub().Stats(Prepare(&ctx), req, &resp)); !s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::ListSequencesResponse> Session::ListSequences() {
  v1::ListSequencesRequest req;
  *req.mutable_session() = Ref();
  v1::ListSequencesResponse resp;
  grpc::ClientContext ctx;
  if (absl::Status s = Check(client_->stub().ListSequences(Prepare(&ctx), req, &resp)); !s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::EvictResponse> Session::Evict(v1::EvictRequest::Scope scope, uint64_t bytes, const std::string& tenant) {
  v1::EvictRequest req;
  *req.mutable_session() = Ref();
  req.set_scope(scope);
  req.set_bytes(bytes);
  req.set_tenant(tenant);
  v1::EvictResponse resp;
  grpc::ClientContext ctx;
  if (absl::Status s = Check(client_->stub().Evict(Prepare(&ctx), req, &resp)); !s.ok()) return s;
  return resp;
}

absl::Status Session::Watch(const std::function<bool(const v1::BlockEvent&)>& on_event) {
  v1::WatchRequest req;
  *req.mutable_session() = Ref();
  grpc::ClientContext ctx;
  auto reader = client_->stub().Watch(&ctx, req);
  v1::BlockEvent e;
  while (reader->Read(&e)) {
    if (!on_event(e)) {
      ctx.TryCancel();
      break;
    }
  }
  const grpc::Status s = reader->Finish();
  if (s.error_code() == grpc::StatusCode::CANCELLED) return absl::OkStatus();
  return FromGrpc(s);
}

}  // namespace kvarn
