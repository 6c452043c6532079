// kvarn::Router: ranks kvarnd endpoints (one per node or worker) by how much of a prompt each
// has cached, across its tiers, so a request goes where its prefix already is (a cache-aware
// router, as NVIDIA Dynamo's KV router or llm-d's). docs/router.md has the whole picture.
//
//   auto router = kvarn::Router::Create({.endpoints = {"node-a:7070", "node-b:7070"},
//                                        .tenant = "team-a"});
//   std::vector<kvarn::RouteResult> ranked = (*router)->Rank(prompt_ids);
//   // ranked[0].endpoint is where to send the request.
//
// Per endpoint the Router holds a Client and an observer session (no tail slots), and a
// thread that keeps a Watch stream open and applies its events to a local EndpointIndex
// (client/lib/endpoint_index.h): stored adds the block's tier, removed takes it away.
//
// Where answers come from. Watch only reports changes after the stream starts, so an index
// is trusted only when it is known complete: its stream's first event was the endpoint's
// event number 1 (so nothing had been logged before the stream started, in this daemon
// epoch), and when the stream started the endpoint's disk tier held no records (kvarnd
// finds records left by a previous run without an event). Until then, and whenever the stream
// has ended (DATA_LOSS when the watcher fell behind, a restart of the daemon, a network
// error), the endpoint is answered by Lookup, an RPC. A stream that ends clears the index and
// the thread reconnects with exponential backoff (RouterOptions::backoff_*) and subscribes
// afresh; an index rebuilt after a DATA_LOSS cannot be proven complete again (its first event
// is not number 1), so that endpoint stays on Lookup until its daemon restarts. A tenant
// session sees its own tenant's events only: if another tenant's block was the daemon's
// first event, that index is never proven complete either. Routers should use the admin
// token, which sees every event.
//
// Rank computes the prompt's block hashes locally with each endpoint's own prefix namespace
// (OpenSessionResponse.prefix_namespace: per tenant, salted, equal across nodes that share
// the salt secret and the layout) and matches the longest prefix in each complete index, as
// kvarnd's Lookup does: the pool's run from the prompt's start, then the tiers' continuation.
// Remote tiers (memcached) are shared by every node: a block any complete index saw stored
// in a remote tier counts for every endpoint of the same namespace
// (RouterOptions::share_remote_tiers), since each of them would fetch it from there.
//
// Scoring: score = pool_tokens + disk_weight * disk_tokens + remote_weight * remote_tokens,
// by default pool + 0.9 * disk + 0.5 * remote (a block in the pool is used in place; one on
// disk is read and imported first; a remote one crosses the network). Highest score first;
// ties in endpoint order; endpoints that could not be answered (unreachable, refused, past
// the deadline) come last, in endpoint order, each with its error.
//
// Thread safety: every method may be called from any thread. Rank never holds a lock across
// an RPC and never waits longer than its timeout (RankOptions::timeout) plus scheduling.
// Destruction cancels the Watch streams and wakes the backoff waits; it waits for the
// threads, so at most for a connection attempt in flight (connect_timeout).
#ifndef KVARN_CLIENT_LIB_ROUTER_H_
#define KVARN_CLIENT_LIB_ROUTER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/lib/client.h"
#include "client/lib/endpoint_index.h"
#include "common/mutex.h"

namespace kvarn {

struct RouterOptions {
  // kvarnd targets, "unix:/path" or "host:port"; ranked in this order on ties.
  std::vector<std::string> endpoints;
  std::string tenant;        // the sessions' tenant: whose namespace prompts are hashed in
  std::string tenant_token;  // when the daemons authenticate tenants
  std::string admin_token;   // sees every tenant's events (recommended, see above)
  std::string client_name = "kvarn router";
  ClientOptions client;  // TLS; map_pool is forced off (the router maps no pool)
  // One connection attempt (Client::Connect's health check), and the longest Create waits
  // for every endpoint's first attempt.
  absl::Duration connect_timeout = absl::Seconds(2);
  absl::Duration rank_timeout = absl::Seconds(2);  // Rank's default deadline (its Lookups)
  // Reconnect waits: backoff_initial, doubled after each failure, at most backoff_max; reset
  // once a stream has delivered an event.
  absl::Duration backoff_initial = absl::Milliseconds(50);
  absl::Duration backoff_max = absl::Seconds(5);
  bool share_remote_tiers = true;
  double disk_weight = 0.9;
  double remote_weight = 0.5;
};

struct RankOptions {
  bool verify = false;  // answer every endpoint by Lookup, whatever its index
  absl::Duration timeout = absl::ZeroDuration();  // zero: RouterOptions::rank_timeout
};

enum class RouteSource {
  kNone,        // not answered (see status)
  kWatchIndex,  // the router's local index of the endpoint's Watch events
  kLookup,      // a Lookup RPC to the endpoint
};
const char* RouteSourceName(RouteSource s);  // "none", "watch", "lookup"

struct RouteResult {
  size_t endpoint_index = 0;  // position in RouterOptions::endpoints
  std::string endpoint;
  absl::Status status;  // not OK: the endpoint could not be answered, and is ranked last
  RouteSource source = RouteSource::kNone;
  // Prompt tokens the endpoint would adopt (as Lookup's cached_tokens), by where they are.
  uint64_t cached_tokens = 0;
  TierTokens tokens;
  double score = 0;
  uint64_t epoch = 0;  // the endpoint daemon's epoch that answered (0 when none did)
};

// What the router knows about one endpoint's index, for status output and tests.
enum class IndexState {
  kDisconnected,  // no session: connecting, or waiting to retry (last_error says why)
  kPartial,       // a stream is open, but the index is not known complete: Lookup answers
  kComplete,      // a stream is open and the index holds every block the endpoint has
};
const char* IndexStateName(IndexState s);  // "disconnected", "partial", "complete"

struct EndpointInfo {
  std::string endpoint;
  IndexState state = IndexState::kDisconnected;
  uint64_t epoch = 0;  // of the session held (0: none)
  uint32_t tile_tokens = 0;
  size_t indexed_blocks = 0;  // hashes in the index now
  uint64_t events = 0;        // events applied, all streams
  uint64_t streams = 0;       // Watch streams opened so far
  // Why the last stream or connection attempt ended; OK while a stream is open.
  absl::Status last_error;
};

class Router {
 public:
  // INVALID_ARGUMENT for no endpoints, an empty endpoint or tenant, or a weight outside
  // [0, 1]. Starts one thread per endpoint and waits up to connect_timeout for each one's
  // first connection attempt; unreachable endpoints are not an error here (Rank reports them).
  static absl::StatusOr<std::unique_ptr<Router>> Create(RouterOptions options);
  ~Router();
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  // Every endpoint, best first (see the scoring rule above).
  std::vector<RouteResult> Rank(std::span<const uint32_t> prompt, const RankOptions& options = {});

  size_t num_endpoints() const { return endpoints_.size(); }
  EndpointInfo Info(size_t endpoint) const;
  // The endpoint's index matched against the prompt, whatever the index's state (what Rank
  // would use if the index were complete; remote tiers of other endpoints not included).
  // FAILED_PRECONDITION without a session.
  absl::StatusOr<TierTokens> IndexMatch(size_t endpoint, std::span<const uint32_t> prompt) const;

  // Waits until `done()` returns true or `deadline` passes; `done` is evaluated now and after
  // every change any endpoint's thread makes (an event applied, a stream opened or ended),
  // and may call Info and IndexMatch. Whether it returned true.
  bool Await(const std::function<bool()>& done, absl::Time deadline) const;

 private:
  struct Endpoint;
  explicit Router(RouterOptions options);
  void Run(Endpoint* e);
  // One connection: connect, open the session, then watch until the stream ends. Returns
  // whether a stream delivered an event (the backoff then starts over).
  bool ConnectAndWatch(Endpoint* e);
  // Waits for `d` or destruction; false when destroyed.
  bool Backoff(Endpoint* e, absl::Duration d);
  void Changed() const;

  const RouterOptions options_;
  std::vector<std::unique_ptr<Endpoint>> endpoints_;

  // Set once, by the destructor. The backoff waits read it under changes_mu_ and the
  // destructor signals under it, so no wake-up is lost.
  std::atomic<bool> stop_{false};
  // Signalled on every change an endpoint thread makes (Await and the backoff waits wait on
  // it). Never taken while an endpoint's own mutex is held (Await's predicate takes those
  // inside it).
  mutable Mutex changes_mu_;
  mutable CondVar changed_;
  mutable uint64_t generation_ ABSL_GUARDED_BY(changes_mu_) = 0;
};

}  // namespace kvarn

#endif  // KVARN_CLIENT_LIB_ROUTER_H_
