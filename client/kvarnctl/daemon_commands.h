// kvarnctl's commands that talk to a running kvarnd: status (status_command.cc), sequences,
// evict, watch (daemon_commands.cc), demo (demo.cc), route (route_command.cc: several
// endpoints at once, through kvarn::Router, with --endpoint instead of --target) and health
// (health_command.cc). All but health connect, learn the daemon's layout (Describe), open a
// session (an observer session, holding no tail slots, except for demo's workers) and close
// it on exit; health asks gRPC's health service and opens nothing.
//
// Where they connect: --target, else $KVARN_TARGET, else kDefaultTarget, for every one of
// them. Credentials: --tenant-token-file (default $KVARN_TENANT_TOKEN_FILE), --admin-token
// or --admin-token-file (default $KVARN_ADMIN_TOKEN_FILE). A token file that cannot be read,
// or holds no token, is a usage error (exit 2) naming the file and the system's reason; an
// admin token kvarnd refuses is a failure (exit 1). Neither ever falls back to a tenant's
// view.
//
// --json: every command prints JSON on stdout (docs/kvarnctl.md lists each shape); errors
// stay text on stderr, and stdout is then empty.
#ifndef KVARN_CLIENT_KVARNCTL_DAEMON_COMMANDS_H_
#define KVARN_CLIENT_KVARNCTL_DAEMON_COMMANDS_H_

#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/kvarnctl/command.h"
#include "client/kvarnctl/flags.h"
#include "client/kvarnctl/health_wire.h"
#include "client/lib/client.h"
#include "google/protobuf/message.h"

namespace kvarn::ctl {

int RunStatus(std::span<const std::string> args, const CommandIo& io);
int RunSequences(std::span<const std::string> args, const CommandIo& io);
int RunEvict(std::span<const std::string> args, const CommandIo& io);
int RunWatch(std::span<const std::string> args, const CommandIo& io);
int RunDemo(std::span<const std::string> args, const CommandIo& io);
int RunHealth(std::span<const std::string> args, const CommandIo& io);
int RunRoute(std::span<const std::string> args, const CommandIo& io);  // route_command.cc

// The socket of the Kubernetes manifests and of kvarnd's default `listen`.
inline constexpr char kDefaultTarget[] = "unix:/run/kvarnd/kvarnd.sock";

// Flags of the commands that talk to kvarnd.
struct DaemonFlags {
  std::string target;  // default: $KVARN_TARGET, else kDefaultTarget
  std::string tenant = "kvarnctl";
  std::string tenant_token_file;  // default: $KVARN_TENANT_TOKEN_FILE
  std::string admin_token;
  std::string admin_token_file;  // default: $KVARN_ADMIN_TOKEN_FILE
  std::string tls_ca, tls_cert, tls_key, tls_server_name;

  // --target and the TLS flags (what `health` takes).
  void RegisterTarget(FlagSet* flags);
  // RegisterTarget plus the tenant and admin flags.
  void Register(FlagSet* flags);

  // The admin token to present: --admin-token, or the first line of the admin token file
  // (surrounding whitespace removed); "" when neither is given. INVALID_ARGUMENT naming the
  // file (and whether it came from $KVARN_ADMIN_TOKEN_FILE) with the system's reason when it
  // cannot be read, when its first line is empty, or when --admin-token and
  // --admin-token-file are both given.
  absl::StatusOr<std::string> AdminToken() const;
  // The tenant token from --tenant-token-file, "" without one; errors as AdminToken's.
  absl::StatusOr<std::string> TenantToken() const;
  // Client options for the target: TLS from the --tls-* files (INVALID_ARGUMENT naming an
  // unreadable one).
  absl::StatusOr<ClientOptions> Options() const;

  // Set by Register from the environment, to name the source of a default in errors.
  std::string admin_token_file_env;
};

struct Connection {
  std::unique_ptr<Client> client;
  std::unique_ptr<Session> session;
  v1::DescribeResponse daemon;
  bool admin = false;  // the session presented an admin token, and kvarnd took it
};

// Reads the credentials the flags name (failing before any connection when one is
// unusable), checks that kvarnd answers (CheckHealth, 5 s: an absent daemon fails at once
// with gRPC's reason), connects and opens a session with the daemon's own layout. An admin token
// kvarnd refuses is PERMISSION_DENIED "the admin token was refused by kvarnd at TARGET";
// a tenant token it refuses is UNAUTHENTICATED naming the tenant.
absl::StatusOr<Connection> Connect(const DaemonFlags& flags, bool observer, uint32_t max_sequences,
                                   const std::string& client_name);

// grpc.health.v1.Health/Check of `service` ("" for the whole server) at `target`, under one
// deadline that covers connecting too: the status kvarnd reported, or the call's error, its
// message naming the target: UNAVAILABLE "kvarnd at T is not reachable: <gRPC's reason>"
// when nothing listens there (at once: the call does not wait for a daemon to appear),
// DEADLINE_EXCEEDED "kvarnd at T did not answer within D (connecting included)", NOT_FOUND
// for a service it has no status for, UNIMPLEMENTED without a health service, INTERNAL for
// a malformed reply. `timeout` must be finite and positive (kvarnctl's flag refuses others):
// the deadline is what ends a call to a daemon that never answers; a non-positive one is
// INVALID_ARGUMENT.
absl::StatusOr<ServingStatus> CheckHealth(const std::string& target, const ClientOptions& options,
                                          const std::string& service, absl::Duration timeout);

// The CLI's status for an absl::Status: INVALID_ARGUMENT stays (exit 2); every other code is
// a failure (exit 1). The message keeps the code's name except for the codes whose message
// already says it all (unavailable, permission denied, unauthenticated).
CodecStatus ToCli(const absl::Status& s);

// "1.50 GiB", "12.00 KiB", "512 B".
std::string HumanBytes(double bytes);

// A daemon reply in the proto3 JSON mapping, as every --json prints them: field names as in
// kvarn.proto, every field present (zeros and empty lists included), enums by name, bytes in
// base64, and 64-bit integers as strings.
std::string ProtoJson(const google::protobuf::Message& message);

// Parses `args` into `flags`. Returns -1 to go on, else the exit code: kExitOk after
// printing the help (`usage`, then the flags) on io.out, kExitUsage after a bad flag.
int ParseOrExit(FlagSet& flags, std::span<const std::string> args, const CommandIo& io,
                const std::string& usage);

// The lines every daemon command's help ends with: where it connects, the environment.
std::string TargetHelp();

}  // namespace kvarn::ctl

#endif  // KVARN_CLIENT_KVARNCTL_DAEMON_COMMANDS_H_
