// Reads the head of an HTTP/1.x request (request line and header fields, RFC 9112) as the HTTP
// port's server receives it: pure, so that every refusal can be tested without a socket.
//
// Only what the read-only port needs is kept (method, path, query, Authorization, Host); a
// request body is never read. Anything ambiguous is refused rather than guessed: a target that is
// not origin-form (absolute-form is for proxies, which this port is not, so it is refused
// although RFC 9112 asks servers to take it), a bad percent escape or a control character (NUL,
// CR, LF, ...) in the decoded path, folded or malformed header lines, a repeated Host or
// Authorization. The path is not normalised: "/a/../b" is not "/b" (routes match exactly).
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace qlora::coordinator {

struct HttpServerRequest {
  std::string method;                // as sent: "GET", "HEAD", ...
  std::string path;                  // percent-decoded, without the query
  std::string query;                 // raw, without '?'
  std::string authorization;         // the Authorization header, "" when absent
  std::string host;                  // the Host header, "" when absent
};

// Where the head ends in `received` (the offset just past its blank line), or nullopt while it
// has not all arrived, looking from `from` on (a caller that appends pieces passes where the
// previous look ended, less 3 bytes). Both CRLF and bare LF line ends are accepted, as most
// servers do.
std::optional<size_t> HttpRequestHeadEnd(absl::string_view received, size_t from = 0);

// The request in `head` (everything up to and including the blank line). INVALID_ARGUMENT naming
// what is wrong: the server answers it with 400.
absl::StatusOr<HttpServerRequest> ParseHttpRequestHead(absl::string_view head);

}  // namespace qlora::coordinator
