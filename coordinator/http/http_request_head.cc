// Reads an HTTP/1.x request head (see http_request_head.h).
#include "coordinator/http/http_request_head.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"

namespace qlora::coordinator {
namespace {

constexpr size_t kMaxFields = 64;

bool IsTokenChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
         absl::string_view("!#$%&'*+-.^_`|~").find(c) != absl::string_view::npos;
}

bool IsToken(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!IsTokenChar(c)) return false;
  }
  return true;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Control characters other than horizontal tab never belong in a request head.
bool HasControl(absl::string_view s) {
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\t') || u == 0x7f) return true;
  }
  return false;
}

absl::StatusOr<std::string> PercentDecode(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    const int high = i + 2 < s.size() ? HexValue(s[i + 1]) : -1;
    const int low = i + 2 < s.size() ? HexValue(s[i + 2]) : -1;
    if (high < 0 || low < 0) return absl::InvalidArgumentError("a bad percent escape in the path");
    out += static_cast<char>(high * 16 + low);
    i += 2;
  }
  if (HasControl(out)) return absl::InvalidArgumentError("a NUL or control character in the path");
  return out;
}

}  // namespace

std::optional<size_t> HttpRequestHeadEnd(absl::string_view received, size_t from) {
  for (size_t i = from; i < received.size(); ++i) {
    if (received[i] != '\n') continue;
    if (i + 1 < received.size() && received[i + 1] == '\n') return i + 2;
    if (i + 2 < received.size() && received[i + 1] == '\r' && received[i + 2] == '\n') return i + 3;
  }
  return std::nullopt;
}

absl::StatusOr<HttpServerRequest> ParseHttpRequestHead(absl::string_view head) {
  std::vector<absl::string_view> lines = absl::StrSplit(head, '\n');
  for (absl::string_view& line : lines) {
    if (absl::EndsWith(line, "\r")) line.remove_suffix(1);
  }
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  if (lines.empty()) return absl::InvalidArgumentError("an empty request");

  const std::vector<absl::string_view> parts = absl::StrSplit(lines[0], ' ');
  if (parts.size() != 3) return absl::InvalidArgumentError("a malformed request line");
  if (!IsToken(parts[0])) return absl::InvalidArgumentError("a malformed method");
  if (parts[2] != "HTTP/1.1" && parts[2] != "HTTP/1.0") {
    return absl::InvalidArgumentError("not HTTP/1.0 or HTTP/1.1");
  }
  const absl::string_view target = parts[1];
  if (target.empty() || target[0] != '/' || HasControl(target) || target.find('#') != absl::string_view::npos) {
    return absl::InvalidArgumentError("the target is not an absolute path");
  }
  HttpServerRequest request;
  request.method = std::string(parts[0]);
  const size_t question = target.find('?');
  absl::StatusOr<std::string> path = PercentDecode(target.substr(0, question));
  if (!path.ok()) return path.status();
  request.path = *std::move(path);
  if (question != absl::string_view::npos) request.query = std::string(target.substr(question + 1));

  if (lines.size() - 1 > kMaxFields) return absl::InvalidArgumentError("too many header fields");
  bool have_host = false;
  bool have_authorization = false;
  for (size_t i = 1; i < lines.size(); ++i) {
    const absl::string_view line = lines[i];
    if (line.empty() || line[0] == ' ' || line[0] == '\t') {
      return absl::InvalidArgumentError("a folded or empty header line");
    }
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos || !IsToken(line.substr(0, colon))) {
      return absl::InvalidArgumentError("a malformed header line");
    }
    const absl::string_view name = line.substr(0, colon);
    const absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
    if (HasControl(value)) return absl::InvalidArgumentError("a control character in a header");
    if (absl::EqualsIgnoreCase(name, "Host")) {
      if (have_host) return absl::InvalidArgumentError("more than one Host header");
      have_host = true;
      request.host = std::string(value);
    } else if (absl::EqualsIgnoreCase(name, "Authorization")) {
      if (have_authorization) return absl::InvalidArgumentError("more than one Authorization header");
      have_authorization = true;
      request.authorization = std::string(value);
    }
  }
  return request;
}

}  // namespace qlora::coordinator
