// kvarnd's configuration: a file of `key = value` lines and command-line flags with the same
// names (`--key=value`), flags overriding the file. Every key, its unit and default is
// listed by `kvarnd --help` and in deploy/kvarnd.conf.example.
#ifndef KVARN_DAEMON_SERVICE_CONFIG_H_
#define KVARN_DAEMON_SERVICE_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/core/core_types.h"

namespace kvarn {

struct DaemonConfig {
  CoreConfig core;
  std::string instance = "kvarnd";          // names shared-memory segments; one per daemon
  std::string backend = "host";             // host, cuda or auto
  int cuda_device = 0;
  std::string listen = "/tmp/kvarnd.sock";  // Unix domain socket path ("" disables)
  std::string tcp;                          // host:port for TCP ("" disables)
  std::string metrics = "127.0.0.1:9464";   // host:port of /metrics ("" disables)
  std::string admin_token_file;             // written at start (mode 0600) when admin_token is set
  int seal_threads = 1;                     // encode workers per seal
  int max_message_mb = 64;                  // gRPC receive limit
  std::string log_level = "info";
  absl::Duration expiry_scan = absl::Milliseconds(50);  // lease check period
  absl::Duration drain = absl::Seconds(2);  // SIGTERM: in-flight calls get this long
};

// Parses argv (after the program name). `--config=FILE` is read first; `--help` sets
// *help. Errors name the key and what is wrong.
absl::StatusOr<DaemonConfig> ParseDaemonConfig(const std::vector<std::string>& args, bool* help);

// Applies `key = value` lines (a config file's text).
absl::Status ApplyConfigText(const std::string& text, DaemonConfig* config);

std::string DaemonHelp();

// "64MiB", "2GiB", "1000000" -> bytes.
absl::StatusOr<uint64_t> ParseBytes(const std::string& s);

}  // namespace kvarn

#endif  // KVARN_DAEMON_SERVICE_CONFIG_H_
