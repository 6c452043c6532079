// Building blocks of the Prometheus text exposition format, version 0.0.4: name rules,
// escaping and number spelling. The registry composes them; they are public so that tests
// (and any other exporter) pin the exact spelling.
//
// Reference: https://prometheus.io/docs/instrumenting/exposition_formats/
// All functions are pure and thread-safe.
#ifndef KVARN_DAEMON_METRICS_TEXT_FORMAT_H_
#define KVARN_DAEMON_METRICS_TEXT_FORMAT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kvarn::metrics {

// The Content-Type of a response carrying this format.
inline constexpr absl::string_view kTextContentType = "text/plain; version=0.0.4; charset=utf-8";

// OK when `name` matches [a-zA-Z_:][a-zA-Z0-9_:]*, else INVALID_ARGUMENT naming the
// offending character. (Colons are legal but by convention belong to recording rules.)
absl::Status ValidateMetricName(absl::string_view name);

// OK when `name` matches [a-zA-Z_][a-zA-Z0-9_]* and does not start with "__", which
// Prometheus reserves for its own labels; else INVALID_ARGUMENT.
absl::Status ValidateLabelName(absl::string_view name);

// True when `text` is well-formed UTF-8 (no overlong forms, surrogates or code points past
// U+10FFFF). Label values and help text may hold any Unicode, but only as valid UTF-8: the
// scraper rejects the whole exposition otherwise.
bool IsValidUtf8(absl::string_view text);

// `text` with U+FFFD in place of every byte that does not belong to a well-formed sequence.
std::string SanitizeUtf8(absl::string_view text);

// Appends `help` escaped for a "# HELP" line: backslash -> \\, newline -> \n.
// (Double quotes are left alone in help text, as the format specifies.)
void AppendEscapedHelp(absl::string_view help, std::string* out);

// Appends `value` escaped for a quoted label value: backslash -> \\, '"' -> \", newline -> \n.
void AppendEscapedLabelValue(absl::string_view value, std::string* out);

// A sample value: the shortest decimal spelling that parses back (strtod, Go's ParseFloat)
// to exactly `value`; integers below 2^53 in full ("17179869184"), anything else as Go's
// client library spells it ("0.1", "1.5e-07", "1e+21"); and the special values "NaN",
// "+Inf", "-Inf" as Prometheus expects.
std::string FormatDouble(double value);
void AppendDouble(double value, std::string* out);

// A histogram bucket's "le" label value, spelled exactly as Go's client library spells it
// (strconv.FormatFloat 'g', -1: "0.0001", "2.5", "1e+06", "+Inf"). The label value is part of
// the series identity, so matching the reference spelling keeps sum by (le) working across
// exporters written in different languages.
std::string FormatBucketBound(double value);

}  // namespace kvarn::metrics

#endif  // KVARN_DAEMON_METRICS_TEXT_FORMAT_H_
