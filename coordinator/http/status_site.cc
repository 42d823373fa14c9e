// The HTTP port's routes, authentication and answers (see status_site.h).
#include "coordinator/http/status_site.h"

#include <arpa/inet.h>

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "coordinator/http/log_tail.h"
#include "coordinator/http/status_api.h"
#include "coordinator/http/status_assets.h"
#include "coordinator/store/job_store.h"

namespace qlora::coordinator {
namespace {

constexpr char kJson[] = "application/json; charset=utf-8";

HttpServerResponse Text(int status, std::string body) {
  HttpServerResponse r;
  r.status = status;
  r.body = std::move(body);
  if (!r.body.empty() && r.body.back() != '\n') r.body += '\n';
  return r;
}

HttpServerResponse Error(const absl::Status& status) {
  int code = 500;
  switch (status.code()) {
    case absl::StatusCode::kUnauthenticated: code = 401; break;
    case absl::StatusCode::kPermissionDenied: code = 403; break;
    case absl::StatusCode::kNotFound: code = 404; break;
    case absl::StatusCode::kInvalidArgument: code = 400; break;
    case absl::StatusCode::kUnavailable: code = 503; break;
    default: break;
  }
  HttpServerResponse r = Text(code, std::string(status.message()));
  if (code == 401) r.headers.push_back({"WWW-Authenticate", "Bearer realm=\"qlora-coordinator\""});
  return r;
}

HttpServerResponse Asset(const char* content_type, const char* body) {
  HttpServerResponse r;
  r.content_type = content_type;
  r.body = body;
  return r;
}

// The value of `name` in a query string ("a=1&b=2"); "" when absent.
std::string QueryValue(const std::string& query, absl::string_view name) {
  for (absl::string_view part : absl::StrSplit(query, '&')) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(part, absl::MaxSplits('=', 1));
    if (kv.first == name) return std::string(kv.second);
  }
  return "";
}

// A non-negative integer query parameter, `fallback` when absent; INVALID_ARGUMENT otherwise.
absl::StatusOr<int64_t> QueryInt(const std::string& query, absl::string_view name, int64_t fallback) {
  const std::string value = QueryValue(query, name);
  if (value.empty()) return fallback;
  int64_t n;
  if (!absl::SimpleAtoi(value, &n) || n < 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, " must be a non-negative integer"));
  }
  return n;
}

// Whether a Host header names this server by address: an IPv4 or [IPv6] literal or "localhost",
// with or without a port; an absent header (HTTP/1.0) too.
bool HostIsAnAddress(const std::string& host) {
  if (host.empty()) return true;
  std::string name = host;
  if (name[0] == '[') {
    const size_t close = name.find(']');
    if (close == std::string::npos) return false;
    const std::string rest = name.substr(close + 1);
    if (!rest.empty() && rest[0] != ':') return false;
    in6_addr v6;
    return inet_pton(AF_INET6, name.substr(1, close - 1).c_str(), &v6) == 1;
  }
  if (const size_t colon = name.find(':'); colon != std::string::npos) name.resize(colon);
  in_addr v4;
  return absl::EqualsIgnoreCase(name, "localhost") || inet_pton(AF_INET, name.c_str(), &v4) == 1;
}

}  // namespace

absl::StatusOr<Caller> StatusSite::CallerOf(const HttpServerRequest& request) const {
  PresentedCredentials presented;
  if (!request.authorization.empty()) {
    constexpr absl::string_view kBearer = "Bearer ";
    // A malformed header counts as a token that matches nobody (as on the gRPC port).
    presented.bearer_token = absl::StartsWithIgnoreCase(request.authorization, kBearer)
                                 ? request.authorization.substr(kBearer.size())
                                 : request.authorization;
    if (presented.bearer_token.empty()) presented.bearer_token = " ";
  }
  return auth_->Authenticate(presented);
}

HttpServerResponse StatusSite::Handle(const HttpServerRequest& request) const {
  const std::string& path = request.path;
  HttpServerResponse response;
  if (!HostIsAnAddress(request.host)) {
    response = Text(421, "address this server by its IP address or as localhost (DNS names are refused: "
                         "DNS-rebinding guard)");
  } else if (path == "/static/status.js") {
    response = Asset("text/javascript; charset=utf-8", kStatusPageJs);
  } else if (path == "/static/status.css") {
    response = Asset("text/css; charset=utf-8", kStatusPageCss);
  } else if (path == "/" || (absl::StartsWith(path, "/jobs/") && path.find('/', 6) == std::string::npos)) {
    response = Asset("text/html; charset=utf-8", kStatusPageHtml);
  } else if (path == "/metrics" || path == "/api/jobs" || absl::StartsWith(path, "/api/jobs/")) {
    absl::StatusOr<Caller> caller = CallerOf(request);
    if (!caller.ok()) {
      response = Error(caller.status());
    } else if (path == "/metrics") {
      response = Metrics(*caller);
    } else if (path == "/api/jobs") {
      response = JobList(*caller);
    } else {
      response = JobDetail(*caller, path.substr(std::string("/api/jobs/").size()), request.query);
    }
  } else {
    response = Text(404, "not found");
  }
  response.headers.push_back({"Content-Security-Policy", kStatusPageCsp});
  return response;
}

HttpServerResponse StatusSite::Metrics(const Caller& caller) const {
  if (!caller.admin) {
    return Error(absl::PermissionDeniedError(
        absl::StrCat(caller.user, " may not read /metrics: it covers every user's jobs (admins only)")));
  }
  HttpServerResponse r;
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  r.body = metrics_->Render(manager_->Snapshot());
  return r;
}

HttpServerResponse StatusSite::JobList(const Caller& caller) const {
  ManagerSnapshot snapshot = manager_->Snapshot();
  std::vector<JobRecord> visible;
  for (JobRecord& job : snapshot.jobs) {
    if (caller.admin || job.owner == caller.user) visible.push_back(std::move(job));
  }
  HttpServerResponse r;
  r.content_type = kJson;
  r.body = JobListJson(visible);
  return r;
}

HttpServerResponse StatusSite::JobDetail(const Caller& caller, const std::string& id, const std::string& query) const {
  absl::StatusOr<JobRecord> job = manager_->Get(id);
  if (!job.ok()) return Error(job.status());
  if (absl::Status may = CheckMayAccess(caller, job->owner, job->id); !may.ok()) return Error(may);
  absl::StatusOr<int64_t> after = QueryInt(query, "after", 0);
  if (!after.ok()) return Error(after.status());
  absl::StatusOr<int64_t> rank = QueryInt(query, "rank", 0);
  if (!rank.ok()) return Error(rank.status());
  if (*rank >= std::max(job->num_workers, 1)) {
    return Error(absl::InvalidArgumentError(absl::StrCat("rank ", *rank, " is not in job ", id)));
  }
  // Outside every lock: the store through a read-only connection of this request's own, the log
  // through a non-blocking open.
  std::vector<JobEvent> events;
  JobStoreOptions read_only;
  read_only.read_only = true;
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(options_.store_path, read_only);
  if (!store.ok()) return Error(store.status());
  absl::StatusOr<std::vector<JobEvent>> loaded = (*store)->LoadEvents(job->id, *after);
  if (!loaded.ok()) return Error(loaded.status());
  events = *std::move(loaded);
  std::string tail;
  if (absl::StatusOr<std::string> log_path = manager_->LogPath(job->id, static_cast<int>(*rank)); log_path.ok()) {
    absl::StatusOr<std::string> read = ReadLogTail(*log_path, options_.log_tail_bytes);
    tail = read.ok() ? *std::move(read) : absl::StrCat("(", read.status().message(), ")");
  }
  // The latest evaluation samples, from the end of the job's metrics.jsonl (rank 0 writes them).
  std::string metrics_tail;
  if (!job->output_dir.empty()) {
    absl::StatusOr<std::string> read = ReadLogTail(job->output_dir + "/metrics.jsonl", options_.log_tail_bytes);
    if (read.ok()) metrics_tail = *std::move(read);
  }
  HttpServerResponse r;
  r.content_type = kJson;
  r.body = JobDetailJson(*job, events, *after, static_cast<int>(*rank), tail, metrics_tail);
  return r;
}

}  // namespace qlora::coordinator
