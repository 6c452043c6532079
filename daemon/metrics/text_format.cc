#include "daemon/metrics/text_format.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace kvarn::metrics {
namespace {

bool IsAsciiLetter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsAsciiDigit(char c) { return c >= '0' && c <= '9'; }

// Describes the first offending character so a registration error says what to fix.
std::string DescribeChar(absl::string_view name, size_t i) {
  const unsigned char c = static_cast<unsigned char>(name[i]);
  if (c >= 0x20 && c < 0x7f) return absl::StrCat("'", name.substr(i, 1), "' at offset ", i);
  return absl::StrCat("byte 0x", absl::Hex(c, absl::kZeroPad2), " at offset ", i);
}

// Length of the well-formed UTF-8 sequence starting at text[i], or 0 when the bytes there
// are not one (Unicode 15, table 3-7: no overlongs, no surrogates, nothing past U+10FFFF).
size_t Utf8SequenceLength(absl::string_view text, size_t i) {
  auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  auto in = [](unsigned char b, unsigned char lo, unsigned char hi) { return b >= lo && b <= hi; };
  const unsigned char b0 = byte(i);
  const size_t left = text.size() - i;
  if (b0 < 0x80) return 1;
  if (in(b0, 0xC2, 0xDF)) return left >= 2 && in(byte(i + 1), 0x80, 0xBF) ? 2 : 0;
  if (in(b0, 0xE0, 0xEF)) {
    if (left < 3) return 0;
    const unsigned char lo = b0 == 0xE0 ? 0xA0 : 0x80;
    const unsigned char hi = b0 == 0xED ? 0x9F : 0xBF;
    return in(byte(i + 1), lo, hi) && in(byte(i + 2), 0x80, 0xBF) ? 3 : 0;
  }
  if (in(b0, 0xF0, 0xF4)) {
    if (left < 4) return 0;
    const unsigned char lo = b0 == 0xF0 ? 0x90 : 0x80;
    const unsigned char hi = b0 == 0xF4 ? 0x8F : 0xBF;
    return in(byte(i + 1), lo, hi) && in(byte(i + 2), 0x80, 0xBF) && in(byte(i + 3), 0x80, 0xBF)
               ? 4
               : 0;
  }
  return 0;
}

}  // namespace

absl::Status ValidateMetricName(absl::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError("metric name is empty");
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = IsAsciiLetter(c) || c == '_' || c == ':' || (i > 0 && IsAsciiDigit(c));
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat("metric name \"", name, "\" has invalid ",
                                                     DescribeChar(name, i),
                                                     "; names match [a-zA-Z_:][a-zA-Z0-9_:]*"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateLabelName(absl::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError("label name is empty");
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = IsAsciiLetter(c) || c == '_' || (i > 0 && IsAsciiDigit(c));
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat("label name \"", name, "\" has invalid ",
                                                     DescribeChar(name, i),
                                                     "; names match [a-zA-Z_][a-zA-Z0-9_]*"));
    }
  }
  if (name.size() >= 2 && name[0] == '_' && name[1] == '_') {
    return absl::InvalidArgumentError(
        absl::StrCat("label name \"", name, "\" starts with \"__\", reserved by Prometheus"));
  }
  return absl::OkStatus();
}

bool IsValidUtf8(absl::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const size_t n = Utf8SequenceLength(text, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string SanitizeUtf8(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t n = Utf8SequenceLength(text, i);
    if (n == 0) {
      out.append("\xEF\xBF\xBD");  // U+FFFD REPLACEMENT CHARACTER, one per bad byte
      ++i;
    } else {
      out.append(text.data() + i, n);
      i += n;
    }
  }
  return out;
}

namespace {

// Backslash and newline are escaped in both HELP text and label values; double quotes only in
// label values (text format 0.0.4).
void AppendEscaped(absl::string_view text, bool quotes, std::string* out) {
  for (const char c : text) {
    if (c == '\\') {
      out->append("\\\\");
    } else if (c == '\n') {
      out->append("\\n");
    } else if (c == '"' && quotes) {
      out->append("\\\"");
    } else {
      out->push_back(c);
    }
  }
}

}  // namespace

void AppendEscapedHelp(absl::string_view help, std::string* out) { AppendEscaped(help, false, out); }

void AppendEscapedLabelValue(absl::string_view value, std::string* out) { AppendEscaped(value, true, out); }

namespace {

// Appends NaN and the infinities as Prometheus spells them; false for finite values.
bool AppendSpecial(double value, std::string* out) {
  if (std::isnan(value)) {
    out->append("NaN");
    return true;
  }
  if (std::isinf(value)) {
    out->append(value > 0 ? "+Inf" : "-Inf");
    return true;
  }
  return false;
}

// Go's strconv.FormatFloat(value, 'g', -1, 64), which the reference client library uses:
// the shortest digits that round-trip, in exponent form when the decimal exponent is below
// -4 or at least 6 ("1e-05", "1e+06"), else positional ("0.0001", "123456").
// REQUIRES: value is finite.
void AppendGoStyle(double value, std::string* out) {
  // 64 bytes hold any shortest double (at most 24 characters), so to_chars cannot fail.
  char buf[64];
  const std::to_chars_result sci =
      std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  const char* e = std::find(buf, sci.ptr, 'e');
  int exponent = 0;
  std::from_chars(e + (e[1] == '+' ? 2 : 1), sci.ptr, exponent);
  if (exponent < -4 || exponent >= 6) {
    out->append(buf, sci.ptr);
    return;
  }
  const std::to_chars_result fixed =
      std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::fixed);
  out->append(buf, fixed.ptr);
}

}  // namespace

void AppendDouble(double value, std::string* out) {
  if (AppendSpecial(value, out)) return;
  // Byte and event counts are integers; spell them in full (17179869184, not 1.7179869184e+10)
  // while every such integer is exact in a double (below 2^53).
  constexpr double kExactIntegerLimit = 9007199254740992.0;  // 2^53
  if (value == std::trunc(value) && std::fabs(value) < kExactIntegerLimit) {
    char buf[32];
    const std::to_chars_result result =
        std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::fixed);
    out->append(buf, result.ptr);
    return;
  }
  AppendGoStyle(value, out);
}

std::string FormatDouble(double value) {
  std::string out;
  AppendDouble(value, &out);
  return out;
}

std::string FormatBucketBound(double value) {
  std::string out;
  if (!AppendSpecial(value, &out)) AppendGoStyle(value, &out);
  return out;
}

}  // namespace kvarn::metrics
