// `kvarnctl health`: grpc.health.v1.Health/Check against kvarnd, for Kubernetes exec probes
// and scripts. One RPC under one deadline (--timeout) that covers connecting too, so it
// returns within the deadline whatever the daemon does (gone, stopped, overloaded). It opens
// no session and needs no token.
//
// The health messages go through grpc::GenericStub as bytes (health_wire.h says why).
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/kvarnctl/daemon_commands.h"
#include "client/kvarnctl/health_wire.h"
#include "client/kvarnctl/json.h"

namespace kvarn::ctl {
namespace {

constexpr char kHealthUsage[] =
    "usage: kvarnctl health [--target ADDR] [--service NAME] [--timeout DURATION] [--json]\n\n"
    "Asks kvarnd's gRPC health service (grpc.health.v1.Health/Check) and prints the answer,\n"
    "SERVING or NOT_SERVING. Services: \"\" (the server as a whole, the default) and\n"
    "kvarn.v1.KvCache; kvarnd reports NOT_SERVING once it is shutting down. Connecting and\n"
    "the call share one deadline (--timeout, default 1s), so the command never hangs: use it\n"
    "as a Kubernetes exec probe with --timeout below the probe's timeoutSeconds, e.g.\n"
    "  exec: {command: [kvarnctl, health, --timeout=800ms]}\n"
    "No session is opened and no token is needed.\n\n"
    "Exit status: 0 SERVING; 1 NOT_SERVING, or kvarnd could not be asked (unreachable, no\n"
    "answer within the deadline, unknown service), with the reason on stderr; 2 bad flags.";

std::shared_ptr<grpc::ChannelCredentials> Credentials(const ClientOptions& co, grpc::ChannelArguments* args) {
  if (!co.tls) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions tls;
  tls.pem_root_certs = co.tls_root_certs;
  tls.pem_cert_chain = co.tls_cert_chain;
  tls.pem_private_key = co.tls_private_key;
  if (!co.tls_server_name.empty()) args->SetSslTargetNameOverride(co.tls_server_name);
  return grpc::SslCredentials(tls);
}

std::string FlatBytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

}  // namespace

absl::StatusOr<ServingStatus> CheckHealth(const std::string& target, const ClientOptions& options,
                                          const std::string& service, absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration() || timeout == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a health check needs a finite, positive deadline, not ", absl::FormatDuration(timeout)));
  }
  grpc::ChannelArguments channel_args;
  // A connection of its own: a probe answers for the daemon listening now, never through a
  // connection another channel of this process holds to a daemon that has since gone.
  channel_args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto channel = grpc::CreateCustomChannel(target, Credentials(options, &channel_args), channel_args);
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  // Fail fast (gRPC's default): a socket nobody listens on is an error at once, not a wait
  // for a daemon to appear; one that never answers runs into the deadline.
  ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  const std::string request_bytes = EncodeHealthCheckRequest(service);
  grpc::Slice slice(request_bytes);
  const grpc::ByteBuffer request(&slice, 1);
  grpc::CompletionQueue cq;
  grpc::ByteBuffer response;
  grpc::Status status;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> call =
      stub.PrepareUnaryCall(&ctx, kHealthCheckMethod, request, &cq);
  call->StartCall();
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  // The deadline bounds the call, so its completion always comes.
  const bool got = cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  const std::string who = absl::StrCat("kvarnd at ", target);
  if (!got) return absl::InternalError(absl::StrCat(who, ": the health check never completed"));
  if (!status.ok()) {
    const std::string what = service.empty() ? "the server" : absl::StrCat("service '", service, "'");
    switch (status.error_code()) {
      case grpc::StatusCode::DEADLINE_EXCEEDED:
        return absl::DeadlineExceededError(
            absl::StrCat(who, " did not answer within ", absl::FormatDuration(timeout), " (connecting included)"));
      case grpc::StatusCode::UNAVAILABLE:
        return absl::UnavailableError(absl::StrCat(who, " is not reachable: ", status.error_message()));
      case grpc::StatusCode::NOT_FOUND:
        return absl::NotFoundError(
            absl::StrCat(who, " has no health status for ", what, " (its services: \"\" for the server, kvarn.v1.KvCache)"));
      case grpc::StatusCode::UNIMPLEMENTED:
        return absl::UnimplementedError(absl::StrCat(who, " serves no grpc.health.v1.Health: is this kvarnd?"));
      default:
        return absl::Status(static_cast<absl::StatusCode>(static_cast<int>(status.error_code())),
                            absl::StrCat(who, ": health check: ", status.error_message()));
    }
  }
  ServingStatus serving = ServingStatus::kUnknown;
  if (const CodecStatus s = DecodeHealthCheckResponse(FlatBytes(response), &serving); !s.ok()) {
    return absl::InternalError(absl::StrCat(who, ": ", s.message()));
  }
  return serving;
}

int RunHealth(std::span<const std::string> args, const CommandIo& io) {
  FlagSet flags("health");
  DaemonFlags d;
  d.RegisterTarget(&flags);
  std::string service;
  absl::Duration timeout = absl::Seconds(1);
  bool json = false;
  flags.String("service", &service, "NAME", "the service to ask about: kvarn.v1.KvCache (default: the whole server)");
  flags.Duration("timeout", &timeout, "DURATION", "deadline of the whole check, connecting included (default 1s)");
  flags.Bool("json", &json, "print {\"target\", \"service\", \"status\"} as one JSON object");
  const CodecStatus parsed = flags.Parse(args);
  if (flags.help_requested()) {
    io.out << kHealthUsage << "\n\nFlags:\n"
           << flags.Usage() << "\nTarget: --target, else $KVARN_TARGET, else " << kDefaultTarget
           << " (kvarnd's default listen path\nand the Kubernetes manifests').\n";
    return kExitOk;
  }
  if (!parsed.ok()) return ReportError(io, parsed);
  auto co = d.Options();
  if (!co.ok()) return ReportError(io, ToCli(co.status()));
  if (co->tls && d.target.starts_with("unix:")) {
    return ReportError(io, InvalidArgument("health: TLS is for TCP targets; a Unix socket is local"));
  }
  const absl::StatusOr<ServingStatus> serving = CheckHealth(d.target, *co, service, timeout);
  if (!serving.ok()) {
    return ReportError(io, CodecStatus(CodecCode::kUnavailable, absl::StrCat("health: ", serving.status().message())));
  }
  const std::string name = ServingStatusName(*serving);
  if (json) {
    JsonWriter j;
    j.BeginObject().Field("target", d.target).Field("service", service).Field("status", name).EndObject();
    io.out << j.str() << "\n";
  } else {
    io.out << name << "\n";
  }
  if (*serving != ServingStatus::kServing) {
    io.err << "kvarnctl: health: kvarnd at " << d.target << " reports " << name << " for "
           << (service.empty() ? "the server" : "service '" + service + "'") << "\n";
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace kvarn::ctl
