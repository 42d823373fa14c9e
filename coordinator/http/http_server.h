// A small read-only HTTP server on civetweb (the embedded server prometheus-cpp's own exposer
// uses), for the metrics and the status page. civetweb is known to this file's .cc alone.
//
// Every request goes to one handler, on one of civetweb's worker threads; only GET and HEAD
// reach it (anything else is answered 405 with `Allow: GET, HEAD`), HEAD's body is dropped, and
// no file is ever served from disk (no document root). Every answer carries no-store caching
// and nosniff/deny-framing headers and closes the connection.
//
// Thread-safe; the handler is called concurrently and must be too.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

struct mg_context;
struct mg_connection;

namespace qlora::coordinator {

struct HttpServerRequest {
  std::string method;                // "GET" or "HEAD"
  std::string path;                  // URL-decoded, without the query
  std::string query;                 // raw, without '?'
  std::string authorization;         // the Authorization header, "" when absent
  std::string host;                  // the Host header, "" when absent
};

struct HttpServerResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra ones
};

struct HttpServerOptions {
  std::string address;               // "IP:port" or "[IPv6]:port"; port 0 picks a free one
  // A connection holds a thread from accept until its request has been read, so slow clients
  // (a byte a second) hold threads: enough threads that a handful cannot take them all, and a
  // short deadline for reading a whole request (a GET is a few hundred bytes).
  int threads = 32;                  // concurrent connections
  int request_timeout_ms = 2000;     // a request not read in full by then is dropped
};

class HttpServer {
 public:
  using Handler = std::function<HttpServerResponse(const HttpServerRequest&)>;

  // Listens on `options.address` and serves `handler` until destroyed. UNAVAILABLE naming the
  // address when it cannot listen.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options, Handler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }

 private:
  explicit HttpServer(Handler handler) : handler_(std::move(handler)) {}
  static int Serve(mg_connection* conn, void* self);

  const Handler handler_;
  mg_context* context_ = nullptr;
  int port_ = 0;
};

}  // namespace qlora::coordinator
