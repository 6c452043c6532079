// The strict flag parser shared by kvarnctl's subcommands.
#include "client/kvarnctl/flags.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvarn::ctl {
namespace {

using ::testing::HasSubstr;

struct Flags {
  std::string keys;
  std::vector<std::string> presets;
  int64_t iterations = 8;
  uint64_t seed = 1;
  uint64_t bytes = 0;
  absl::Duration timeout = absl::Seconds(1);
  bool json = false;
  FlagSet set{"codec test"};
  Flags() {
    set.String("keys", &keys, "K.npy", "keys", true);
    set.StringList("preset", &presets, "P", "preset");
    set.Int("iterations", &iterations, 0, 64, "N", "iterations");
    set.Uint64("seed", &seed, "S", "seed");
    set.Bytes("bytes", &bytes, "SIZE", "size");
    set.Duration("timeout", &timeout, "DURATION", "timeout");
    set.Bool("json", &json, "json");
  }
  CodecStatus Parse(std::vector<std::string> args) { return set.Parse(args); }
};

TEST(FlagSetTest, ParsesSpaceAndEqualsForms) {
  Flags f;
  ASSERT_TRUE(f.Parse({"--keys", "k.npy", "--iterations=3", "--seed", "18446744073709551615",
                       "--json", "--preset", "a", "--preset=b"})
                  .ok());
  EXPECT_EQ(f.keys, "k.npy");
  EXPECT_EQ(f.iterations, 3);
  EXPECT_EQ(f.seed, 18446744073709551615ull);
  EXPECT_TRUE(f.json);
  EXPECT_EQ(f.presets, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(f.set.Seen("iterations"));
  EXPECT_FALSE(f.set.help_requested());
}

TEST(FlagSetTest, UnknownFlagIsNamedWithASuggestion) {
  Flags f;
  const CodecStatus s = f.Parse({"--keys", "k", "--iteration", "3"});
  EXPECT_EQ(s.code(), CodecCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "codec test: unknown flag --iteration (did you mean --iterations?)");
  EXPECT_THAT(Flags().Parse({"--zzzzzz"}).message(),
              HasSubstr("unknown flag --zzzzzz (see --help)"));
}

TEST(FlagSetTest, MissingValueIsAnError) {
  EXPECT_EQ(Flags().Parse({"--keys"}).message(), "codec test: --keys needs a value (K.npy)");
  EXPECT_EQ(Flags().Parse({"--keys", "--json"}).message(),
            "codec test: --keys needs a value (K.npy), got flag --json");
  EXPECT_EQ(Flags().Parse({"--keys="}).message(), "codec test: --keys needs a non-empty value");
}

TEST(FlagSetTest, BadNumbersAreErrors) {
  EXPECT_EQ(Flags().Parse({"--keys", "k", "--iterations", "abc"}).message(),
            "codec test: --iterations: 'abc' is not an integer");
  EXPECT_EQ(Flags().Parse({"--keys", "k", "--iterations", "3x"}).message(),
            "codec test: --iterations: '3x' is not an integer");
  EXPECT_EQ(Flags().Parse({"--keys", "k", "--iterations", "65"}).message(),
            "codec test: --iterations: 65 is out of range 0..64");
  EXPECT_EQ(Flags().Parse({"--keys", "k", "--iterations", "-1"}).message(),
            "codec test: --iterations: -1 is out of range 0..64");
  EXPECT_EQ(Flags().Parse({"--keys", "k", "--iterations", "99999999999999999999"}).message(),
            "codec test: --iterations: 99999999999999999999 is out of range 0..64");
  EXPECT_EQ(Flags().Parse({"--keys", "k", "--seed", "-3"}).message(),
            "codec test: --seed: '-3' is not a non-negative integer");
  EXPECT_EQ(Flags().Parse({"--keys", "k", "--seed", "18446744073709551616"}).message(),
            "codec test: --seed: 18446744073709551616 does not fit in 64 bits");
}

TEST(FlagSetTest, RepeatsPositionalsAndSwitchValuesAreErrors) {
  EXPECT_EQ(Flags().Parse({"--keys", "a", "--keys", "b"}).message(),
            "codec test: --keys given more than once");
  EXPECT_EQ(Flags().Parse({"--keys", "a", "extra"}).message(),
            "codec test: unexpected argument 'extra' (flags start with --; see --help)");
  EXPECT_EQ(Flags().Parse({"--keys", "a", "--json=1"}).message(),
            "codec test: --json takes no value");
}

TEST(FlagSetTest, RequiredFlagsAreCheckedUnlessHelpIsAsked) {
  EXPECT_EQ(Flags().Parse({}).message(), "codec test: missing required flag --keys");
  Flags f;
  EXPECT_TRUE(f.Parse({"--help"}).ok());
  EXPECT_TRUE(f.set.help_requested());
}

TEST(FlagSetTest, UsageListsEveryFlagAligned) {
  Flags f;
  const std::string usage = f.set.Usage();
  EXPECT_THAT(usage, HasSubstr("  --keys K.npy         keys (required)\n"));
  EXPECT_THAT(usage, HasSubstr("  --preset P           preset (repeatable)\n"));
  EXPECT_THAT(usage, HasSubstr("  --json               json\n"));
  EXPECT_THAT(usage, HasSubstr(std::string("  --bytes SIZE         size (units: ") + kSizeUnits + ", or plain bytes)\n"));
}

TEST(FlagSetTest, SizesTakeKvarndsUnits) {
  const auto parsed = [](const std::string& v) {
    Flags f;
    const CodecStatus s = f.Parse({"--keys", "k", "--bytes", v});
    EXPECT_TRUE(s.ok()) << v << ": " << s.message();
    return f.bytes;
  };
  EXPECT_EQ(parsed("1MiB"), 1u << 20);
  EXPECT_EQ(parsed("512KiB"), 512u << 10);
  EXPECT_EQ(parsed("2GiB"), 2ull << 30);
  EXPECT_EQ(parsed("1.5GB"), 1500000000u);
  EXPECT_EQ(parsed("4096"), 4096u);
  EXPECT_EQ(parsed("4096B"), 4096u);
  Flags f;
  EXPECT_TRUE(f.Parse({"--keys", "k", "--bytes=3KB"}).ok());
  EXPECT_EQ(f.bytes, 3000u);
}

TEST(FlagSetTest, ABadSizeNamesTheUnitWhenTheUnitIsWhatIsWrong) {
  EXPECT_EQ(Flags().Parse({"--keys", "k", "--bytes", "1XB"}).message(),
            std::string("codec test: --bytes: '1XB' is not a size such as 512MiB or 4096 (unknown unit 'XB'; units: ") +
                kSizeUnits + ")");
  EXPECT_THAT(Flags().Parse({"--keys", "k", "--bytes", "12mib"}).message(), HasSubstr("unknown unit 'mib'"));
  // A known unit after a bad number, or no unit at all: the number is what is wrong.
  for (const char* bad : {"1.2.3MiB", "0", "-5", "MiB", "0KiB"}) {
    const CodecStatus s = Flags().Parse({"--keys", "k", "--bytes", bad});
    EXPECT_EQ(s.code(), CodecCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(), HasSubstr("is not a size")) << bad;
    EXPECT_THAT(s.message(), ::testing::Not(HasSubstr("unknown unit"))) << bad;
  }
}

TEST(FlagSetTest, DurationsNeedAUnitAndArePositive) {
  Flags f;
  ASSERT_TRUE(f.Parse({"--keys", "k", "--timeout", "250ms"}).ok());
  EXPECT_EQ(f.timeout, absl::Milliseconds(250));
  Flags g;
  ASSERT_TRUE(g.Parse({"--keys", "k", "--timeout=1.5s"}).ok());
  EXPECT_EQ(g.timeout, absl::Milliseconds(1500));
  for (const char* bad : {"5", "0s", "-1s", "inf", "soon"}) {
    EXPECT_EQ(Flags().Parse({"--keys", "k", "--timeout", bad}).message(),
              std::string("codec test: --timeout: '") + bad +
                  "' is not a positive duration with its unit, such as 500ms, 2s or 1m")
        << bad;
  }
}

TEST(ParseIntTest, AcceptsOnlyWholeNumbersInRange) {
  int64_t v = 0;
  EXPECT_TRUE(ParseInt("42", 0, 100, "x", &v).ok());
  EXPECT_EQ(v, 42);
  EXPECT_FALSE(ParseInt("", 0, 100, "x", &v).ok());
  EXPECT_FALSE(ParseInt(" 4", 0, 100, "x", &v).ok());
  EXPECT_FALSE(ParseInt("4.0", 0, 100, "x", &v).ok());
  EXPECT_FALSE(ParseInt("101", 0, 100, "x", &v).ok());
}

}  // namespace
}  // namespace kvarn::ctl
