// Fuzz target: what a client sends the HTTP port. Feeds the bytes to HttpRequestHeadEnd and, up to
// the end it finds, to ParseHttpRequestHead, and checks what the handler relies on for every
// accepted head: an origin-form path without NUL, a token method, header values without
// control characters other than tab.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "coordinator/http/http_request_head.h"

namespace {

[[noreturn]] void Fail(const char* what, const std::string& head) {
  std::fprintf(stderr, "accepted a head it should not: %s\n--- head:\n%s\n", what, head.c_str());
  std::abort();
}

bool HasControl(const std::string& s) {
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\t') || u == 0x7f) return true;
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string received(reinterpret_cast<const char*>(data), size);
  const std::optional<size_t> end = qlora::coordinator::HttpRequestHeadEnd(received);
  if (!end) return 0;
  if (*end > received.size()) Fail("the end lies past the bytes", received);
  const std::string head = received.substr(0, *end);
  absl::StatusOr<qlora::coordinator::HttpServerRequest> request = qlora::coordinator::ParseHttpRequestHead(head);
  if (!request.ok()) return 0;
  if (request->path.empty() || request->path[0] != '/') Fail("a path not starting with /", head);
  if (request->path.find('\0') != std::string::npos) Fail("a NUL in the path", head);
  if (request->method.empty() || HasControl(request->method) || request->method.find(' ') != std::string::npos) {
    Fail("a malformed method", head);
  }
  if (HasControl(request->query)) Fail("a control character in the query", head);
  if (HasControl(request->host) || HasControl(request->authorization)) Fail("a control character in a header", head);
  return 0;
}
