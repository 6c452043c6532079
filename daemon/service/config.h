// kvarnd's configuration: a file of `key = value` lines and command-line flags with the same
// names (`--key=value`), flags overriding the file. Every key, its unit and default is
// listed by `kvarnd --help` and in deploy/kvarnd.conf.example.
#ifndef KVARN_DAEMON_SERVICE_CONFIG_H_
#define KVARN_DAEMON_SERVICE_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/core/core_types.h"
#include "daemon/core/kv_core.h"

namespace kvarn {

struct DaemonConfig {
  CoreConfig core;
  std::string instance = "kvarnd";          // names the daemon in logs and its segments in /proc/<pid>/maps
  std::string backend = "host";             // host, cuda or auto
  // The host backend's segments on the kernel's huge page pool: off, try (base pages when it
  // has no room) or on (no room: kvarnd does not start, a session is refused). The cuda
  // backend's pool is device memory and ignores it.
  std::string huge_pages = "off";
  int cuda_device = 0;
  std::string listen = "/run/kvarnd/kvarnd.sock";  // Unix domain socket path ("" disables)
  uint32_t socket_mode = 0600;              // of the Unix socket and its descriptor channel
  std::string tcp;                          // host:port for TCP ("" disables)
  // TLS for TCP: certificate chain and private key (PEM files); with a client CA, clients must
  // present a certificate it signed (mutual TLS). A TCP address that is not loopback needs
  // TLS unless allow_insecure_tcp.
  std::string tls_cert, tls_key, tls_client_ca;
  bool allow_insecure_tcp = false;
  bool check_config = false;  // validate, print the pool plan, exit
  // Tenants file (core/tenants.h): authenticated tenants and their quotas; reloaded on SIGHUP.
  // Empty: one trust domain.
  std::string tenants_file;
  std::string metrics = "127.0.0.1:9464";   // host:port of /metrics ("" disables)
  std::string admin_token_file;             // see ResolveAdminToken (server.cc)
  int seal_threads = 1;                     // encode workers per seal
  // Commit rings: drain each ring's batches on the CPU its client last committed from, when
  // kvarnd may run there (docs/commit_ring.md).
  bool ring_follow_cpu = true;
  absl::Duration ring_watch = absl::Microseconds(50);  // drain thread's watch after a pipelined batch
  // Memory the daemon spends on requests (docs/daemon.md, "Bounded memory"):
  int max_message_mb = 0;                   // gRPC message limit, MiB; 0: derived from the layout
  uint64_t max_read_bytes = 4ull << 20;     // one Read reply's K/V
  uint64_t grpc_memory_bytes = 256ull << 20;  // gRPC's resource quota (buffers of calls in flight)
  int grpc_max_threads = 32;                // unary calls handled at once (RESOURCE_EXHAUSTED beyond)
  uint32_t max_batch_items = 4096;          // items of one AppendBatch
  absl::Duration watch_poll = absl::Milliseconds(200);  // Watch hub's longest wait
  std::string log_level = "info";
  absl::Duration expiry_scan = absl::Milliseconds(50);  // lease check period
  absl::Duration drain = absl::Seconds(20);  // SIGTERM: open sessions are served this long at most
  // Tiers below the pool (docs/tiers.md). The disk tier: a directory of block records, bounded
  // by disk_tier_bytes, written when the pool evicts (or seals) a block; its index is rebuilt
  // at start (a warm restart). memcached: servers shared by nodes, by consistent hashing.
  std::string disk_tier_dir;                      // "" disables
  uint64_t disk_tier_bytes = 8ull << 30;
  std::string disk_tier_write = "evict";          // evict or seal
  bool disk_tier_fsync = false;
  std::vector<std::string> memcached_servers;     // host:port, comma-separated in the config
  std::string memcached_write = "seal";           // seal or evict
  std::string memcached_key_prefix = "kvarn1:";
  uint64_t memcached_chunk_bytes = 512u << 10;    // a record is split into values of at most this
  absl::Duration memcached_timeout = absl::Milliseconds(250);
  uint64_t tier_queue_bytes = 256ull << 20;       // each tier's write-behind queue
  // On stop: every block still in the pool goes to the tiers that lack it (so it survives a
  // restart on the disk tier), waiting at most tier_stop_ms for their queues.
  bool tier_spill_on_stop = true;
  absl::Duration tier_stop = absl::Seconds(30);
};

// The gRPC message limit in bytes: max_message_mb when set, else what the layout needs: a
// whole tile appended inline in fp32, or a CreateSequence of max_prompt_tokens, whichever is
// larger, plus a margin for the rest of the message.
uint64_t MessageLimitBytes(const DaemonConfig& config);
// Tokens one Read may return: max_read_tokens, and no more than max_read_bytes of K/V.
uint32_t ReadTokensPerCall(const DaemonConfig& config);

// Parses argv (after the program name). `--config=FILE` is read first; `--help` sets
// *help. Errors name the key and what is wrong.
absl::StatusOr<DaemonConfig> ParseDaemonConfig(const std::vector<std::string>& args, bool* help);

// Applies `key = value` lines (a config file's text).
absl::Status ApplyConfigText(const std::string& text, DaemonConfig* config);

std::string DaemonHelp();

// `kvarnd --check_config`: the model, and how the capacity divides into quantized blocks, sink
// blocks and tail slots, in bytes and tokens.
std::string DescribePlan(const DaemonConfig& c, const PoolPlan& plan);

}  // namespace kvarn

#endif  // KVARN_DAEMON_SERVICE_CONFIG_H_
