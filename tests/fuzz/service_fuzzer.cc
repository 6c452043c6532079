// libFuzzer over the service layer: arbitrary bytes as a request message of every unary RPC,
// through the real KvService handlers in-process (the same code the gRPC server calls), and
// as the text of a config file, a tenants file, and a descriptor-channel request.
//
// Input: byte 0 picks the target, byte 1 how the request names its session (as parsed, one of
// two live sessions, or a live one with a wrong secret) and sequence (as parsed, or a live
// one); the rest is the serialized request (or the text). The daemon must never crash, a
// rejected request must leave the core's invariants intact, and a request naming a live
// session with a wrong secret must be NOT_FOUND.
#include <fuzzer/FuzzedDataProvider.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/lib/descriptor_client.h"
#include "common/fd_passing.h"
#include "daemon/backends/host_memory.h"
#include "daemon/service/config.h"
#include "daemon/service/convert.h"
#include "daemon/service/descriptor_server.h"
#include "daemon/service/kv_service.h"
#include "daemon/service/log.h"
#include "google/protobuf/stubs/logging.h"

namespace kvarn {
namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "service_fuzzer: %s\n", what.c_str());
  std::abort();
}

class Harness {
 public:
  Harness() : backend_("fuzz") {
    google::protobuf::SetLogHandler(nullptr);  // invalid UTF-8 in string fields is routine here
    SetLogLevel(LogLevel::kError);
    CoreConfig c;
    c.model.model_id = "fuzz";
    c.model.num_layers = 2;
    c.model.num_kv_heads = 2;
    c.model.head_dim = 64;
    c.model.preset = "kvarn_k4v2_g64";
    c.model.sink_tokens = 64;
    c.capacity_bytes = 4 << 20;
    c.default_tail_slots = 4;
    c.admin_token = "admin";
    c.max_read_tokens = 512;
    model_ = c.model;
    auto core = KvCore::Create(c, &backend_, SystemClock::Get());
    if (!core.ok()) Fail(core.status().ToString());
    core_ = std::move(*core);
    KvService::Options o;
    o.max_inline_bytes = 1 << 20;
    service_ = std::make_unique<KvService>(core_.get(), o);
    char dir[] = "/tmp/kvfuzz.XXXXXX";
    if (mkdtemp(dir) == nullptr) Fail("mkdtemp");
    dir_ = dir;
    DescriptorServer::Options d;
    d.path = dir_ + "/k.sock.fd";
    auto ds = DescriptorServer::Start(core_.get(), d);
    if (!ds.ok()) Fail(ds.status().ToString());
    descriptors_ = std::move(*ds);
  }
  ~Harness() {
    descriptors_.reset();
    rmdir(dir_.c_str());
  }

  void Run(const uint8_t* data, size_t size) {
    if (size < 2) return;
    const uint8_t target = data[0], naming = data[1];
    const std::string body(reinterpret_cast<const char*>(data + 2), size - 2);
    EnsureSessions();
    bool forged = false;
    // Rewrites the request's session per `naming`; returns whether it is a live id with a wrong secret.
    const auto name = [&](v1::SessionRef* ref, uint64_t* seq) {
      const int who = naming & 3;
      if (who == 1 || who == 3) *ref = ToWire(refs_[0]);
      if (who == 2) *ref = ToWire(refs_[1]);
      if (who == 3) {
        std::string s = ref->secret();
        s[naming % 32] ^= 0x40;
        ref->set_secret(s);
        forged = true;
      }
      if (seq != nullptr && (naming & 4) != 0) *seq = seqs_[(naming >> 3) & 1];
    };
    grpc::ServerContext ctx;
    grpc::Status s;
    switch (target % 17) {
      case 0: {
        v1::DescribeRequest req;
        v1::DescribeResponse resp;
        req.ParseFromString(body);
        s = service_->Describe(&ctx, &req, &resp);
        if (!s.ok()) Fail("Describe failed");
        break;
      }
      case 1: {
        v1::OpenSessionRequest req;
        v1::OpenSessionResponse resp;
        req.ParseFromString(body);
        if (naming & 1) {
          ToProto(model_, req.mutable_layout());
          req.set_fp16_layout(v1::FP16_LAYOUT_TOKEN_MAJOR);
        }
        s = service_->OpenSession(&ctx, &req, &resp);
        if (s.ok()) {
          v1::CloseSessionRequest close;
          close.mutable_session()->set_session_id(resp.session_id());
          close.mutable_session()->set_epoch(resp.pool().epoch());
          close.mutable_session()->set_secret(resp.session_secret());
          v1::CloseSessionResponse cr;
          grpc::ServerContext c2;
          if (!service_->CloseSession(&c2, &close, &cr).ok()) Fail("cannot close a session just opened");
        }
        break;
      }
      case 2: {
        v1::CloseSessionRequest req;
        v1::CloseSessionResponse resp;
        req.ParseFromString(body);
        name(req.mutable_session(), nullptr);
        s = service_->CloseSession(&ctx, &req, &resp);
        break;
      }
      case 3: {
        v1::CreateSequenceRequest req;
        v1::CreateSequenceResponse resp;
        req.ParseFromString(body);
        name(req.mutable_session(), nullptr);
        s = service_->CreateSequence(&ctx, &req, &resp);
        if (s.ok()) Release(req.session(), resp.sequence_id());
        break;
      }
      case 4: {
        v1::AppendRequest req;
        v1::AppendResponse resp;
        req.ParseFromString(body);
        uint64_t seq = req.sequence_id();
        name(req.mutable_session(), &seq);
        req.set_sequence_id(seq);
        s = service_->Append(&ctx, &req, &resp);
        break;
      }
      case 5: {
        v1::AppendBatchRequest req;
        v1::AppendBatchResponse resp;
        req.ParseFromString(body);
        uint64_t seq = 0;
        name(req.mutable_session(), &seq);
        if (seq != 0) {
          for (auto& item : *req.mutable_items()) item.set_sequence_id(seq);
        }
        s = service_->AppendBatch(&ctx, &req, &resp);
        if (s.ok() && resp.items_size() != req.items_size()) Fail("AppendBatch answered a different number of items");
        break;
      }
      case 6: {
        v1::AppendInlineRequest req;
        v1::AppendResponse resp;
        req.ParseFromString(body);
        uint64_t seq = req.sequence_id();
        name(req.mutable_session(), &seq);
        req.set_sequence_id(seq);
        s = service_->AppendInline(&ctx, &req, &resp);
        break;
      }
      case 7: {
        v1::ForkRequest req;
        v1::ForkResponse resp;
        req.ParseFromString(body);
        uint64_t seq = req.sequence_id();
        name(req.mutable_session(), &seq);
        req.set_sequence_id(seq);
        s = service_->Fork(&ctx, &req, &resp);
        if (s.ok()) Release(req.session(), resp.sequence_id());
        break;
      }
      case 8: {
        v1::ReleaseRequest req;
        v1::ReleaseResponse resp;
        req.ParseFromString(body);
        name(req.mutable_session(), nullptr);
        s = service_->Release(&ctx, &req, &resp);
        break;
      }
      case 9: {
        v1::LookupRequest req;
        v1::LookupResponse resp;
        req.ParseFromString(body);
        name(req.mutable_session(), nullptr);
        s = service_->Lookup(&ctx, &req, &resp);
        break;
      }
      case 10: {
        v1::ReadRequest req;
        v1::ReadResponse resp;
        req.ParseFromString(body);
        uint64_t seq = req.sequence_id();
        name(req.mutable_session(), &seq);
        req.set_sequence_id(seq);
        s = service_->Read(&ctx, &req, &resp);
        break;
      }
      case 11: {
        v1::EvictRequest req;
        v1::EvictResponse resp;
        req.ParseFromString(body);
        name(req.mutable_session(), nullptr);
        s = service_->Evict(&ctx, &req, &resp);
        break;
      }
      case 12: {
        v1::StatsRequest req;
        v1::StatsResponse resp;
        req.ParseFromString(body);
        name(req.mutable_session(), nullptr);
        s = service_->Stats(&ctx, &req, &resp);
        break;
      }
      case 13: {
        v1::ListSequencesRequest req;
        v1::ListSequencesResponse resp;
        req.ParseFromString(body);
        name(req.mutable_session(), nullptr);
        s = service_->ListSequences(&ctx, &req, &resp);
        break;
      }
      case 14: {  // a config file
        DaemonConfig c;
        ApplyConfigText(body, &c).IgnoreError();
        break;
      }
      case 15: {  // a tenants file
        auto specs = ParseTenants(body);
        if (specs.ok()) {
          for (const TenantSpec& t : *specs) {
            if (t.name.empty()) Fail("a parsed tenant without a name");
          }
        }
        break;
      }
      default: {  // the descriptor channel, raw bytes
        Descriptor(body);
        break;
      }
    }
    if (forged && s.error_code() != grpc::StatusCode::NOT_FOUND && s.error_code() != grpc::StatusCode::INVALID_ARGUMENT) {
      Fail(absl::StrCat("a wrong secret got ", static_cast<int>(s.error_code()), ": ", s.error_message()));
    }
    if (absl::Status inv = core_->CheckInvariants(); !inv.ok()) Fail(inv.ToString());
  }

 private:
  static v1::SessionRef ToWire(const SessionRef& r) {
    v1::SessionRef out;
    out.set_session_id(r.session);
    out.set_epoch(r.epoch);
    out.set_secret(std::string(r.secret.begin(), r.secret.end()));
    return out;
  }

  // Two live sessions, each with one sequence holding a sink and part of a tile.
  void EnsureSessions() {
    for (int i = 0; i < 2; ++i) {
      if (refs_[i].session != 0 && core_->CheckSession(refs_[i]).ok()) {
        if (core_->Table(refs_[i], seqs_[i]).ok()) continue;
      } else {
        OpenParams p;
        p.tenant = i == 0 ? "x" : "y";
        p.layout = model_;
        p.max_sequences = 4;
        auto r = core_->OpenSession(p);
        if (!r.ok()) Fail(r.status().ToString());
        refs_[i] = SessionRef{r->session, core_->epoch(), r->secret};
      }
      auto q = core_->CreateSequence(refs_[i], {});
      if (!q.ok()) continue;  // all slots taken by the fuzzer's sequences: keep going
      seqs_[i] = q->sequence;
      std::vector<float> kv(70 * 2 * 2 * 64, 0.5f);
      std::vector<uint32_t> ids(64);
      for (uint32_t t = 0; t < 64; ++t) ids[t] = t + 100 * i;
      core_->AppendInline(refs_[i], seqs_[i], ids, kv.data(), kv.data(), DType::kF32).IgnoreError();
    }
  }

  void Release(const v1::SessionRef& ref, uint64_t seq) {
    const SessionRef r = FromProto(ref);
    const SequenceId ids[] = {seq};
    core_->Release(r, ids).IgnoreError();
  }

  void Descriptor(const std::string& bytes) {
    const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::string path = dir_ + "/k.sock.fd";
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) Fail("cannot reach the descriptor channel");
    SendWithFds(fd, bytes.substr(0, 8192), {}).IgnoreError();
    // An answer (or the daemon closing the connection) must come.
    auto reply = ReceiveWithFds(fd, 64 * 1024, 8, absl::Seconds(5));
    if (!reply.ok() && absl::IsDeadlineExceeded(reply.status())) Fail("the descriptor channel never answered");
    close(fd);
  }

  HostMemoryBackend backend_;
  ModelConfig model_;
  std::unique_ptr<KvCore> core_;
  std::unique_ptr<KvService> service_;
  std::unique_ptr<DescriptorServer> descriptors_;
  std::string dir_;
  SessionRef refs_[2];
  SequenceId seqs_[2] = {0, 0};
};

}  // namespace
}  // namespace kvarn

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static kvarn::Harness* h = [] {
    auto* made = new kvarn::Harness();
    // Deleted at exit, so that its socket directory goes too. Registered after the descriptor
    // server started, so it runs before the static destructors of what that server set up.
    std::atexit([] { delete h; });
    return made;
  }();
  h->Run(data, size);
  return 0;
}
