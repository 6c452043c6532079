// common/units.h: sizes with units as kvarnd's configuration, the tenants file and kvarnctl
// read them.
#include "common/units.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace kvarn {
namespace {

TEST(ParseBytesTest, AcceptsBinaryAndDecimalUnitsFractionsAndPlainBytes) {
  EXPECT_EQ(ParseBytes("512MiB").value(), 512ull << 20);
  EXPECT_EQ(ParseBytes("1.5GiB").value(), 3ull << 29);
  EXPECT_EQ(ParseBytes("4096").value(), 4096u);
  EXPECT_EQ(ParseBytes("4096B").value(), 4096u);
  EXPECT_EQ(ParseBytes("1KB").value(), 1000u);
  EXPECT_EQ(ParseBytes("1KiB").value(), 1024u);
  EXPECT_EQ(ParseBytes("2TiB").value(), 2ull << 40);
  EXPECT_EQ(ParseBytes("1.5GB").value(), 1500000000u);
  EXPECT_EQ(ParseBytes("18446744073709551615").value(), UINT64_MAX);
  EXPECT_EQ(ParseBytes("17179869183GiB").value(), 17179869183ull << 30);
}

TEST(ParseBytesTest, RefusesEmptyZeroNegativeUnknownUnitsAndOverflow) {
  for (const char* bad : {"", "0", "-1", "12XB", "1e30GiB", "MiB", "0.0001B", "-1.5GiB", "0KiB", "nan", "inf",
                          "18446744073709551616", "17179869184GiB", "1.5 GiB x"}) {
    auto b = ParseBytes(bad);
    EXPECT_FALSE(b.ok()) << "'" << bad << "' parsed as " << (b.ok() ? *b : 0);
    if (!b.ok()) {
      EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << bad;
      EXPECT_NE(std::string(b.status().message()).find(std::string("'") + bad + "'"), std::string::npos)
          << "the error names the text: " << b.status();
    }
  }
}

TEST(FormatBytesTest, PrintsBinaryUnitsAboveOneKiB) {
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(3.0 * (1 << 30)), "3.00 GiB");
}

}  // namespace
}  // namespace kvarn
