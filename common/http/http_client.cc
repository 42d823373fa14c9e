// libcurl behind HttpClient (see http_client.h).
#include "common/http/http_client.h"

#include <curl/curl.h>

#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace qlora {
namespace {

struct Body {
  std::string* out;
  size_t limit;
  bool overflow = false;
};

size_t Append(char* data, size_t size, size_t count, void* user) {
  Body* body = static_cast<Body*>(user);
  const size_t n = size * count;
  if (body->out->size() + n > body->limit) {
    body->overflow = true;
    return 0;  // aborts the transfer
  }
  body->out->append(data, n);
  return n;
}

}  // namespace

HttpClient::HttpClient(HttpClientOptions options) : options_(options) {
  static std::once_flag once;  // curl_global_init is not thread-safe; once per process
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

absl::StatusOr<HttpResponse> HttpClient::Get(const std::string& url) const {
  return Perform(url, "GET", nullptr, nullptr);
}

absl::StatusOr<HttpResponse> HttpClient::PostJson(const std::string& url, const std::string& json) const {
  return Perform(url, "POST", &json, "application/json");
}

absl::StatusOr<HttpResponse> HttpClient::Put(const std::string& url, const std::string& body) const {
  return Perform(url, "PUT", &body, "application/octet-stream");
}

absl::StatusOr<HttpResponse> HttpClient::Perform(const std::string& url, const char* method,
                                                 const std::string* body_out,
                                                 const char* content_type) const {
  std::unique_ptr<CURL, decltype(&curl_easy_cleanup)> curl(curl_easy_init(), &curl_easy_cleanup);
  if (!curl) return absl::InternalError("curl_easy_init failed");
  HttpResponse response;
  Body body{&response.body, options_.max_body_bytes};
  char error[CURL_ERROR_SIZE] = {0};
  CURL* c = curl.get();
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);  // safe in a multi-threaded process
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(absl::ToInt64Milliseconds(options_.timeout)));
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(absl::ToInt64Milliseconds(options_.connect_timeout)));
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &Append);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_slist* headers = nullptr;
  headers = curl_slist_append(headers, "Accept: application/json");
  for (const std::string& header : options_.headers) headers = curl_slist_append(headers, header.c_str());
  if (body_out != nullptr) {
    headers = curl_slist_append(headers, absl::StrCat("Content-Type: ", content_type).c_str());
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body_out->data());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body_out->size()));
  }
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  const CURLcode code = curl_easy_perform(c);
  curl_slist_free_all(headers);
  if (body.overflow) {
    return absl::ResourceExhaustedError(absl::StrCat(url, ": answer larger than ", options_.max_body_bytes, " bytes"));
  }
  if (code != CURLE_OK) {
    return absl::UnavailableError(absl::StrCat(url, ": ", error[0] ? error : curl_easy_strerror(code)));
  }
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &response.status);
  return response;
}

}  // namespace qlora
