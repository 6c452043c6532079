#include "daemon/metrics/http_request.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace kvarn::metrics {
namespace {

// RFC 9110 section 5.6.2 "tchar".
bool IsTokenChar(char c) {
  if (absl::ascii_isalnum(static_cast<unsigned char>(c))) return true;
  return absl::string_view("!#$%&'*+-.^_`|~").find(c) != absl::string_view::npos;
}

bool IsToken(absl::string_view s) {
  if (s.empty()) return false;
  for (const char c : s) {
    if (!IsTokenChar(c)) return false;
  }
  return true;
}

// Control characters (other than horizontal tab) and DEL are never legal in a head line.
bool HasControlChar(absl::string_view s) {
  for (const char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\t') || u == 0x7f) return true;
  }
  return false;
}

absl::Status Malformed(absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("malformed request: ", why));
}

// The path of an origin-form ("/a?b") or absolute-form ("http://host/a?b") target.
absl::StatusOr<std::string> TargetPath(absl::string_view target) {
  if (target == "*") return std::string(target);  // asterisk-form: routed to 404
  if (target.empty()) return Malformed("empty target");
  if (target.front() != '/') {
    const size_t scheme_end = target.find("://");
    if (scheme_end == absl::string_view::npos || scheme_end == 0) {
      return Malformed("target is neither a path nor an absolute URI");
    }
    const absl::string_view scheme = target.substr(0, scheme_end);
    if (!absl::EqualsIgnoreCase(scheme, "http") && !absl::EqualsIgnoreCase(scheme, "https")) {
      return Malformed("unsupported URI scheme");
    }
    target.remove_prefix(scheme_end + 3);
    const size_t slash = target.find('/');
    target = slash == absl::string_view::npos ? absl::string_view("/") : target.substr(slash);
  }
  const size_t query = target.find_first_of("?#");
  return std::string(target.substr(0, query));
}

absl::StatusOr<HttpRequest> ParseRequestLine(absl::string_view line) {
  if (HasControlChar(line)) return Malformed("control character in request line");
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == absl::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == absl::string_view::npos || line.find(' ', sp2 + 1) != absl::string_view::npos) {
    return Malformed("request line is not \"METHOD TARGET VERSION\"");
  }
  const absl::string_view method = line.substr(0, sp1);
  const absl::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const absl::string_view version = line.substr(sp2 + 1);
  if (!IsToken(method)) return Malformed("bad method");
  if (version.size() != 8 || !absl::StartsWith(version, "HTTP/") ||
      !absl::ascii_isdigit(static_cast<unsigned char>(version[5])) || version[6] != '.' ||
      !absl::ascii_isdigit(static_cast<unsigned char>(version[7]))) {
    return Malformed("bad HTTP version");
  }
  if (version[5] != '1') {
    return absl::UnimplementedError(absl::StrCat("unsupported HTTP version ", version));
  }
  absl::StatusOr<std::string> path = TargetPath(target);
  if (!path.ok()) return path.status();
  HttpRequest request;
  request.method = std::string(method);
  request.path = *std::move(path);
  request.minor_version = version[7] - '0';
  return request;
}

// Splits off the next line (without its CR LF or LF); false when no full line is left.
bool NextLine(absl::string_view& rest, absl::string_view& line) {
  const size_t lf = rest.find('\n');
  if (lf == absl::string_view::npos) return false;
  line = rest.substr(0, lf);
  absl::ConsumeSuffix(&line, "\r");
  rest.remove_prefix(lf + 1);
  return true;
}

}  // namespace

absl::StatusOr<std::optional<HttpRequest>> ParseRequestHead(absl::string_view received,
                                                            size_t max_head_bytes) {
  const absl::string_view all = received;
  auto too_large = [&] {
    return absl::ResourceExhaustedError(
        absl::StrCat("request head exceeds ", max_head_bytes, " bytes"));
  };
  absl::string_view rest = received;
  absl::string_view line;
  do {
    if (!NextLine(rest, line)) {
      // Reject garbage (a TLS handshake, binary noise) before its first line even ends.
      absl::string_view partial = rest;
      absl::ConsumeSuffix(&partial, "\r");  // the CR of a CR LF whose LF is yet to come
      if (HasControlChar(partial)) return Malformed("control character in request line");
      if (all.size() > max_head_bytes) return too_large();
      return std::nullopt;
    }
  } while (line.empty());

  absl::StatusOr<HttpRequest> request = ParseRequestLine(line);
  if (!request.ok()) return request.status();

  int host_fields = 0;
  while (true) {
    if (!NextLine(rest, line)) {
      if (all.size() > max_head_bytes) return too_large();
      return std::nullopt;
    }
    if (line.empty()) break;
    if (line.front() == ' ' || line.front() == '\t') return Malformed("obsolete line folding");
    if (HasControlChar(line)) return Malformed("control character in header field");
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) return Malformed("header field without ':'");
    // No whitespace is allowed between the name and the colon (RFC 9112 section 5.1).
    if (!IsToken(line.substr(0, colon))) return Malformed("bad header field name");
    if (absl::EqualsIgnoreCase(line.substr(0, colon), "host")) ++host_fields;
  }
  if (static_cast<size_t>(all.size() - rest.size()) > max_head_bytes) return too_large();
  if (request->minor_version >= 1 && host_fields != 1) {
    return Malformed("HTTP/1.1 needs exactly one Host header field");
  }
  return std::optional<HttpRequest>(*std::move(request));
}

}  // namespace kvarn::metrics
