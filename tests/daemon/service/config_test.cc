// kvarnd's configuration (daemon/service/config.h) and the tenants file loader
// (daemon/service/server.h): every key parses, every bad value is INVALID_ARGUMENT naming its
// key, and the cross-key rules hold.
#include <sys/stat.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "daemon/service/config.h"
#include "daemon/service/server.h"
#include "tests/daemon/service/service_harness.h"

namespace kvarn::testing {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<DaemonConfig> Parse(const std::vector<std::string>& args) {
  bool help = false;
  return ParseDaemonConfig(args, &help);
}

// The error of `--key=value`, which must be INVALID_ARGUMENT.
std::string FlagError(const std::string& key, const std::string& value) {
  auto c = Parse({"--" + key + "=" + value});
  EXPECT_FALSE(c.ok()) << "--" << key << "=" << value << " was accepted";
  if (c.ok()) return "";
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  return std::string(c.status().message());
}

// The error of a config file line `key = value`.
std::string TextError(const std::string& key, const std::string& value) {
  DaemonConfig c;
  const absl::Status s = ApplyConfigText(key + " = " + value + "\n", &c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << key << " = " << value;
  return std::string(s.message());
}

TEST(ConfigTest, EveryNewKeyParsesFromAFlag) {
  auto c = Parse({"--tenants_file=/etc/kvarn/tenants", "--tcp=0.0.0.0:7070", "--tls_cert=/c.pem", "--tls_key=/k.pem",
                  "--tls_client_ca=/ca.pem", "--allow_insecure_tcp=true", "--socket_mode=0660", "--sink_share=0.5",
                  "--tenant_max_sessions=7", "--tenant_max_watchers=3", "--max_observer_sessions=5",
                  "--max_watchers=9", "--max_batch_items=100", "--watch_poll_ms=50"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tenants_file, "/etc/kvarn/tenants");
  EXPECT_EQ(c->tls_cert, "/c.pem");
  EXPECT_EQ(c->tls_key, "/k.pem");
  EXPECT_EQ(c->tls_client_ca, "/ca.pem");
  EXPECT_TRUE(c->allow_insecure_tcp);
  EXPECT_EQ(c->socket_mode, 0660u);
  EXPECT_DOUBLE_EQ(c->core.sink_share, 0.5);
  EXPECT_EQ(c->core.tenant_max_sessions, 7u);
  EXPECT_EQ(c->core.tenant_max_watchers, 3u);
  EXPECT_EQ(c->core.max_observer_sessions, 5u);
  EXPECT_EQ(c->core.max_watchers, 9u);
  EXPECT_EQ(c->max_batch_items, 100u);
  EXPECT_EQ(c->watch_poll, absl::Milliseconds(50));
}

TEST(ConfigTest, EveryNewKeyParsesFromConfigText) {
  DaemonConfig c;
  const absl::Status s = ApplyConfigText(
      "# a comment\n"
      "tenants_file = /t\n"
      "  tls_cert=/c.pem  \n"
      "tls_key = /k.pem\n"
      "tls_client_ca = /ca.pem\n"
      "allow_insecure_tcp = false\n"
      "socket_mode = 600\n"
      "sink_share = 0.125\n"
      "tenant_max_sessions = 11\n"
      "tenant_max_watchers = 12\n"
      "max_observer_sessions = 13\n"
      "max_watchers = 14\n"
      "max_batch_items = 65536\n"
      "watch_poll_ms = 60000\n",
      &c);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(c.tenants_file, "/t");
  EXPECT_EQ(c.tls_cert, "/c.pem");
  EXPECT_EQ(c.tls_key, "/k.pem");
  EXPECT_EQ(c.tls_client_ca, "/ca.pem");
  EXPECT_FALSE(c.allow_insecure_tcp);
  EXPECT_EQ(c.socket_mode, 0600u);
  EXPECT_DOUBLE_EQ(c.core.sink_share, 0.125);
  EXPECT_EQ(c.core.tenant_max_sessions, 11u);
  EXPECT_EQ(c.core.tenant_max_watchers, 12u);
  EXPECT_EQ(c.core.max_observer_sessions, 13u);
  EXPECT_EQ(c.core.max_watchers, 14u);
  EXPECT_EQ(c.max_batch_items, 65536u);
  EXPECT_EQ(c.watch_poll, absl::Milliseconds(60000));
}

// The grammar: `#` at a line's start or after whitespace begins a comment; inside a value
// (no whitespace before it) it is part of the value.
TEST(ConfigTest, InlineCommentsEndTheValueAndHashesInsideAValueStay) {
  DaemonConfig c;
  const absl::Status s = ApplyConfigText(
      "preset = kvarn_k4v2_g128     # 4-bit keys\n"
      "capacity = 1GiB\t# tab before the comment\n"
      "admin_token = abc#def # the token keeps its hash\n"
      "#listen = /not/this\n"
      "   # indented comment\n"
      "tcp =   # empty value, then a comment\n",
      &c);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(c.core.model.preset, "kvarn_k4v2_g128");
  EXPECT_EQ(c.core.capacity_bytes, 1ull << 30);
  EXPECT_EQ(c.core.admin_token, "abc#def");
  EXPECT_EQ(c.listen, DaemonConfig().listen);
  EXPECT_EQ(c.tcp, "");
}

TEST(ConfigTest, AKeySetTwiceInAFileNamesBothLines) {
  DaemonConfig c;
  const absl::Status s = ApplyConfigText("capacity = 1GiB\n\ncapacity = 2GiB\n", &c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("line 3: capacity is already set on line 1"));
}

TEST(ConfigTest, ALineWithoutEqualsIsQuoted) {
  DaemonConfig c;
  const absl::Status s = ApplyConfigText("capacity 1GiB # oops\n", &c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("line 1: expected key = value, got 'capacity 1GiB'"));
}

TEST(ConfigTest, DefaultsMatchTheDocumentedOnes) {
  auto c = Parse({});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->socket_mode, 0600u);
  EXPECT_EQ(c->listen, "/run/kvarnd/kvarnd.sock");
  EXPECT_EQ(c->drain, absl::Seconds(20));
  EXPECT_FALSE(c->check_config);
  EXPECT_FALSE(c->allow_insecure_tcp);
  EXPECT_TRUE(c->tenants_file.empty());
  EXPECT_EQ(c->max_batch_items, 4096u);
  EXPECT_EQ(c->watch_poll, absl::Milliseconds(200));
  EXPECT_EQ(c->core.tenant_max_sessions, 256u);
  EXPECT_EQ(c->core.tenant_max_watchers, 16u);
  EXPECT_EQ(c->core.max_observer_sessions, 64u);
  EXPECT_EQ(c->core.max_watchers, 256u);
}

TEST(ConfigTest, DashedFlagNamesAndSeparateValuesAreAccepted) {
  auto c = Parse({"--tenant-max-watchers", "4", "--max-batch-items=8"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->core.tenant_max_watchers, 4u);
  EXPECT_EQ(c->max_batch_items, 8u);
}

TEST(ConfigTest, FlagsOverrideTheConfigFile) {
  TempDir dir;
  const std::string path = dir.File("kvarnd.conf");
  std::ofstream(path) << "tenant_max_watchers = 3\nmax_watchers = 30\n";
  auto c = Parse({"--tenant_max_watchers=5", "--config=" + path});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->core.tenant_max_watchers, 5u);
  EXPECT_EQ(c->core.max_watchers, 30u);
}

TEST(ConfigTest, AnUnknownKeyIsInvalidArgumentNamingIt) {
  EXPECT_THAT(FlagError("max_wachers", "3"), HasSubstr("max_wachers"));
  EXPECT_THAT(TextError("tls_certificate", "/c.pem"), HasSubstr("tls_certificate"));
}

TEST(ConfigTest, ABadSocketModeIsInvalidArgumentNamingTheKey) {
  for (const char* v : {"", "abc", "0689", "06000", "-600", "0x1FF"}) EXPECT_THAT(FlagError("socket_mode", v), HasSubstr("socket_mode")) << v;
}

TEST(ConfigTest, TheSocketModeMustKeepOwnerReadWriteAndDenyOthers) {
  EXPECT_THAT(FlagError("socket_mode", "0777"), HasSubstr("socket_mode"));  // others may connect
  EXPECT_THAT(FlagError("socket_mode", "0601"), HasSubstr("socket_mode"));
  EXPECT_THAT(FlagError("socket_mode", "0604"), HasSubstr("socket_mode"));
  EXPECT_THAT(FlagError("socket_mode", "0400"), HasSubstr("socket_mode"));  // owner cannot write
  EXPECT_THAT(FlagError("socket_mode", "0200"), HasSubstr("socket_mode"));
  EXPECT_THAT(FlagError("socket_mode", "0060"), HasSubstr("socket_mode"));
  for (const char* ok : {"0600", "0660", "0700", "0770", "0640"}) {
    auto c = Parse({std::string("--socket_mode=") + ok});
    EXPECT_TRUE(c.ok()) << ok << ": " << c.status();
  }
}

TEST(ConfigTest, MaxBatchItemsOutsideItsRangeIsInvalidArgumentNamingTheKey) {
  for (const char* v : {"0", "65537", "-1", "many", ""}) EXPECT_THAT(FlagError("max_batch_items", v), HasSubstr("max_batch_items")) << v;
}

TEST(ConfigTest, WatchPollOutsideItsRangeIsInvalidArgumentNamingTheKey) {
  for (const char* v : {"0", "60001", "-5", "1s", ""}) EXPECT_THAT(FlagError("watch_poll_ms", v), HasSubstr("watch_poll_ms")) << v;
}

// Every error names the key (the helpers once named it by its help text).
TEST(ConfigTest, ABadCountIsInvalidArgumentNamingTheKey) {
  for (const char* key : {"tenant_max_sessions", "tenant_max_watchers", "max_observer_sessions", "max_watchers"}) {
    for (const char* v : {"abc", "-1", "", "1.5"}) {
      EXPECT_THAT(FlagError(key, v), HasSubstr(key)) << "--" << key << "=" << v;
      EXPECT_THAT(TextError(key, v), HasSubstr(key)) << key << " = " << v;
    }
  }
}

// A count beyond its field's range is refused (it was once narrowed silently: 2^32 + 1 became 1).
TEST(ConfigTest, ACountBeyondThirtyTwoBitsIsInvalidArgument) {
  for (const char* key : {"tenant_max_sessions", "tenant_max_watchers", "max_observer_sessions", "max_watchers"}) {
    auto c = Parse({std::string("--") + key + "=4294967297"});
    EXPECT_FALSE(c.ok()) << key << "=4294967297 was accepted";
    if (!c.ok()) {
      EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    }
  }
  auto max = Parse({"--max_watchers=4294967295"});
  ASSERT_TRUE(max.ok()) << max.status();
  EXPECT_EQ(max->core.max_watchers, 4294967295u);
}

TEST(ConfigTest, ABadSinkShareIsInvalidArgumentNamingTheKey) {
  for (const char* v : {"abc", "", "0.5x"}) EXPECT_THAT(FlagError("sink_share", v), HasSubstr("sink_share")) << v;
}

TEST(ConfigTest, ABadAllowInsecureTcpIsInvalidArgumentNamingTheKey) {
  for (const char* v : {"yes", "1", "TRUE", ""}) EXPECT_THAT(FlagError("allow_insecure_tcp", v), HasSubstr("allow_insecure_tcp")) << v;
}

TEST(ConfigTest, RingFollowCpuIsOnByDefaultAndParsesAsABool) {
  auto on = Parse({});
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE(on->ring_follow_cpu);
  auto off = Parse({"--ring_follow_cpu=false"});
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->ring_follow_cpu);
  for (const char* v : {"yes", "1", ""}) EXPECT_THAT(FlagError("ring_follow_cpu", v), HasSubstr("ring_follow_cpu")) << v;
}

TEST(ConfigTest, RingWatchIs50UsByDefaultAndTakes0To10000) {
  auto def = Parse({});
  ASSERT_TRUE(def.ok()) << def.status();
  EXPECT_EQ(def->ring_watch, absl::Microseconds(50));
  auto off = Parse({"--ring_watch_us=0"});
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->ring_watch, absl::ZeroDuration());
  auto top = Parse({"--ring_watch_us=10000"});
  ASSERT_TRUE(top.ok()) << top.status();
  EXPECT_EQ(top->ring_watch, absl::Milliseconds(10));
  for (const char* v : {"-1", "10001", "50us", ""}) EXPECT_THAT(FlagError("ring_watch_us", v), HasSubstr("ring_watch_us")) << v;
}

TEST(ConfigTest, HugePagesIsOffByDefaultAndTakesOffTryOrOn) {
  auto def = Parse({});
  ASSERT_TRUE(def.ok()) << def.status();
  EXPECT_EQ(def->huge_pages, "off");
  for (const char* v : {"off", "try", "on"}) {
    auto c = Parse({absl::StrCat("--huge_pages=", v)});
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->huge_pages, v);
  }
  for (const char* v : {"true", "yes", "2MiB", ""}) EXPECT_THAT(FlagError("huge_pages", v), HasSubstr("huge_pages")) << v;
}

TEST(ConfigTest, ABadValueInAConfigFileNamesTheFileAndTheLine) {
  TempDir dir;
  const std::string path = dir.File("kvarnd.conf");
  std::ofstream(path) << "# header\nmax_watchers = 3\nwatch_poll_ms = 0\n";
  auto c = Parse({"--config=" + path});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("line 3"));
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("watch_poll_ms"));
}

TEST(ConfigTest, TlsCertWithoutTlsKeyIsRejected) {
  auto c = Parse({"--tcp=0.0.0.0:7070", "--tls_cert=/c.pem"});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("tls_key"));
  auto k = Parse({"--tcp=0.0.0.0:7070", "--tls_key=/k.pem"});
  ASSERT_FALSE(k.ok());
  EXPECT_EQ(k.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ConfigTest, TlsClientCaWithoutACertificateIsRejected) {
  auto c = Parse({"--tcp=0.0.0.0:7070", "--tls_client_ca=/ca.pem"});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("tls_client_ca"));
}

TEST(ConfigTest, ShareAcrossTenantsWithATenantsFileIsRejected) {
  auto c = Parse({"--share_across_tenants=true", "--tenants_file=/t"});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("share_across_tenants"));
  // Also when the two come from the config file and a flag.
  TempDir dir;
  const std::string path = dir.File("kvarnd.conf");
  std::ofstream(path) << "share_across_tenants = true\n";
  auto mixed = Parse({"--config=" + path, "--tenants_file=/t"});
  EXPECT_EQ(mixed.status().code(), absl::StatusCode::kInvalidArgument);
  auto alone = Parse({"--share_across_tenants=true"});
  EXPECT_TRUE(alone.ok()) << alone.status();
}

TEST(ConfigTest, HelpListsEveryNewKey) {
  const std::string help = DaemonHelp();
  for (const char* key : {"tenants_file", "tls_cert", "tls_key", "tls_client_ca", "allow_insecure_tcp", "socket_mode",
                          "sink_share", "tenant_max_sessions", "tenant_max_watchers", "max_observer_sessions",
                          "max_watchers", "max_batch_items", "watch_poll_ms"}) {
    EXPECT_THAT(help, HasSubstr(std::string("--") + key + "\n")) << key;
  }
  bool asked = false;
  auto c = ParseDaemonConfig({"--help"}, &asked);
  EXPECT_TRUE(c.ok());
  EXPECT_TRUE(asked);
}

// ---- LoadTenantsFile ----

class TenantsFileTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& text, mode_t mode) {
    const std::string path = dir_.File("tenants");
    std::ofstream(path) << text;
    EXPECT_EQ(chmod(path.c_str(), mode), 0);
    return path;
  }
  TempDir dir_;
};

TEST_F(TenantsFileTest, AFileReadableByOthersIsRefusedWithChmodAdvice) {
  const std::string path = Write(TenantLine("team-a", "token-a"), 0644);
  auto t = LoadTenantsFile(path);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("chmod 600"));
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("0644"));
}

// kvarnd's own group may read it (a Kubernetes Secret volume with fsGroup gives 0440 with the
// pod's group); it may not write it, and a group kvarnd is not in may not read it.
TEST_F(TenantsFileTest, OnlyKvarndsOwnGroupMayReadIt) {
  const std::string path = Write(TenantLine("team-a", "token-a"), 0640);
  EXPECT_TRUE(LoadTenantsFile(path).ok()) << LoadTenantsFile(path).status();
  ASSERT_EQ(chmod(path.c_str(), 0660), 0);
  EXPECT_EQ(LoadTenantsFile(path).status().code(), absl::StatusCode::kFailedPrecondition);
  if (geteuid() == 0) {
    ASSERT_EQ(chmod(path.c_str(), 0640), 0);
    ASSERT_EQ(chown(path.c_str(), 0, 65534), 0);  // nogroup: not one of this process's groups
    auto t = LoadTenantsFile(path);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(t.status().message()), HasSubstr("group 65534"));
  }
}

TEST_F(TenantsFileTest, AnOwnerOnlyFileParses) {
  const std::string path =
      Write("# tenants\n" + TenantLine("team-a", "token-a", "sessions=3 watchers=2") + TenantLine("team-b", "token-b"),
            0600);
  auto t = LoadTenantsFile(path);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 2u);
  EXPECT_EQ((*t)[0].name, "team-a");
  EXPECT_EQ((*t)[0].token_sha256, HashToken("token-a"));
  EXPECT_EQ((*t)[0].max_sessions, 3u);
  EXPECT_EQ((*t)[0].max_watchers, 2u);
  EXPECT_EQ((*t)[1].name, "team-b");
  ASSERT_EQ(chmod(path.c_str(), 0400), 0);
  EXPECT_TRUE(LoadTenantsFile(path).ok());
}

TEST_F(TenantsFileTest, BadContentIsInvalidArgumentNamingTheFile) {
  const std::string path = Write("team-a sessions=3\n", 0600);  // no token
  auto t = LoadTenantsFile(path);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr(path));
}

TEST_F(TenantsFileTest, AMissingFileOrADirectoryIsFailedPrecondition) {
  EXPECT_EQ(LoadTenantsFile(dir_.File("absent")).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(LoadTenantsFile(dir_.path()).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kvarn::testing
