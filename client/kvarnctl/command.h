// What every kvarnctl subcommand shares: its output streams, its exit codes, and the row
// it occupies in main.cc's command table.
//
// A subcommand is a function from its arguments (everything after its name) to an exit
// code. It writes results to `out` and diagnostics, progress and errors to `err`, so
// `kvarnctl ... --json > file` stays machine-readable. Handlers are plain functions, so
// tests call them with string streams.
#ifndef KVARN_CLIENT_KVARNCTL_COMMAND_H_
#define KVARN_CLIENT_KVARNCTL_COMMAND_H_

#include <ostream>
#include <span>
#include <string>
#include <string_view>

#include "kernels/status.h"

namespace kvarn::ctl {

// Exit codes: 2 means "fix the command line or the input" (usage errors and invalid
// input, the codec's kInvalidArgument included); 1 means the work itself failed (a file
// could not be written, a daemon was unreachable).
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

struct CommandIo {
  std::ostream& out;
  std::ostream& err;
  // Whether `err` is an interactive terminal: progress bars redraw in place only there.
  bool err_is_terminal = false;
};

using CommandHandler = int (*)(std::span<const std::string> args, const CommandIo& io);

struct Subcommand {
  std::string_view name;
  std::string_view summary;  // one line, shown by `kvarnctl --help`
  CommandHandler handler;    // `handler({"--help"}, io)` prints the command's own help
};

// Prints "kvarnctl <command>: <message>" to io.err and returns the exit code for `status`.
// REQUIRES: !status.ok().
int ReportError(const CommandIo& io, const CodecStatus& status);

// kExitUsage for kInvalidArgument, kExitFailure otherwise.
int ExitCodeFor(const CodecStatus& status);

// An error for output that could not be written: not the user's input, so exit code 1.
CodecStatus WriteFailure(std::string message);

}  // namespace kvarn::ctl

#endif  // KVARN_CLIENT_KVARNCTL_COMMAND_H_
