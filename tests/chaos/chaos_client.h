// The client role of kvarn_chaos (`kvarn_chaos client ...`): one process, one session at a
// time, looping random operations until it is killed; see protocol.h for what it prints and
// reads.
//
// Operations: CreateSequence with a prefix of one of a few shared prompts (so sequences of
// one tenant share prefix blocks), appends through shared memory (Stage + Commit) and in the
// request (AppendInline), Fork, Release and Read. A sequence's content is a function of its
// prompt, its length and a per-sequence base, so forks and sequences with the same prompt
// seal identical tiles (racing seals the daemon deduplicates).
#ifndef KVARN_TESTS_CHAOS_CHAOS_CLIENT_H_
#define KVARN_TESTS_CHAOS_CHAOS_CLIENT_H_

#include <cstdint>
#include <string>

#include "client/lib/client.h"
#include "tests/integration/kv_data.h"

namespace kvarn::chaos {

// The model of every run is it::SmallLayout() (tests/integration/kv_data.h).
inline constexpr int kTile = 64;

struct ClientArgs {
  std::string target;            // unix:/path of kvarnd
  std::string tenant = "tenant-a";
  uint64_t seed = 1;
  uint64_t serial = 0;           // the controller's number for this process
  uint32_t max_sequences = 4;    // tail slots of the session
  int think_us = 2000;           // a uniform pause in [0, think_us] between operations
};

// Runs until stdin reaches EOF (0) or the client gives up (1, after printing ERROR).
int RunClient(const ClientArgs& args);

}  // namespace kvarn::chaos

#endif  // KVARN_TESTS_CHAOS_CHAOS_CLIENT_H_
