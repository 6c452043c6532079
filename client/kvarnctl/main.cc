// kvarnctl: the command-line tool of kvarnd.
//
// Commands are rows of kCommands below. To add one (status, sequences, evict, watch, demo),
// write `int RunX(std::span<const std::string> args, const CommandIo& io)` in its own file
// (see command.h for the conventions: results on io.out, diagnostics on io.err, exit codes),
// add the file to the kvarnctl library in CMakeLists.txt, and add a row here. `--help` as
// the command's argument must print its help and return 0.
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <span>
#include <string>
#include <vector>

#include "client/kvarnctl/codec_command.h"
#include "client/kvarnctl/command.h"
#include "client/kvarnctl/daemon_commands.h"

namespace kvarn::ctl {
namespace {

constexpr Subcommand kCommands[] = {
    {"codec", "the codec on your own K/V (.npy): encode, decode, eval, synth; no daemon needed",
     &RunCodecCommand},
    {"status", "a running kvarnd: capacity, usage by block state, prefix hit rate, sessions",
     &RunStatus},
    {"sequences", "the live sequences of your tenant (all with the admin token)", &RunSequences},
    {"evict", "evict cached blocks: yours, a tenant's, N bytes or all", &RunEvict},
    {"watch", "stream block stored/removed events with their prefix hashes", &RunWatch},
    {"demo", "simulated workers sharing system prompts through kvarnd, with a summary",
     &RunDemo},
    {"health", "kvarnd's gRPC health check (SERVING or not), bounded by a deadline: for probes",
     &RunHealth},
    {"route", "rank kvarnd endpoints by how much of a prompt each has cached, by tier", &RunRoute},
};

void PrintHelp(std::ostream& os) {
  os << "usage: kvarnctl <command> [args]\n\n"
        "The command-line tool of kvarnd, the KVarN KV-cache daemon.\n\n"
        "Commands:\n";
  size_t width = 4;
  for (const Subcommand& c : kCommands) width = std::max(width, c.name.size());
  for (const Subcommand& c : kCommands) {
    os << "  " << c.name << std::string(width + 3 - c.name.size(), ' ') << c.summary << "\n";
  }
  os << "  help" << std::string(width - 1, ' ') << "help <command> [subcommand]: a command's help\n"
     << "\nEvery command takes --json (results as JSON on stdout; errors stay text on stderr).\n"
     << "Commands that talk to kvarnd connect to --target, else $KVARN_TARGET, else\n"
     << kDefaultTarget << ". See docs/kvarnctl.md.\n"
     << "\nExit status: 0 success, 1 the work failed, 2 bad usage or input.\n";
}

const Subcommand* FindCommand(const std::string& name) {
  for (const Subcommand& c : kCommands) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

int UnknownCommand(const CommandIo& io, const std::string& name) {
  std::string names;
  for (const Subcommand& c : kCommands) names += (names.empty() ? "" : ", ") + std::string(c.name);
  return ReportError(io, InvalidArgument("unknown command '" + name + "'; commands: " + names +
                                         " (see kvarnctl --help)"));
}

int Main(std::span<const std::string> args, const CommandIo& io) {
  if (args.empty()) {
    PrintHelp(io.err);
    return kExitUsage;
  }
  const std::string& name = args[0];
  if (name == "--help" || name == "-h") {
    PrintHelp(io.out);
    return kExitOk;
  }
  if (name == "help") {
    if (args.size() == 1) {
      PrintHelp(io.out);
      return kExitOk;
    }
    const Subcommand* c = FindCommand(args[1]);
    if (c == nullptr) return UnknownCommand(io, args[1]);
    // "help codec eval" -> "codec eval --help".
    std::vector<std::string> rest(args.begin() + 2, args.end());
    rest.push_back("--help");
    return c->handler(rest, io);
  }
  const Subcommand* c = FindCommand(name);
  if (c == nullptr) return UnknownCommand(io, name);
  return c->handler(args.subspan(1), io);
}

}  // namespace
}  // namespace kvarn::ctl

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  const kvarn::ctl::CommandIo io{std::cout, std::cerr, isatty(STDERR_FILENO) == 1};
  const int code = kvarn::ctl::Main(args, io);
  std::cout.flush();
  return std::cout.fail() ? kvarn::ctl::kExitFailure : code;
}
