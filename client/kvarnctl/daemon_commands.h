// kvarnctl's commands that talk to a running kvarnd: status, sequences, evict, watch, and
// demo (demo.cc). Each connects, learns the daemon's layout (Describe), opens a session
// (an observer session, holding no tail slots, except for demo) and closes it on exit.
#ifndef KVARN_CLIENT_KVARNCTL_DAEMON_COMMANDS_H_
#define KVARN_CLIENT_KVARNCTL_DAEMON_COMMANDS_H_

#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "client/kvarnctl/command.h"
#include "client/kvarnctl/flags.h"
#include "client/lib/client.h"

namespace kvarn::ctl {

int RunStatus(std::span<const std::string> args, const CommandIo& io);
int RunSequences(std::span<const std::string> args, const CommandIo& io);
int RunEvict(std::span<const std::string> args, const CommandIo& io);
int RunWatch(std::span<const std::string> args, const CommandIo& io);
int RunDemo(std::span<const std::string> args, const CommandIo& io);

// Flags every daemon command takes.
struct DaemonFlags {
  std::string target;  // default: $KVARN_TARGET, else unix:/tmp/kvarnd.sock
  std::string tenant = "kvarnctl";
  std::string tenant_token_file;  // default: $KVARN_TENANT_TOKEN_FILE
  std::string admin_token;
  std::string admin_token_file;
  std::string tls_ca, tls_cert, tls_key, tls_server_name;
  void Register(FlagSet* flags);
  std::string AdminToken() const;  // the token, or the first line of the token file
};

struct Connection {
  std::unique_ptr<Client> client;
  std::unique_ptr<Session> session;
  v1::DescribeResponse daemon;
};

// Connects and opens a session with the daemon's own layout.
absl::StatusOr<Connection> Connect(const DaemonFlags& flags, bool observer, uint32_t max_sequences,
                                   const std::string& client_name);

// The CLI's status type for an absl::Status (same code where one exists).
CodecStatus ToCli(const absl::Status& s);

// "1.50 GiB", "12.0 KiB".
std::string HumanBytes(double bytes);

}  // namespace kvarn::ctl

#endif  // KVARN_CLIENT_KVARNCTL_DAEMON_COMMANDS_H_
