// The expected state, kept by the controller outside every process from the clients' lines:
// which session each client holds, the sequences in it and their token counts. Each DONE line
// is checked against what the model predicts (an append of n tokens adds n; a fork copies its
// parent's count; a new sequence adopts at most the full tiles of len - 1 prompt tokens; ids
// are never reused within one daemon epoch), and at a checkpoint (every client parked) the
// daemon's own listing is compared with the model.
//
// A session the controller knows has ended (its client was killed, its lease expired, the
// daemon restarted, the client reported it lost) is dropped with its sequences; lines that
// still arrive for it are not applied. Not thread-safe.
#ifndef KVARN_TESTS_CHAOS_MODEL_H_
#define KVARN_TESTS_CHAOS_MODEL_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "kvarn/v1/kvarn.pb.h"
#include "tests/chaos/protocol.h"

namespace kvarn::chaos {

class Model {
 public:
  explicit Model(int tile) : tile_(tile) {}

  // A client opened `session` (its previous one, if any, has ended).
  void Open(int client, uint64_t session);
  // The client's session ended (or the client is gone).
  void EndSession(int client);
  void Forget(int client) { clients_.erase(client); }
  // The daemon restarted: every session and sequence is gone, ids start over.
  void NewEpoch();

  // Applies one DONE line of `client`.
  void Done(int client, const Line& done);

  bool live(int client) const;
  uint64_t session(int client) const;

  // Compares the daemon's listing (admin: all tenants) with the model for the clients in
  // `parked` (every client alive and parked at a checkpoint). Sequences of sessions in
  // `ignore` (the observer's, clients that did not park) are skipped; any other sequence is an
  // orphan. Returns the number of mismatches found (also added to mismatches()).
  uint64_t Compare(const v1::ListSequencesResponse& list, const v1::StatsResponse& stats,
                   const std::set<int>& parked, const std::set<uint64_t>& ignore);

  uint64_t mismatches() const { return mismatches_; }
  // The first few mismatches, in words.
  const std::vector<std::string>& notes() const { return notes_; }

 private:
  struct ClientState {
    uint64_t session = 0;
    bool live = false;
    std::map<uint64_t, uint64_t> seqs;  // sequence id -> tokens
  };
  void Mismatch(const std::string& what);

  const int tile_;
  std::map<int, ClientState> clients_;
  std::set<uint64_t> seen_ids_;  // sequence ids the daemon issued in this epoch
  uint64_t mismatches_ = 0;
  std::vector<std::string> notes_;
};

}  // namespace kvarn::chaos

#endif  // KVARN_TESTS_CHAOS_MODEL_H_
