#include "client/lib/router.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvarn {

const char* RouteSourceName(RouteSource s) {
  switch (s) {
    case RouteSource::kWatchIndex:
      return "watch";
    case RouteSource::kLookup:
      return "lookup";
    case RouteSource::kNone:
      break;
  }
  return "none";
}

const char* IndexStateName(IndexState s) {
  switch (s) {
    case IndexState::kPartial:
      return "partial";
    case IndexState::kComplete:
      return "complete";
    case IndexState::kDisconnected:
      break;
  }
  return "disconnected";
}

namespace {

// One client and observer session to an endpoint. Shared between the endpoint's thread and
// Rank's lookups; only the endpoint's thread destroys one (see Endpoint::retired).
struct Connection {
  std::unique_ptr<Client> client;
  std::unique_ptr<Session> session;  // declared after client: destroyed first
  BlockHash ns{};
  bool has_ns = false;  // false: the daemon sends no namespace, so only Lookup can answer
  uint32_t tile_tokens = 0;
  uint64_t epoch = 0;
};

}  // namespace

struct Router::Endpoint {
  size_t position = 0;
  std::string target;
  std::thread thread;

  mutable Mutex mu;
  std::shared_ptr<Connection> conn ABSL_GUARDED_BY(mu);
  // The open stream's context, for the destructor's TryCancel.
  grpc::ClientContext* watch_ctx ABSL_GUARDED_BY(mu) = nullptr;
  EndpointIndex blocks ABSL_GUARDED_BY(mu);
  IndexState state ABSL_GUARDED_BY(mu) = IndexState::kDisconnected;
  uint64_t events ABSL_GUARDED_BY(mu) = 0;
  uint64_t streams ABSL_GUARDED_BY(mu) = 0;
  absl::Status last_error ABSL_GUARDED_BY(mu) = absl::UnavailableError("not connected yet");
  bool first_attempt_done ABSL_GUARDED_BY(mu) = false;
  // Connections this thread let go of while Rank may still hold them: destroyed here once
  // nobody else does, so Rank never runs a session's Close.
  std::vector<std::shared_ptr<Connection>> retired ABSL_GUARDED_BY(mu);
};

namespace {

absl::StatusOr<BlockHash> HashFromBytes(const std::string& bytes) {
  BlockHash h;
  if (bytes.size() != h.size()) return absl::InvalidArgumentError("not a 32-byte hash");
  std::memcpy(h.data(), bytes.data(), h.size());
  return h;
}

}  // namespace

Router::Router(RouterOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<Router>> Router::Create(RouterOptions options) {
  if (options.endpoints.empty())
    return absl::InvalidArgumentError("no endpoints: give at least one kvarnd target");
  for (const std::string& t : options.endpoints) {
    if (t.empty()) return absl::InvalidArgumentError("an endpoint is empty");
  }
  if (options.tenant.empty()) return absl::InvalidArgumentError("the tenant is empty");
  if (!(options.disk_weight >= 0 && options.disk_weight <= 1 && options.remote_weight >= 0 &&
        options.remote_weight <= 1)) {
    return absl::InvalidArgumentError("disk_weight and remote_weight must be in [0, 1]");
  }
  if (options.connect_timeout <= absl::ZeroDuration() ||
      options.rank_timeout <= absl::ZeroDuration() ||
      options.backoff_initial <= absl::ZeroDuration() ||
      options.backoff_max < options.backoff_initial) {
    return absl::InvalidArgumentError(
        "timeouts must be positive and backoff_max >= backoff_initial");
  }
  std::unique_ptr<Router> r(new Router(std::move(options)));
  for (size_t i = 0; i < r->options_.endpoints.size(); ++i) {
    auto e = std::make_unique<Endpoint>();
    e->position = i;
    e->target = r->options_.endpoints[i];
    r->endpoints_.push_back(std::move(e));
  }
  for (auto& e : r->endpoints_) {
    Endpoint* ep = e.get();
    ep->thread = std::thread([router = r.get(), ep] { router->Run(ep); });
  }
  // The first attempt is Connect (connect_timeout), then Describe, OpenSession and Stats
  // (each bounded by the client's rpc_timeout, also connect_timeout).
  const absl::Time deadline = absl::Now() + 4 * r->options_.connect_timeout;
  r->Await(
      [&] {
        for (const auto& e : r->endpoints_) {
          MutexLock lock(&e->mu);
          if (!e->first_attempt_done) return false;
        }
        return true;
      },
      deadline);
  return r;
}

Router::~Router() {
  stop_.store(true);
  for (auto& e : endpoints_) {
    MutexLock lock(&e->mu);
    if (e->watch_ctx != nullptr) e->watch_ctx->TryCancel();
  }
  {
    MutexLock lock(&changes_mu_);
    changed_.SignalAll();
  }
  for (auto& e : endpoints_) {
    if (e->thread.joinable()) e->thread.join();
  }
}

void Router::Changed() const {
  MutexLock lock(&changes_mu_);
  ++generation_;
  changed_.SignalAll();
}

bool Router::Await(const std::function<bool()>& done, absl::Time deadline) const {
  MutexLock lock(&changes_mu_);
  for (;;) {
    if (done()) return true;
    if (changed_.WaitUntil(&changes_mu_, deadline)) return done();
  }
}

bool Router::Backoff(Endpoint*, absl::Duration d) {
  const absl::Time deadline = absl::Now() + d;
  MutexLock lock(&changes_mu_);
  while (!stop_.load()) {
    if (changed_.WaitUntil(&changes_mu_, deadline)) break;
  }
  return !stop_.load();
}

void Router::Run(Endpoint* e) {
  absl::Duration backoff = options_.backoff_initial;
  while (!stop_.load()) {
    const bool delivered = ConnectAndWatch(e);
    {
      MutexLock lock(&e->mu);
      e->first_attempt_done = true;
      std::erase_if(e->retired,
                    [](const std::shared_ptr<Connection>& c) { return c.use_count() == 1; });
    }
    Changed();
    if (stop_.load()) break;
    backoff = delivered ? options_.backoff_initial : std::min(backoff * 2, options_.backoff_max);
    if (!Backoff(e, backoff)) break;
  }
  std::vector<std::shared_ptr<Connection>> retired;
  {
    MutexLock lock(&e->mu);
    retired.swap(e->retired);
    if (e->conn != nullptr) retired.push_back(std::move(e->conn));
    e->state = IndexState::kDisconnected;
  }
  retired.clear();  // closes the sessions, outside the lock
}

bool Router::ConnectAndWatch(Endpoint* e) {
  const auto fail = [&](const absl::Status& s) {
    MutexLock lock(&e->mu);
    e->last_error = s;
    return false;
  };
  ClientOptions co = options_.client;
  co.map_pool = false;
  co.rpc_timeout = options_.connect_timeout;
  auto client = Client::Connect(e->target, co, options_.connect_timeout);
  if (!client.ok()) return fail(client.status());
  auto conn = std::make_shared<Connection>();
  conn->client = std::move(*client);
  auto d = conn->client->Describe();
  if (!d.ok()) return fail(d.status());
  SessionOptions so;
  so.tenant = options_.tenant;
  so.tenant_token = options_.tenant_token;
  so.admin_token = options_.admin_token;
  so.layout = Client::LayoutOf(*d);
  so.observer = true;
  so.client_name = options_.client_name;
  auto session = conn->client->OpenSession(so);
  if (!session.ok()) return fail(session.status());
  conn->session = std::move(*session);
  conn->epoch = conn->session->epoch();
  conn->tile_tokens = conn->session->pool().tile_tokens();
  if (conn->tile_tokens == 0) conn->tile_tokens = d->tile_tokens();
  if (auto ns = HashFromBytes(conn->session->prefix_namespace()); ns.ok()) {
    conn->ns = *ns;
    conn->has_ns = true;
  }

  grpc::ClientContext ctx;
  {
    MutexLock lock(&e->mu);
    if (stop_.load()) return false;
    e->watch_ctx = &ctx;
  }
  v1::WatchRequest req;
  *req.mutable_session() = conn->session->Ref();
  auto reader = conn->client->stub().Watch(&ctx, req);
  // Read after the stream started: records the disk tier found at start come with no event,
  // so an index that began with any on disk can never be complete. A Stats that fails
  // counts as not empty.
  bool disk_empty = false;
  if (auto st = conn->session->Stats(); st.ok()) {
    disk_empty = true;
    for (const auto& t : st->tiers()) {
      if (TierBitOf(t.name()) == kInDisk && t.blocks() > 0) disk_empty = false;
    }
  }
  {
    MutexLock lock(&e->mu);
    if (e->conn != nullptr) e->retired.push_back(std::move(e->conn));
    e->conn = conn;
    e->blocks.Clear();
    e->state = IndexState::kPartial;
    e->last_error = absl::OkStatus();
    ++e->streams;
    e->first_attempt_done = true;
  }
  Changed();

  bool delivered = false;
  v1::BlockEvent ev;
  while (reader->Read(&ev)) {
    auto hash = HashFromBytes(ev.hash());
    {
      MutexLock lock(&e->mu);
      if (!delivered) {
        // Event number 1 first: nothing was logged before this stream started.
        if (ev.sequence_number() == 1 && disk_empty && conn->has_ns)
          e->state = IndexState::kComplete;
        delivered = true;
      }
      ++e->events;
      if (hash.ok()) {
        if (ev.kind() == v1::BlockEvent::KIND_STORED) {
          e->blocks.Stored(*hash, TierBitOf(ev.tier()));
        } else if (ev.kind() == v1::BlockEvent::KIND_REMOVED) {
          e->blocks.Removed(*hash, TierBitOf(ev.tier()));
        }
      }
    }
    Changed();
  }
  const grpc::Status end = reader->Finish();
  absl::Status why = FromGrpc(end);
  if (why.ok()) why = absl::UnavailableError("the Watch stream ended (kvarnd is shutting down)");
  {
    MutexLock lock(&e->mu);
    e->watch_ctx = nullptr;
    e->blocks.Clear();
    e->state = IndexState::kDisconnected;
    e->last_error = stop_.load() ? absl::CancelledError("the router is shutting down") : why;
    e->retired.push_back(std::move(e->conn));
  }
  return delivered;
}

EndpointInfo Router::Info(size_t endpoint) const {
  const Endpoint& e = *endpoints_.at(endpoint);
  EndpointInfo info;
  info.endpoint = e.target;
  MutexLock lock(&e.mu);
  info.state = e.state;
  if (e.conn != nullptr) {
    info.epoch = e.conn->epoch;
    info.tile_tokens = e.conn->tile_tokens;
  }
  info.indexed_blocks = e.blocks.size();
  info.events = e.events;
  info.streams = e.streams;
  info.last_error = e.last_error;
  return info;
}

absl::StatusOr<TierTokens> Router::IndexMatch(size_t endpoint,
                                              std::span<const uint32_t> prompt) const {
  const Endpoint& e = *endpoints_.at(endpoint);
  std::shared_ptr<Connection> conn;
  {
    MutexLock lock(&e.mu);
    conn = e.conn;
  }
  if (conn == nullptr || !conn->has_ns) {
    return absl::FailedPreconditionError(
        absl::StrCat(e.target, ": no session with a prefix namespace"));
  }
  const std::vector<BlockHash> hashes = PromptBlockHashes(conn->ns, conn->tile_tokens, prompt);
  MutexLock lock(&e.mu);
  if (e.conn != conn)
    return absl::UnavailableError(absl::StrCat(e.target, ": the session changed meanwhile"));
  return e.blocks.Match(hashes, conn->tile_tokens);
}

std::vector<RouteResult> Router::Rank(std::span<const uint32_t> prompt, const RankOptions& rank) {
  const absl::Time deadline =
      absl::Now() + (rank.timeout > absl::ZeroDuration() ? rank.timeout : options_.rank_timeout);
  const size_t n = endpoints_.size();
  std::vector<RouteResult> results(n);
  std::vector<std::shared_ptr<Connection>> conns(n);
  std::vector<std::vector<uint8_t>> places(n);
  std::vector<bool> from_index(n, false);
  // Hashes per (namespace, tile): nodes sharing a salt secret share them.
  std::map<std::pair<BlockHash, uint32_t>, std::vector<BlockHash>> hashes;

  for (size_t i = 0; i < n; ++i) {
    Endpoint& e = *endpoints_[i];
    RouteResult& r = results[i];
    r.endpoint_index = i;
    r.endpoint = e.target;
    {
      MutexLock lock(&e.mu);
      conns[i] = e.conn;
      if (conns[i] == nullptr)
        r.status = e.last_error.ok() ? absl::UnavailableError("not connected") : e.last_error;
    }
    if (conns[i] == nullptr || !conns[i]->has_ns || rank.verify) continue;
    const Connection& c = *conns[i];
    auto [it, inserted] = hashes.try_emplace({c.ns, c.tile_tokens});
    if (inserted) it->second = PromptBlockHashes(c.ns, c.tile_tokens, prompt);
    MutexLock lock(&e.mu);
    if (e.conn == conns[i] && e.state == IndexState::kComplete) {
      places[i] = e.blocks.Places(it->second);
      from_index[i] = true;
    }
  }

  // Remote tiers are one store shared by the nodes: what any complete index saw there counts
  // for every endpoint of that namespace.
  if (options_.share_remote_tiers) {
    std::map<std::pair<BlockHash, uint32_t>, std::vector<uint8_t>> remote;
    for (size_t i = 0; i < n; ++i) {
      if (!from_index[i]) continue;
      auto& u = remote[{conns[i]->ns, conns[i]->tile_tokens}];
      u.resize(places[i].size(), 0);
      for (size_t b = 0; b < places[i].size(); ++b) u[b] |= places[i][b] & kInRemote;
    }
    for (size_t i = 0; i < n; ++i) {
      if (!from_index[i]) continue;
      const auto& u = remote[{conns[i]->ns, conns[i]->tile_tokens}];
      for (size_t b = 0; b < places[i].size(); ++b) places[i][b] |= u[b];
    }
  }

  // Lookups for the rest, in parallel, each under the call's deadline.
  std::vector<std::thread> lookups;
  for (size_t i = 0; i < n; ++i) {
    RouteResult& r = results[i];
    if (conns[i] == nullptr) continue;
    r.epoch = conns[i]->epoch;
    if (from_index[i]) {
      r.source = RouteSource::kWatchIndex;
      r.tokens = MatchPlaces(places[i], conns[i]->tile_tokens);
      r.cached_tokens = r.tokens.total();
      continue;
    }
    lookups.emplace_back([&r, conn = conns[i], prompt, deadline] {
      v1::LookupRequest req;
      *req.mutable_session() = conn->session->Ref();
      req.mutable_prompt_tokens()->Add(prompt.begin(), prompt.end());
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(deadline));
      v1::LookupResponse resp;
      const absl::Status s = FromGrpc(conn->client->stub().Lookup(&ctx, req, &resp));
      if (!s.ok()) {
        r.status = s;
        return;
      }
      r.source = RouteSource::kLookup;
      r.cached_tokens = resp.cached_tokens();
      r.tokens.pool = resp.pool_tokens();
      for (const auto& t : resp.tiers()) {
        (TierBitOf(t.tier()) == kInDisk ? r.tokens.disk : r.tokens.remote) += t.tokens();
      }
    });
  }
  for (std::thread& t : lookups) t.join();

  for (RouteResult& r : results) {
    if (!r.status.ok()) {
      r.source = RouteSource::kNone;
      r.cached_tokens = 0;
      r.tokens = {};
      continue;
    }
    r.score = static_cast<double>(r.tokens.pool) +
              options_.disk_weight * static_cast<double>(r.tokens.disk) +
              options_.remote_weight * static_cast<double>(r.tokens.remote);
  }
  std::stable_sort(results.begin(), results.end(), [](const RouteResult& a, const RouteResult& b) {
    if (a.status.ok() != b.status.ok()) return a.status.ok();
    return a.score > b.score;
  });
  return results;
}

}  // namespace kvarn
