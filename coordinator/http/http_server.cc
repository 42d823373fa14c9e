// The read-only HTTP server on civetweb (see http_server.h).
#include "coordinator/http/http_server.h"

#include <civetweb.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace qlora::coordinator {
namespace {

const char* Reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 421: return "Misdirected Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 503: return "Service Unavailable";
    default: return status < 400 ? "OK" : "Error";
  }
}

void Send(mg_connection* conn, const HttpServerResponse& response, bool head) {
  std::string header = absl::StrCat("HTTP/1.1 ", response.status, " ", Reason(response.status), "\r\n",
                                    "Content-Type: ", response.content_type, "\r\n",
                                    "Content-Length: ", response.body.size(), "\r\n",
                                    "Cache-Control: no-store\r\n"
                                    "X-Content-Type-Options: nosniff\r\n"
                                    "X-Frame-Options: DENY\r\n"
                                    "Referrer-Policy: no-referrer\r\n"
                                    "Connection: close\r\n");
  for (const auto& [name, value] : response.headers) absl::StrAppend(&header, name, ": ", value, "\r\n");
  header += "\r\n";
  mg_write(conn, header.data(), header.size());
  if (!head && !response.body.empty()) mg_write(conn, response.body.data(), response.body.size());
}

// civetweb's own log lines (a bad request, a dropped connection) are not the operator's concern.
int Quiet(const mg_connection*, const char*) { return 1; }

}  // namespace

int HttpServer::Serve(mg_connection* conn, void* self) {
  const mg_request_info* info = mg_get_request_info(conn);
  HttpServerRequest request;
  request.method = info->request_method ? info->request_method : "";
  request.path = info->local_uri ? info->local_uri : "";
  request.query = info->query_string ? info->query_string : "";
  if (const char* auth = mg_get_header(conn, "Authorization")) request.authorization = auth;
  if (const char* host = mg_get_header(conn, "Host")) request.host = host;
  HttpServerResponse response;
  if (request.method != "GET" && request.method != "HEAD") {
    response.status = 405;
    response.body = "read-only: only GET and HEAD\n";
    response.headers.push_back({"Allow", "GET, HEAD"});
  } else {
    response = static_cast<HttpServer*>(self)->handler_(request);
  }
  Send(conn, response, request.method == "HEAD");
  return response.status;
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options, Handler handler) {
  mg_init_library(0);
  std::unique_ptr<HttpServer> server(new HttpServer(std::move(handler)));
  const std::string threads = absl::StrCat(options.threads);
  const std::string timeout = absl::StrCat(options.request_timeout_ms);
  const char* config[] = {"listening_ports", options.address.c_str(),
                          "num_threads", threads.c_str(),
                          "request_timeout_ms", timeout.c_str(),
                          "enable_keep_alive", "no",
                          nullptr};
  mg_callbacks callbacks;
  memset(&callbacks, 0, sizeof(callbacks));
  callbacks.log_message = Quiet;
  mg_init_data init;
  memset(&init, 0, sizeof(init));
  init.callbacks = &callbacks;
  init.configuration_options = config;
  char error_text[256] = "";
  unsigned error_code = 0;
  mg_error_data error;
  memset(&error, 0, sizeof(error));
  error.code = &error_code;
  error.text = error_text;
  error.text_buffer_size = sizeof(error_text);
  server->context_ = mg_start2(&init, &error);
  if (server->context_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot serve HTTP on ", options.address, ": ",
                                               error_text[0] ? error_text : "civetweb failed to start"));
  }
  mg_set_request_handler(server->context_, "/", &HttpServer::Serve, server.get());
  mg_server_port ports[4];
  memset(ports, 0, sizeof(ports));
  if (mg_get_server_ports(server->context_, 4, ports) > 0) server->port_ = ports[0].port;
  if (server->port_ <= 0) return absl::UnavailableError(absl::StrCat("cannot serve HTTP on ", options.address));
  return server;
}

HttpServer::~HttpServer() {
  if (context_ != nullptr) mg_stop(context_);
}

}  // namespace qlora::coordinator
