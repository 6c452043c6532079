// Sessions: a client's credential, its lease, its tail slots and its sequences' ids.
//
// Credential. OpenSession draws a 256-bit secret from the OS CSPRNG; every later call and every
// keep-alive stream presents (id, epoch, secret). Find compares the secret in constant time and
// answers an unknown id, an ended session and a wrong secret with the same NOT_FOUND, so ids
// alone grant nothing and cannot be probed. A stale epoch (the daemon restarted) is
// FAILED_PRECONDITION: epochs are public, the answer tells the client to reconnect.
//
// Lease (the rule, in Expired): a session ends when
//   - it was not renewed for lease_ttl (a hung or silent client), or
//   - its keep-alive stream, once attached, has been detached for grace (client death
//     closes the socket).
// Only KeepAlive messages and calls that change the session's state renew it (Renew); reads
// (Stats, ListSequences, Watch, Lookup, Read, Table) never do, so a client that only watches
// cannot keep a lease alive.
//
// Not thread-safe: KvCore serializes access.
#ifndef KVARN_DAEMON_CORE_SESSIONS_H_
#define KVARN_DAEMON_CORE_SESSIONS_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/core/core_types.h"
#include "daemon/core/memory.h"
#include "daemon/core/quota.h"

namespace kvarn {

struct SessionState {
  SessionId id = 0;
  SessionSecret secret{};
  uint32_t tenant = 0;
  std::string client_name;
  bool admin = false;
  bool observer = false;
  std::unique_ptr<Region> tail_region;
  uint32_t slots = 0;
  std::vector<uint32_t> free_slots;
  absl::flat_hash_set<SequenceId> sequences;
  int streams = 0;
  bool stream_seen = false;
  bool closing = false;  // ended; waiting for in-flight calls on its sequences
  absl::Time renewed;
  absl::Time disconnected_at;
  // The process its memory was lent to (descriptor channel): 0 before, kForeignPeer for a
  // process in another PID namespace (its pid unknown).
  int peer_pid = 0;
  static constexpr int kForeignPeer = -1;
  uint32_t watchers = 0;
};

class SessionTable {
 public:
  SessionTable(uint64_t epoch, absl::Duration lease_ttl, absl::Duration grace, UsageLedger* usage)
      : epoch_(epoch), lease_ttl_(lease_ttl), grace_(grace), usage_(usage) {}

  // The live session `ref` names, after the epoch and credential checks. No renewal.
  absl::StatusOr<SessionState*> Find(const SessionRef& ref);
  absl::StatusOr<const SessionState*> Find(const SessionRef& ref) const;
  // Any session by id, live or closing (nullptr if none): for the core's own bookkeeping.
  SessionState* Get(SessionId id);
  const SessionState* Get(SessionId id) const;

  // Adds a session (id and secret already drawn), charging its tenant's usage.
  SessionState& Add(SessionState s);
  // Removes a closing session; returns its tail region for destruction outside the lock.
  std::unique_ptr<Region> Remove(SessionId id);
  // Ends the session's lease: it is no longer found; its usage is uncharged now.
  void MarkClosing(SessionState& s);

  void Renew(SessionState& s, absl::Time now) { s.renewed = now; }
  void StreamAttached(SessionState& s, absl::Time now);
  void StreamDetached(SessionState& s, absl::Time now);
  // Live sessions whose lease has run out at `now` (the rule above).
  std::vector<SessionId> Expired(absl::Time now) const;

  // Live (not closing) sessions, all or of one tenant.
  std::vector<const SessionState*> Live() const;
  uint32_t live_count() const { return live_; }
  uint32_t observer_count() const { return observers_; }
  uint32_t tail_slots_reserved() const { return tail_slots_; }
  // Reserves / returns slots for a session being opened (before Add, so the budget holds
  // while its region is created outside the lock).
  void Reserve(uint32_t tenant, uint32_t slots);
  void Unreserve(uint32_t tenant, uint32_t slots);
  const absl::flat_hash_map<SessionId, SessionState>& all() const { return sessions_; }

 private:
  const uint64_t epoch_;
  const absl::Duration lease_ttl_, grace_;
  UsageLedger* const usage_;
  absl::flat_hash_map<SessionId, SessionState> sessions_;
  uint32_t live_ = 0, observers_ = 0, tail_slots_ = 0;
};

}  // namespace kvarn

#endif  // KVARN_DAEMON_CORE_SESSIONS_H_
