// What kvarnctl's daemon commands share: their flags, reading credentials, connecting and
// opening a session, and turning the daemon's errors into exit codes and messages.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/kvarnctl/daemon_commands.h"
#include "common/units.h"
#include "google/protobuf/util/json_util.h"

namespace kvarn::ctl {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

// The whole file, or INVALID_ARGUMENT "<what>: cannot read <path>: <strerror>".
absl::StatusOr<std::string> ReadWholeFile(const std::string& path, const std::string& what) {
  const auto fail = [&](int err) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": cannot read ", path, ": ", std::strerror(err)));
  };
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(errno);
  std::string data;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      return fail(err);
    }
    if (n == 0) break;
    data.append(buf, static_cast<size_t>(n));
    if (data.size() > (1u << 20)) {
      close(fd);
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", path, " is larger than 1 MiB"));
    }
  }
  close(fd);
  return data;
}

// The first line of a token file, without surrounding whitespace; INVALID_ARGUMENT when it
// cannot be read or that line is empty.
absl::StatusOr<std::string> ReadToken(const std::string& path, const std::string& what) {
  auto data = ReadWholeFile(path, what);
  if (!data.ok()) return data.status();
  std::string line = data->substr(0, data->find('\n'));
  const char* kSpace = " \t\r\f\v";
  const size_t b = line.find_first_not_of(kSpace);
  line = b == std::string::npos ? "" : line.substr(b, line.find_last_not_of(kSpace) - b + 1);
  if (line.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", path, " holds no token (its first line is empty)"));
  }
  return line;
}

}  // namespace

void DaemonFlags::RegisterTarget(FlagSet* flags) {
  target = Env("KVARN_TARGET");
  if (target.empty()) target = kDefaultTarget;
  flags->String("target", &target, "ADDR",
                absl::StrCat("kvarnd address: unix:/path or host:port (default $KVARN_TARGET, else ",
                             kDefaultTarget, ")"));
  flags->String("tls-ca", &tls_ca, "FILE", "TCP targets: connect with TLS, verifying kvarnd against this PEM CA");
  flags->String("tls-cert", &tls_cert, "FILE", "TCP targets: this client's PEM certificate (mutual TLS)");
  flags->String("tls-key", &tls_key, "FILE", "TCP targets: this client's PEM private key (mutual TLS)");
  flags->String("tls-server-name", &tls_server_name, "NAME", "TCP targets: the name kvarnd's certificate must carry");
}

void DaemonFlags::Register(FlagSet* flags) {
  RegisterTarget(flags);
  flags->String("tenant", &tenant, "NAME", absl::StrCat("tenant of the session (default ", tenant, ")"));
  tenant_token_file = Env("KVARN_TENANT_TOKEN_FILE");
  flags->String("tenant-token-file", &tenant_token_file, "FILE",
                "file whose first line is the tenant's token, when kvarnd authenticates tenants "
                "(default $KVARN_TENANT_TOKEN_FILE)");
  flags->String("admin-token", &admin_token, "TOKEN",
                "admin token, for operations across tenants (visible to other users in ps; prefer the file)");
  admin_token_file_env = Env("KVARN_ADMIN_TOKEN_FILE");
  admin_token_file = admin_token_file_env;
  flags->String("admin-token-file", &admin_token_file, "FILE",
                "file whose first line is the admin token, e.g. kvarnd's admin_token_file "
                "(default $KVARN_ADMIN_TOKEN_FILE)");
}

absl::StatusOr<std::string> DaemonFlags::AdminToken() const {
  const bool file_from_env = !admin_token_file.empty() && admin_token_file == admin_token_file_env;
  if (!admin_token.empty()) {
    // An explicit token overrides the environment's file, not an explicit file.
    if (!admin_token_file.empty() && !file_from_env) {
      return absl::InvalidArgumentError("give --admin-token or --admin-token-file, not both");
    }
    return admin_token;
  }
  if (admin_token_file.empty()) return std::string();
  return ReadToken(admin_token_file,
                   file_from_env ? "$KVARN_ADMIN_TOKEN_FILE" : "--admin-token-file");
}

absl::StatusOr<std::string> DaemonFlags::TenantToken() const {
  if (tenant_token_file.empty()) return std::string();
  const bool from_env = tenant_token_file == Env("KVARN_TENANT_TOKEN_FILE");
  return ReadToken(tenant_token_file, from_env ? "$KVARN_TENANT_TOKEN_FILE" : "--tenant-token-file");
}

absl::StatusOr<ClientOptions> DaemonFlags::Options() const {
  ClientOptions co;
  if (tls_ca.empty() && tls_cert.empty() && tls_key.empty()) return co;
  if (tls_cert.empty() != tls_key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  co.tls = true;
  if (!tls_ca.empty()) {
    auto ca = ReadWholeFile(tls_ca, "--tls-ca");
    if (!ca.ok()) return ca.status();
    co.tls_root_certs = *ca;
  }
  if (!tls_cert.empty()) {
    auto cert = ReadWholeFile(tls_cert, "--tls-cert");
    if (!cert.ok()) return cert.status();
    auto key = ReadWholeFile(tls_key, "--tls-key");
    if (!key.ok()) return key.status();
    co.tls_cert_chain = *cert;
    co.tls_private_key = *key;
  }
  co.tls_server_name = tls_server_name;
  return co;
}

absl::StatusOr<Connection> Connect(const DaemonFlags& flags, bool observer, uint32_t max_sequences,
                                   const std::string& client_name) {
  // Every local input first: a bad file is the user's to fix, whether kvarnd runs or not.
  auto co = flags.Options();
  if (!co.ok()) return co.status();
  auto admin_token = flags.AdminToken();
  if (!admin_token.ok()) return admin_token.status();
  auto tenant_token = flags.TenantToken();
  if (!tenant_token.ok()) return tenant_token.status();

  // An absent daemon fails here at once, with gRPC's reason; Client::Connect would wait out
  // its timeout for one to appear.
  if (auto health = CheckHealth(flags.target, *co, "", absl::Seconds(5)); !health.ok()) {
    const absl::StatusCode code = health.status().code();
    if (code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded) return health.status();
  }
  Connection c;
  auto client = Client::Connect(flags.target, *co, absl::Seconds(5));
  if (!client.ok()) return client.status();
  c.client = std::move(*client);
  auto d = c.client->Describe();
  if (!d.ok()) return d.status();
  c.daemon = *d;
  SessionOptions o;
  o.tenant = flags.tenant;
  o.tenant_token = *tenant_token;
  o.layout = Client::LayoutOf(*d);
  o.observer = observer;
  o.max_sequences = max_sequences;
  o.admin_token = *admin_token;
  o.client_name = client_name;
  auto s = c.client->OpenSession(o);
  if (!s.ok()) {
    const absl::Status& e = s.status();
    if (e.code() == absl::StatusCode::kPermissionDenied && !o.admin_token.empty()) {
      return absl::PermissionDeniedError(
          absl::StrCat("the admin token was refused by kvarnd at ", flags.target, " (", e.message(), ")"));
    }
    if (e.code() == absl::StatusCode::kUnauthenticated) {
      return absl::UnauthenticatedError(absl::StrCat("kvarnd at ", flags.target, " refused tenant '", flags.tenant,
                                                     "': ", e.message(), " (see --tenant-token-file)"));
    }
    return e;
  }
  c.session = std::move(*s);
  c.admin = !o.admin_token.empty();
  return c;
}

CodecStatus ToCli(const absl::Status& s) {
  if (s.ok()) return {};
  const std::string message(s.message());
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
      return InvalidArgument(message);
    case absl::StatusCode::kFailedPrecondition:
      return CodecStatus(CodecCode::kFailedPrecondition, message);
    case absl::StatusCode::kUnavailable:
      return CodecStatus(CodecCode::kUnavailable, message);
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
      return CodecStatus(CodecCode::kFailedPrecondition, message);
    default:
      return CodecStatus(CodecCode::kInternal, absl::StrCat(absl::StatusCodeToString(s.code()), ": ", message));
  }
}

std::string HumanBytes(double bytes) { return FormatBytes(bytes); }

std::string ProtoJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = false;
  o.always_print_primitive_fields = true;
  o.preserve_proto_field_names = true;
  std::string out;
  if (!google::protobuf::util::MessageToJsonString(message, &out, o).ok()) return "null";
  return out;
}

int ParseOrExit(FlagSet& flags, std::span<const std::string> args, const CommandIo& io,
                const std::string& usage) {
  const CodecStatus s = flags.Parse(args);
  if (flags.help_requested()) {
    io.out << usage << "\n\nFlags:\n" << flags.Usage() << "\n" << TargetHelp();
    return kExitOk;
  }
  if (!s.ok()) return ReportError(io, s);
  return -1;
}

std::string TargetHelp() {
  return absl::StrCat(
      "Target: --target, else $KVARN_TARGET, else ", kDefaultTarget,
      " (kvarnd's default listen path\nand the Kubernetes manifests'). Environment: KVARN_TARGET, "
      "KVARN_TENANT_TOKEN_FILE, KVARN_ADMIN_TOKEN_FILE\n(defaults of --target, --tenant-token-file, "
      "--admin-token-file; a flag overrides its variable).\n"
      "Exit status: 0 success; 1 kvarnd unreachable, refused the call or the admin token; 2 bad\n"
      "flags, or a token or TLS file that cannot be read or is empty.\n");
}

}  // namespace kvarn::ctl
