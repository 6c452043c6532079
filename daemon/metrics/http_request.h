// Parsing of an HTTP/1.x request head (request line and header fields, RFC 9112), just
// enough for a read-only metrics endpoint: no bodies, no keep-alive. Kept apart from the
// socket code so every malformed-input case is testable without a socket.
#ifndef KVARN_DAEMON_METRICS_HTTP_REQUEST_H_
#define KVARN_DAEMON_METRICS_HTTP_REQUEST_H_

#include <cstddef>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvarn::metrics {

struct HttpRequest {
  std::string method;     // case-sensitive token, e.g. "GET"
  std::string path;       // the target's path: no query, no scheme or authority
  int minor_version = 1;  // HTTP/1.<minor_version>
};

// Parses the request head at the start of `received` (all bytes read from the connection so
// far). Returns:
//  - std::nullopt: the head is incomplete and nothing seen so far is malformed; read more.
//  - the request, once the empty line ending the head has arrived. Bytes after it (a body)
//    are ignored.
//  - INVALID_ARGUMENT (answer 400): a malformed request line or header field, obsolete line
//    folding, control characters, a missing or repeated Host in HTTP/1.1.
//  - RESOURCE_EXHAUSTED (answer 431): the head does not end within `max_head_bytes`.
//  - UNIMPLEMENTED (answer 505): a well-formed HTTP version other than 1.x.
// Either CRLF or a bare LF ends a line, as RFC 9112 section 2.2 allows; empty lines before
// the request line are skipped.
absl::StatusOr<std::optional<HttpRequest>> ParseRequestHead(absl::string_view received,
                                                            size_t max_head_bytes);

}  // namespace kvarn::metrics

#endif  // KVARN_DAEMON_METRICS_HTTP_REQUEST_H_
