// The kvarnctl binary end to end without a daemon (command table, help, exit codes, stdout
// vs stderr, --json of the codec commands, flags checked before connecting, the target and
// its environment, health against nothing), and the pieces its output is made of: the JSON
// writer, percent shares, the health check's wire format.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "client/kvarnctl/codec_command.h"
#include "client/kvarnctl/daemon_commands.h"
#include "client/kvarnctl/health_wire.h"
#include "client/kvarnctl/json.h"
#include "client/kvarnctl/shares.h"
#include "tests/client/kvarnctl_test_util.h"

#ifndef KVARNCTL_BINARY
#error "KVARNCTL_BINARY must name the kvarnctl executable"
#endif

namespace kvarn::ctl {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::StartsWith;
using kvarn::testing::Json;

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

// Runs kvarnctl with `args` (shell words, already quoted where needed), with kvarnctl's
// variables removed from the environment (whatever the caller's shell has) and then `env`
// ("NAME=value" words) added.
Process Kvarnctl(const std::string& args, const std::string& env = "") {
  const std::string dir = ::testing::TempDir();
  const std::string tag = std::to_string(getpid());  // tests run as parallel processes
  const std::string out = dir + "/kvarnctl_cli." + tag + ".out", err = dir + "/kvarnctl_cli." + tag + ".err";
  const std::string cmd = "env -u KVARN_TARGET -u KVARN_ADMIN_TOKEN_FILE -u KVARN_TENANT_TOKEN_FILE " + env + " '" +
                          KVARNCTL_BINARY + "' " + args + " >'" + out + "' 2>'" + err + "'";
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
            "kvarnctl: error: unknown command 'stauts'; commands: codec, status, sequences, evict, watch, demo, "
            "health, route (see kvarnctl --help)\n");
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

// ---- The JSON writer ----

TEST(JsonWriterTest, EscapesPerRfc8259AndReplacesInvalidUtf8) {
  // Quote, backslash, the short escapes, other control characters, DEL, two-, three- and
  // four-byte UTF-8, then bytes that are not UTF-8: a stray continuation byte, an overlong
  // NUL (C0 80), an encoded surrogate (ED A0 80), a lead byte at the end.
  const std::string input = std::string("q\" b\\ n\n t\t r\r f\f bs\b c\x01 nul") + '\0' +
                            " del\x7f \xc3\xa9 \xe2\x98\x83 \xf0\x9f\x98\x80 x\x80 \xc0\x80 \xed\xa0\x80 \xe2";
  const std::string quoted = JsonQuote(input);
  EXPECT_EQ(quoted.find('\n'), std::string::npos);
  EXPECT_THAT(quoted, HasSubstr("\\u0001"));
  EXPECT_THAT(quoted, HasSubstr("\\u0000"));
  EXPECT_THAT(quoted, HasSubstr("\\n"));
  const std::vector<std::string> text = testing::StrictJsonText(quoted);
  ASSERT_EQ(text.size(), 1u);
  const std::string fffd = "\xef\xbf\xbd";
  const std::string expected = std::string("q\" b\\ n\n t\t r\r f\f bs\b c\x01 nul") + '\0' +
                               " del\x7f \xc3\xa9 \xe2\x98\x83 \xf0\x9f\x98\x80 x" + fffd + " " + fffd + fffd +
                               " " + fffd + fffd + fffd + " " + fffd;
  EXPECT_EQ(Json::Parse(text[0]).AsString(), expected);
}

TEST(JsonWriterTest, NestsWithSeparatorsAndWritesNumbersExactly) {
  JsonWriter j;
  j.BeginObject();
  j.Field("a", 1).Key("list").BeginArray().Int(-5).Uint(18446744073709551615ull).Bool(true).Null();
  j.BeginObject().EndObject().BeginArray().EndArray().EndArray();
  j.Field("pi", 3.14159).Field("tenth", 0.1).Field("tiny", 5e-324).Field("big", 1e300);
  j.Field("nan", std::nan("")).Field("inf", std::numeric_limits<double>::infinity());
  j.Key("raw").Raw("{\"x\":[1,2]}");
  j.RawMembers(" { \"m\" : \"v\", \"n\":2 } ").RawMembers("{}").RawMembers("{ }");
  j.Field("s", "end").EndObject();
  const std::vector<std::string> text = testing::StrictJsonText(j.str());
  ASSERT_EQ(text.size(), 1u) << j.str();
  EXPECT_EQ(text[0],
            "{\"a\": 1, \"list\": [-5, 18446744073709551615, true, null, {}, []], \"pi\": 3.14159, \"tenth\": 0.1, "
            "\"tiny\": 5e-324, \"big\": 1e+300, \"nan\": null, \"inf\": null, \"raw\": {\"x\": [1, 2]}, \"m\": \"v\", "
            "\"n\": 2, \"s\": \"end\"}");
  // One line: a stream of these is JSON Lines.
  EXPECT_EQ(j.str().find('\n'), std::string::npos);
}

// ---- Percent shares ----

int64_t Sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

TEST(PercentSharesTest, PartsOfTheWholeAddUpToExactlyOneHundred) {
  const std::vector<uint64_t> thirds = {1, 1, 1};
  EXPECT_EQ(PercentShares(thirds, 3, 2), (std::vector<int64_t>{3334, 3333, 3333}));
  // 13 equal parts and a pool-like split with many zeros and tiny rows.
  const std::vector<uint64_t> thirteen(13, 7);
  EXPECT_EQ(Sum(PercentShares(thirteen, 91, 2)), 10000);
  const std::vector<uint64_t> pool = {12549120, 0, 0, 30720, 917504, 0, 0, 131072, 3145728, 0, 0};
  const std::vector<int64_t> shares = PercentShares(pool, 16774144, 2);
  EXPECT_EQ(Sum(shares), 10000);
  EXPECT_EQ(shares[0], 7481);  // 74.8123...%
  EXPECT_EQ(shares[1], 0);
  EXPECT_EQ(shares[3], 18);  // 0.183...%
  // Each share is its exact value rounded down or up, never further off.
  for (size_t i = 0; i < pool.size(); ++i) {
    const double exact = 10000.0 * static_cast<double>(pool[i]) / 16774144.0;
    EXPECT_LT(std::abs(static_cast<double>(shares[i]) - exact), 1.0) << i;
  }
  EXPECT_EQ(PercentShares(std::vector<uint64_t>{5}, 5, 3), (std::vector<int64_t>{100000}));
  EXPECT_EQ(Sum(PercentShares(std::vector<uint64_t>{1, 999999999999ull}, 1000000000000ull, 6)), 100000000);
}

TEST(PercentSharesTest, PartsThatAreNotTheWholeRoundOnTheirOwn) {
  // 1/3 and 1/3 of 3 (a third is missing): 33.33% each, no padding to 100.
  EXPECT_EQ(PercentShares(std::vector<uint64_t>{1, 1}, 3, 2), (std::vector<int64_t>{3333, 3333}));
  EXPECT_EQ(PercentShares(std::vector<uint64_t>{2}, 3, 0), (std::vector<int64_t>{67}));
}

TEST(PercentSharesTest, FormatsWithItsDecimals) {
  EXPECT_EQ(FormatShare(1234, 2), "12.34%");
  EXPECT_EQ(FormatShare(5, 2), "0.05%");
  EXPECT_EQ(FormatShare(10000, 2), "100.00%");
  EXPECT_EQ(FormatShare(0, 2), "0.00%");
  EXPECT_EQ(FormatShare(42, 0), "42%");
}

// ---- The health check's messages ----

TEST(HealthWireTest, EncodesTheRequestAsProtobufDoes) {
  EXPECT_EQ(EncodeHealthCheckRequest(""), "");  // proto3 omits the default
  EXPECT_EQ(EncodeHealthCheckRequest("kvarn.v1.KvCache"), std::string("\x0a\x10") + "kvarn.v1.KvCache");
  const std::string long_name(200, 's');
  EXPECT_EQ(EncodeHealthCheckRequest(long_name), std::string("\x0a\xc8\x01") + long_name);  // two-byte length
}

TEST(HealthWireTest, DecodesTheStatusAndSkipsUnknownFields) {
  ServingStatus s = ServingStatus::kServing;
  ASSERT_TRUE(DecodeHealthCheckResponse("", &s).ok());
  EXPECT_EQ(s, ServingStatus::kUnknown);
  ASSERT_TRUE(DecodeHealthCheckResponse("\x08\x01", &s).ok());
  EXPECT_EQ(s, ServingStatus::kServing);
  ASSERT_TRUE(DecodeHealthCheckResponse("\x08\x02", &s).ok());
  EXPECT_EQ(s, ServingStatus::kNotServing);
  // Unknown fields of every wire type around it, and a repeated field: the last one wins.
  const std::string mixed = std::string("\x12\x03" "abc" "\x08\x01" "\x1d\x00\x00\x00\x00" "\x21", 13) +
                            std::string(8, '\0') + std::string("\x28\x96\x01" "\x08\x02", 5);
  ASSERT_TRUE(DecodeHealthCheckResponse(mixed, &s).ok());
  EXPECT_EQ(s, ServingStatus::kNotServing);
  EXPECT_EQ(ServingStatusName(ServingStatus::kServing), "SERVING");
  EXPECT_EQ(ServingStatusName(ServingStatus::kNotServing), "NOT_SERVING");
  EXPECT_EQ(ServingStatusName(static_cast<ServingStatus>(7)), "STATUS_7");
}

TEST(HealthWireTest, RefusesMalformedReplies) {
  ServingStatus s;
  EXPECT_EQ(DecodeHealthCheckResponse("\x08", &s).code(), CodecCode::kInvalidArgument);      // truncated varint
  EXPECT_EQ(DecodeHealthCheckResponse("\x12\x05" "ab", &s).code(), CodecCode::kInvalidArgument);  // short field
  EXPECT_EQ(DecodeHealthCheckResponse("\x0b", &s).code(), CodecCode::kInvalidArgument);      // group start
  EXPECT_EQ(DecodeHealthCheckResponse(std::string("\x00\x01", 2), &s).code(), CodecCode::kInvalidArgument);
  EXPECT_EQ(DecodeHealthCheckResponse(std::string(11, '\xff'), &s).code(), CodecCode::kInvalidArgument);
}

// ---- --json of the codec commands ----

TEST(KvarnctlCliTest, CodecCommandsPrintValidJsonWithTheirResults) {
  const std::string dir = testing::ScratchDir();
  Process p = Kvarnctl("codec synth --out-dir '" + dir + "' --tokens 256 --heads 2 --head-dim 64 --seed 3 --json");
  ASSERT_EQ(p.code, 0) << p.err;
  const Json synth = testing::StrictJsonValue(p.out);
  EXPECT_TRUE(synth["synthetic"].AsBool());
  EXPECT_EQ(synth["seed"].AsNumber(), 3);
  EXPECT_EQ(synth["heads"].AsNumber(), 2);
  EXPECT_EQ(synth["tokens"].AsNumber(), 256);
  EXPECT_EQ(synth["head_dim"].AsNumber(), 64);
  EXPECT_EQ(synth["files"]["keys"].AsString(), dir + "/k.npy");
  EXPECT_TRUE(std::filesystem::exists(synth["files"]["queries"].AsString()));
  EXPECT_GT(synth["sink_mass"].AsNumber(), 0);
  EXPECT_LE(synth["sink_mass"].AsNumber(), 1);

  // One tile of one head, [128, 128], through encode and decode.
  testing::WriteF32(dir + "/tk.npy", {128, 128}, testing::Pattern(128 * 128, 1));
  testing::WriteF32(dir + "/tv.npy", {128, 128}, testing::Pattern(128 * 128, 2));
  p = Kvarnctl("codec encode --preset kvarn_k4v2_g128 --keys '" + dir + "/tk.npy' --values '" + dir +
               "/tv.npy' --out '" + dir + "/r.bin' --head-dim-check --json");
  ASSERT_EQ(p.code, 0) << p.err;
  const Json enc = testing::StrictJsonValue(p.out);
  EXPECT_EQ(enc["record"].AsString(), dir + "/r.bin");
  EXPECT_EQ(enc["preset"].AsString(), "kvarn_k4v2_g128");
  EXPECT_EQ(enc["head_dim"].AsNumber(), 128);
  EXPECT_EQ(enc["record_bytes"].AsNumber(), static_cast<double>(std::filesystem::file_size(dir + "/r.bin")));
  EXPECT_NEAR(enc["compression_ratio"].AsNumber() * enc["bits_per_element"].AsNumber(), 16.0, 1e-9);
  EXPECT_EQ(enc["check"]["inferred_head_dim"].AsNumber(), 128);
  EXPECT_GT(enc["check"]["k_rel_l2"].AsNumber(), 0);
  EXPECT_LT(enc["check"]["k_rel_l2"].AsNumber(), 0.5);
  p = Kvarnctl("codec encode --preset kvarn_k4v2_g128 --keys '" + dir + "/tk.npy' --values '" + dir +
               "/tv.npy' --out '" + dir + "/r2.bin' --json");
  ASSERT_EQ(p.code, 0) << p.err;
  EXPECT_EQ(testing::StrictJsonValue(p.out)["check"].kind(), Json::Kind::kNull);

  p = Kvarnctl("codec decode --preset kvarn_k4v2_g128 --record '" + dir + "/r.bin' --keys-out '" + dir +
               "/dk.npy' --values-out '" + dir + "/dv.npy' --json");
  ASSERT_EQ(p.code, 0) << p.err;
  const Json dec = testing::StrictJsonValue(p.out);
  EXPECT_EQ(dec["keys_out"].AsString(), dir + "/dk.npy");
  EXPECT_EQ(dec["values_out"].AsString(), dir + "/dv.npy");
  EXPECT_EQ(dec["tokens"].AsNumber(), 128);
  EXPECT_EQ(dec["head_dim"].AsNumber(), 128);
  EXPECT_TRUE(dec["head_dim_inferred"].AsBool());
  EXPECT_EQ(dec["record_bytes"].AsNumber(), enc["record_bytes"].AsNumber());

  p = Kvarnctl("codec eval --keys '" + dir + "/k.npy' --values '" + dir + "/v.npy' --preset kvarn_k4v2_g64 " +
               "--preset fp16 --json");
  ASSERT_EQ(p.code, 0) << p.err;
  const std::vector<Json> rows = testing::StrictJson(p.out, /*lines=*/true);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0]["preset"].AsString(), "kvarn_k4v2_g64");
  EXPECT_EQ(rows[1]["preset"].AsString(), "fp16");
  EXPECT_EQ(rows[0]["heads"].AsNumber(), 2);
}

TEST(KvarnctlCliTest, JsonErrorsStayOnStderrAndStdoutIsEmpty) {
  const Process p = Kvarnctl("codec decode --preset kvarn_k4v2_g128 --record /nonexistent/r.bin "
                             "--keys-out /tmp/k.npy --values-out /tmp/v.npy --json");
  EXPECT_EQ(p.code, 2);
  EXPECT_EQ(p.out, "");
  EXPECT_THAT(p.err, HasSubstr("/nonexistent/r.bin"));
}

// ---- The daemon commands, before and without a daemon ----

const char* const kDaemonCommands[] = {"status", "sequences", "evict", "watch", "demo", "health"};

TEST(KvarnctlCliTest, EveryCommandsHelpNamesTheTargetItsEnvironmentAndJson) {
  for (const char* c : kDaemonCommands) {
    const Process p = Kvarnctl(std::string(c) + " --help");
    EXPECT_EQ(p.code, 0) << c;
    EXPECT_THAT(p.out, HasSubstr("$KVARN_TARGET, else unix:/run/kvarnd/kvarnd.sock")) << c;
    EXPECT_THAT(p.out, HasSubstr("  --json")) << c;
    EXPECT_THAT(p.out, HasSubstr("Exit status")) << c;
  }
  for (const char* c : {"status", "sequences", "evict", "watch", "demo"}) {
    const Process p = Kvarnctl(std::string(c) + " --help");
    EXPECT_THAT(p.out, HasSubstr("KVARN_ADMIN_TOKEN_FILE")) << c;
    EXPECT_THAT(p.out, HasSubstr("--admin-token-file FILE")) << c;
  }
  for (const char* c : {"encode", "decode", "eval", "synth"}) {
    EXPECT_THAT(Kvarnctl(std::string("codec ") + c + " --help").out, HasSubstr("  --json")) << c;
  }
  const Process top = Kvarnctl("--help");
  EXPECT_THAT(top.out, HasSubstr("  health      kvarnd's gRPC health check"));
  EXPECT_THAT(top.out, HasSubstr("$KVARN_TARGET, else\nunix:/run/kvarnd/kvarnd.sock"));
  EXPECT_THAT(Kvarnctl("evict --help").out, HasSubstr("--bytes SIZE"));
  EXPECT_THAT(Kvarnctl("evict --help").out, HasSubstr("KiB, MiB, GiB"));
}

TEST(KvarnctlCliTest, EvictBytesTakesUnitsAndNamesABadOne) {
  // A size kvarnd does not know is a usage error found before connecting.
  Process p = Kvarnctl("evict --target unix:/nonexistent/kvarnd.sock --bytes 1XB --admin-token t");
  EXPECT_EQ(p.code, 2);
  EXPECT_EQ(p.out, "");
  EXPECT_THAT(p.err, HasSubstr("evict: --bytes: '1XB' is not a size"));
  EXPECT_THAT(p.err, HasSubstr("unknown unit 'XB'"));
  EXPECT_EQ(Kvarnctl("evict --target unix:/nonexistent/kvarnd.sock --bytes 0").code, 2);
  EXPECT_EQ(Kvarnctl("evict --target unix:/nonexistent/kvarnd.sock --bytes=-1MiB").code, 2);
  // Units parse: the command gets as far as the (absent) daemon.
  for (const char* size : {"1MiB", "512KiB", "2GiB", "1.5GB", "4096"}) {
    p = Kvarnctl(std::string("evict --target unix:/nonexistent/kvarnd.sock --bytes ") + size);
    EXPECT_EQ(p.code, 1) << size << ": " << p.err;
    EXPECT_THAT(p.err, HasSubstr("not reachable")) << size;
  }
  p = Kvarnctl("evict --target unix:/nonexistent/kvarnd.sock --bytes 1MiB --all");
  EXPECT_EQ(p.code, 2);
  EXPECT_THAT(p.err, HasSubstr("give one of --of-tenant, --bytes, --all"));
}

TEST(KvarnctlCliTest, UnusableTokenFilesAreUsageErrorsNamingTheFileAndTheReason) {
  const std::string dir = testing::ScratchDir();
  const std::string dead = " --target unix:/nonexistent/kvarnd.sock";
  Process p = Kvarnctl("sequences" + dead + " --admin-token-file '" + dir + "/missing'");
  EXPECT_EQ(p.code, 2);
  EXPECT_EQ(p.out, "");
  EXPECT_EQ(p.err, "kvarnctl: error: --admin-token-file: cannot read " + dir + "/missing: No such file or directory\n");
  p = Kvarnctl("status" + dead + " --admin-token-file '" + dir + "'");
  EXPECT_EQ(p.code, 2);
  EXPECT_THAT(p.err, HasSubstr("cannot read " + dir + ": Is a directory"));
  std::ofstream(dir + "/empty") << "\n  \nsecond-line-is-not-the-token\n";
  p = Kvarnctl("evict --all" + dead + " --admin-token-file '" + dir + "/empty'");
  EXPECT_EQ(p.code, 2);
  EXPECT_THAT(p.err, HasSubstr(dir + "/empty holds no token (its first line is empty)"));
  // From the environment: named as such.
  p = Kvarnctl("watch" + dead, "KVARN_ADMIN_TOKEN_FILE='" + dir + "/missing'");
  EXPECT_EQ(p.code, 2);
  EXPECT_THAT(p.err, HasSubstr("$KVARN_ADMIN_TOKEN_FILE: cannot read " + dir + "/missing"));
  p = Kvarnctl("demo" + dead + " --tenant-token-file '" + dir + "/missing'");
  EXPECT_EQ(p.code, 2);
  EXPECT_THAT(p.err, HasSubstr("--tenant-token-file: cannot read"));
  // A token and a file: which one was meant is unclear.
  std::ofstream(dir + "/token") << "s3cret\n";
  p = Kvarnctl("status" + dead + " --admin-token x --admin-token-file '" + dir + "/token'");
  EXPECT_EQ(p.code, 2);
  EXPECT_THAT(p.err, HasSubstr("give --admin-token or --admin-token-file, not both"));
  // A readable file gets as far as connecting; so does --admin-token over $KVARN_ADMIN_TOKEN_FILE.
  p = Kvarnctl("status" + dead + " --admin-token-file '" + dir + "/token'");
  EXPECT_EQ(p.code, 1);
  EXPECT_THAT(p.err, HasSubstr("not reachable"));
  p = Kvarnctl("status" + dead + " --admin-token x", "KVARN_ADMIN_TOKEN_FILE='" + dir + "/missing'");
  EXPECT_EQ(p.code, 1) << p.err;
}

TEST(KvarnctlCliTest, EveryDaemonCommandConnectsToKvarnTargetElseTheDefault) {
  for (const char* c : kDaemonCommands) {
    Process p = Kvarnctl(std::string(c) + " --json", "KVARN_TARGET=unix:/nonexistent/from-env.sock");
    EXPECT_EQ(p.code, 1) << c;
    EXPECT_EQ(p.out, "") << c;
    EXPECT_THAT(p.err, HasSubstr("unix:/nonexistent/from-env.sock")) << c;
    // --target wins over the environment.
    p = Kvarnctl(std::string(c) + " --target unix:/nonexistent/flag.sock", "KVARN_TARGET=unix:/nonexistent/env.sock");
    EXPECT_THAT(p.err, HasSubstr("unix:/nonexistent/flag.sock")) << c;
    EXPECT_THAT(p.err, Not(HasSubstr("env.sock"))) << c;
  }
  // Neither: the manifests' socket, when nothing serves there on this machine.
  if (std::filesystem::exists("/run/kvarnd/kvarnd.sock")) {
    GTEST_SKIP() << "a kvarnd serves /run/kvarnd/kvarnd.sock here: not running commands against it";
  }
  for (const char* c : kDaemonCommands) {
    const Process p = Kvarnctl(c);
    EXPECT_EQ(p.code, 1) << c;
    EXPECT_THAT(p.err, HasSubstr("unix:/run/kvarnd/kvarnd.sock")) << c << ": " << p.err;
  }
}

TEST(KvarnctlCliTest, HealthAgainstNothingFailsWithinItsDeadline) {
  const auto t0 = std::chrono::steady_clock::now();
  Process p = Kvarnctl("health --target unix:/nonexistent/kvarnd.sock --timeout 2s");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(p.code, 1);
  EXPECT_EQ(p.out, "");
  EXPECT_THAT(p.err, HasSubstr("health: kvarnd at unix:/nonexistent/kvarnd.sock is not reachable"));
  EXPECT_THAT(p.err, HasSubstr("No such file or directory"));
  // Bounded by the deadline (plus process start); generous against a loaded machine.
  EXPECT_LT(seconds, 2.0 + 5.0);
  p = Kvarnctl("health --target unix:/nonexistent/kvarnd.sock --timeout 5");
  EXPECT_EQ(p.code, 2);
  EXPECT_THAT(p.err, HasSubstr("--timeout: '5' is not a positive duration with its unit"));
  EXPECT_EQ(Kvarnctl("health --timeout 0s").code, 2);
  EXPECT_EQ(Kvarnctl("health --timeout inf").code, 2);  // the deadline is what ends a silent daemon
  EXPECT_EQ(Kvarnctl("health --admin-token x").code, 2);  // health takes no credentials
}

// The library call refuses what the flag refuses, before connecting: an infinite deadline
// would leave a call to a daemon that never answers waiting for ever.
TEST(KvarnctlCliTest, CheckHealthNeedsAFinitePositiveDeadline) {
  for (const absl::Duration d :
       {absl::InfiniteDuration(), absl::ZeroDuration(), absl::Seconds(-1)}) {
    const absl::StatusOr<ServingStatus> r =
        CheckHealth("unix:/nonexistent/kvarnd.sock", ClientOptions{}, "", d);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << d;
    EXPECT_THAT(r.status().message(), HasSubstr("a health check needs a finite, positive deadline"))
        << d;
  }
}

}  // namespace
}  // namespace kvarn::ctl
