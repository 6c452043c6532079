// Every kvarnd config file the repository ships starts kvarnd as it is (only the socket path,
// metrics port and instance name are moved into the test's directory): it serves, answers
// /readyz, and stops cleanly. `kvarnd --check_config` accepts each too. Configs embedded in the
// Kubernetes manifests are started by the manifest checks (tests/deploy).
#include <algorithm>
#include <filesystem>

#include "absl/strings/match.h"

#include "tests/integration/fixture.h"

namespace kvarn::it {
namespace {

std::vector<std::string> ShippedConfigs() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(std::string(KVARN_IT_SOURCE_DIR) + "/deploy")) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && (absl::EndsWith(name, ".conf") || absl::EndsWith(name, ".conf.example"))) {
      out.push_back(e.path().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(ShippedConfigTest, EveryShippedConfigStartsServesAndStops) {
  const std::vector<std::string> configs = ShippedConfigs();
  ASSERT_FALSE(configs.empty()) << "no *.conf or *.conf.example under deploy/";
  for (const std::string& path : configs) {
    SCOPED_TRACE(path);
    IT_ASSIGN_OR_FAIL(check, RunWithInput(KvarndBinary(), {"--config=" + path, "--check_config"}, ""));
    EXPECT_EQ(check.first, 0) << check.second;
    EXPECT_THAT(check.second, ::testing::HasSubstr("config ok"));

    DaemonOptions o;
    o.config_file = path;
    auto d = Daemon::Start(o);
    ASSERT_TRUE(d.ok()) << d.status();
    IT_ASSIGN_OR_FAIL(ready, HttpGetReply((*d)->metrics_port(), "/readyz"));
    EXPECT_EQ(ready.first, 200) << ready.second;
    auto client = (*d)->Connect();
    ASSERT_TRUE(client.ok()) << client.status();
    auto status = (*d)->Stop(std::chrono::seconds(10));
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << (*d)->Log();
  }
  Report(absl::StrCat("shipped configs started: ", configs.size()));
}

}  // namespace
}  // namespace kvarn::it
