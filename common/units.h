// Sizes with units, one parser for kvarnd's configuration, the tenants file and kvarnctl.
#ifndef KVARN_COMMON_UNITS_H_
#define KVARN_COMMON_UNITS_H_

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace kvarn {

// "512MiB", "2GiB", "1.5GB", "4096B", "1000000" -> bytes. Binary units KiB MiB GiB TiB,
// decimal KB MB GB TB, B or none for bytes; a fraction is allowed before a unit. The value must
// be positive and below 2^64. INVALID_ARGUMENT naming the text otherwise.
absl::StatusOr<uint64_t> ParseBytes(absl::string_view text);

// 1536 -> "1.50 KiB"; bytes below 1 KiB print as "512 B".
std::string FormatBytes(double bytes);

}  // namespace kvarn

#endif  // KVARN_COMMON_UNITS_H_
