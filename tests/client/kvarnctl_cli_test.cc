// The kvarnctl binary end to end: command table, help, exit codes, stdout vs stderr.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/client/kvarnctl_test_util.h"

#ifndef KVARNCTL_BINARY
#error "KVARNCTL_BINARY must name the kvarnctl executable"
#endif

namespace kvarn::ctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

struct Process {
  int code = -1;
  std::string out, err;
};

std::string Slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Runs kvarnctl with `args` (shell words, already quoted where needed).
Process Kvarnctl(const std::string& args) {
  const std::string dir = ::testing::TempDir();
  const std::string tag = std::to_string(getpid());  // tests run as parallel processes
  const std::string out = dir + "/kvarnctl_cli." + tag + ".out", err = dir + "/kvarnctl_cli." + tag + ".err";
  const std::string cmd =
      std::string("'") + KVARNCTL_BINARY + "' " + args + " >'" + out + "' 2>'" + err + "'";
  const int status = std::system(cmd.c_str());
  Process p;
  p.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  p.out = Slurp(out);
  p.err = Slurp(err);
  return p;
}

TEST(KvarnctlCliTest, HelpListsTheCommandTable) {
  const Process p = Kvarnctl("--help");
  EXPECT_EQ(p.code, 0);
  EXPECT_THAT(p.out, StartsWith("usage: kvarnctl <command> [args]"));
  EXPECT_THAT(p.out, HasSubstr("  codec       the codec on your own K/V"));
  EXPECT_THAT(p.out, HasSubstr("Exit status: 0 success, 1 the work failed, 2 bad usage or input."));
  EXPECT_EQ(Kvarnctl("help").out, p.out);
}

TEST(KvarnctlCliTest, NoArgumentsPrintsUsageToStderrAndExits2) {
  const Process p = Kvarnctl("");
  EXPECT_EQ(p.code, 2);
  EXPECT_EQ(p.out, "");
  EXPECT_THAT(p.err, HasSubstr("usage: kvarnctl"));
}

TEST(KvarnctlCliTest, UnknownCommandIsAClearErrorWithExit2) {
  const Process p = Kvarnctl("stauts");
  EXPECT_EQ(p.code, 2);
  EXPECT_EQ(p.err,
            "kvarnctl: error: unknown command 'stauts'; commands: codec, status, sequences, evict, watch, demo (see kvarnctl --help)\n");
  EXPECT_EQ(Kvarnctl("help stauts").code, 2);
}

TEST(KvarnctlCliTest, HelpForACommandAndASubcommand) {
  Process p = Kvarnctl("help codec");
  EXPECT_EQ(p.code, 0);
  EXPECT_THAT(p.out, HasSubstr("Subcommands:"));
  EXPECT_THAT(p.out, HasSubstr("  synth   write SYNTHETIC K/V"));
  p = Kvarnctl("help codec eval");
  EXPECT_EQ(p.code, 0);
  EXPECT_THAT(p.out, HasSubstr("usage: kvarnctl codec eval"));
  EXPECT_THAT(p.out, HasSubstr("JSON output (--json)"));
  EXPECT_EQ(Kvarnctl("codec eval --help").out, p.out);
  EXPECT_EQ(Kvarnctl("codec help eval").out, p.out);
  p = Kvarnctl("codec frobnicate");
  EXPECT_EQ(p.code, 2);
  EXPECT_THAT(p.err, HasSubstr("codec: unknown subcommand 'frobnicate'"));
  p = Kvarnctl("codec");
  EXPECT_EQ(p.code, 2);
  EXPECT_THAT(p.err, HasSubstr("usage: kvarnctl codec <subcommand>"));
}

TEST(KvarnctlCliTest, BadFlagsExit2WithTheFlagNamed) {
  Process p = Kvarnctl("codec eval --keys k.npy --values v.npy --preset fp16 --jsn");
  EXPECT_EQ(p.code, 2);
  EXPECT_EQ(p.err, "kvarnctl: error: codec eval: unknown flag --jsn (did you mean --json?)\n");
  p = Kvarnctl("codec synth --out-dir /tmp/x --tokens");
  EXPECT_EQ(p.code, 2);
  EXPECT_THAT(p.err, HasSubstr("--tokens needs a value (T)"));
}

TEST(KvarnctlCliTest, SynthThenEvalEndToEnd) {
  const std::string dir = testing::ScratchDir();
  Process p = Kvarnctl("codec synth --out-dir '" + dir + "' --tokens 1024 --heads 2");
  ASSERT_EQ(p.code, 0) << p.err;
  p = Kvarnctl("codec eval --keys '" + dir + "/k.npy' --values '" + dir + "/v.npy' --queries '" +
               dir + "/q.npy' --preset kvarn_k4v2_g128 --preset kivi_k4v2_g128 --json " +
               "--progress always");
  ASSERT_EQ(p.code, 0) << p.err;
  const auto rows = testing::ParseJsonLines(p.out);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0]["preset"].AsString(), "kvarn_k4v2_g128");
  EXPECT_EQ(rows[0]["tiles_per_head"].AsNumber(), 7);
  // The progress bar went to stderr, never stdout.
  EXPECT_THAT(p.err, HasSubstr("100%"));
  EXPECT_THAT(p.out, Not(HasSubstr("\r")));
  // Not a terminal (stderr is a file here) and no --progress: stderr stays clean.
  p = Kvarnctl("codec eval --keys '" + dir + "/k.npy' --values '" + dir +
               "/v.npy' --preset kvarn_k4v2_g128 --preset kivi_k4v2_g128 --preset fp16");
  ASSERT_EQ(p.code, 0);
  EXPECT_EQ(p.err, "");
  EXPECT_THAT(p.out, HasSubstr("kivi_k4v2_g128"));
}

}  // namespace
}  // namespace kvarn::ctl
