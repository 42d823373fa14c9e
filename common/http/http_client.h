// A small blocking HTTP/1.1 client for JSON APIs (Ray's dashboard, MLflow's tracking server), on
// libcurl: libcurl handles chunked bodies, redirects, proxies (http_proxy/no_proxy), IPv6 and
// https, which a hand-written socket client would get wrong or miss. Every call has a timeout;
// callers make none under a lock that others wait on (RayWorkerLauncher and the MLflow reporter
// call it from threads of their own). Thread-safe: each call uses its own handle.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace qlora {

struct HttpResponse {
  long status = 0;                   // the HTTP status code
  std::string body;
};

struct HttpClientOptions {
  absl::Duration timeout = absl::Seconds(10);          // the whole request
  absl::Duration connect_timeout = absl::Seconds(3);
  size_t max_body_bytes = 256u << 20;                   // a larger answer is an error
  // Sent with every request ("Authorization: Bearer ..."): kept out of URLs and logs.
  std::vector<std::string> headers;
};

class HttpClient {
 public:
  explicit HttpClient(HttpClientOptions options = {});
  // UNAVAILABLE when the server cannot be reached or the request times out; any HTTP status
  // is an answer (the caller decides what a 404 means).
  absl::StatusOr<HttpResponse> Get(const std::string& url) const;
  absl::StatusOr<HttpResponse> PostJson(const std::string& url, const std::string& json) const;
  // PUT of raw bytes (application/octet-stream).
  absl::StatusOr<HttpResponse> Put(const std::string& url, const std::string& body) const;

 private:
  absl::StatusOr<HttpResponse> Perform(const std::string& url, const char* method,
                                       const std::string* body, const char* content_type) const;
  HttpClientOptions options_;
};

}  // namespace qlora
