// The coordinator's small read-only HTTP server, for the metrics and the status page.
//
// Event-driven, so that slow or idle clients hold no thread: one thread owns the listening
// socket and every connection (epoll), reads each request head and writes each answer without
// blocking, under deadlines; a few handler threads only run the handler on requests that have
// arrived whole. A client (one remote address) may hold only so many connections at once, and
// the server so many in all: one over a cap is answered 503 at once and closed.
//
// Only GET and HEAD reach the handler (anything else is answered 405 with `Allow: GET, HEAD`),
// HEAD's body is dropped, nothing is served from disk, and every answer carries no-store caching
// and nosniff/deny-framing headers and closes the connection (no keep-alive).
//
// Thread-safe; the handler is called concurrently and must be too.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/http/http_request_head.h"

namespace qlora::coordinator {

struct HttpServerResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra ones
};

struct HttpServerOptions {
  std::string address;                  // "IP:port" or "[IPv6]:port"; port 0 picks a free one
  int handler_threads = 4;              // requests handled at once (reading and writing take none)
  int request_timeout_ms = 2000;        // a request head not received whole by then is dropped
  int write_timeout_ms = 10000;         // an answer not taken whole by then is dropped
  size_t max_request_bytes = 16 * 1024; // a longer head is answered 431
  // Clients behind one address (a proxy, a NAT, this host) share its cap.
  int max_connections_per_client = 32;
  int max_connections = 512;            // in all; stay well under the process's open-file limit
};

class HttpServer {
 public:
  using Handler = std::function<HttpServerResponse(const HttpServerRequest&)>;

  // Listens on `options.address` and serves `handler` until destroyed. UNAVAILABLE naming the
  // address when it cannot listen; INVALID_ARGUMENT for an address it cannot read or bad limits.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options, Handler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;

 private:
  struct Loop;
  explicit HttpServer(std::unique_ptr<Loop> loop);
  std::unique_ptr<Loop> loop_;
};

}  // namespace qlora::coordinator
