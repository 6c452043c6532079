// The line protocol between kvarn_chaos's controller and its client processes.
//
// A client writes one line per event on stdout (a pipe to the controller) and flushes it:
//   OPEN session=<id> pid=<pid> epoch=<e> tenant=<t>     a session was opened (also after a reopen)
//   OPEN_FAIL code=<c>                                   OpenSession failed; the client retries
//   BEGIN op=<op> seal=<0|1> seq=<id> [n=<k> via=shm|inline]
//                                                        before every operation; seal=1 when the
//                                                        append fills the tail (the daemon seals)
//   DONE op=<op> code=<grpc code> seq=<id> tokens=<n> [n=<k>] [parent=<id>] [len=<l>]
//                                                        after it; tokens: the sequence's count
//                                                        as the daemon answered (or as the client
//                                                        last knew it, on failure)
//   LOST session=<id>                                    the session ended under the client
//   EXPIRY op=<op> code=<c> / ACCEPTED_AFTER_EXPIRY op=<op> / EXPIRY_DONE session=<id> calls=<n>
//       accepted=<k> wrong=<w>                           replay of every call on an expired session
//   OLD op=<op> code=<c> / OLD_HANDLE_ACCEPTED op=<op> / REPLAYED sessions=<s> calls=<n>
//       accepted=<k> wrong=<w>                           replay of old-epoch handles after a restart
//   PAUSED session=<id>                                  parked at a checkpoint
//   CONTINUED from=<pid> code=<si_code>                  the process got SIGCONT (from whom)
//   ERROR what=<...> code=<c> msg="..."                  the client gives up (exits 1)
// The controller writes commands on the client's stdin, read between operations:
//   EXPIRED session=<id>   that session's lease ended while the client was stopped: replay
//                          every call on it (all must be refused), then reopen
//   RESTARTED epoch=<e>    the daemon was killed and restarted: replay old handles (all must
//                          get FAILED_PRECONDITION), print REPLAYED, drop every session (one
//                          of the new daemon too) and reconnect (new Client, new session)
//   PAUSE / GO             park at the top of the loop (print PAUSED) until GO
#ifndef KVARN_TESTS_CHAOS_PROTOCOL_H_
#define KVARN_TESTS_CHAOS_PROTOCOL_H_

#include <cstdint>
#include <map>
#include <string>

namespace kvarn::chaos {

// A protocol line: its leading word and its key=value fields.
struct Line {
  std::string word;
  std::map<std::string, std::string> fields;

  // The field as an integer; `def` when absent or not a number.
  int64_t Int(const std::string& key, int64_t def = -1) const;
  uint64_t U64(const std::string& key, uint64_t def = 0) const;
  std::string Str(const std::string& key, const std::string& def = "") const;
};
Line ParseLine(const std::string& text);

// Writes one line to stdout and flushes it.
void Say(const std::string& line);

// Milliseconds on std::chrono::steady_clock since an arbitrary start.
double NowMs();

// gRPC status code numbers (the same as absl::StatusCode).
inline constexpr int kOk = 0;
inline constexpr int kInvalidArgument = 3;
inline constexpr int kDeadlineExceeded = 4;
inline constexpr int kNotFound = 5;
inline constexpr int kResourceExhausted = 8;
inline constexpr int kFailedPrecondition = 9;
inline constexpr int kUnavailable = 14;
const char* CodeName(int code);

}  // namespace kvarn::chaos

#endif  // KVARN_TESTS_CHAOS_PROTOCOL_H_
