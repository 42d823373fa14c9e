// What the coordinator's HTTP port serves (read-only; HttpServer refuses other methods):
//
//   /metrics             Prometheus text format (metrics.h)
//   /  and /jobs/<id>    the status page: a static shell whose script polls the API every 2 s
//   /static/status.{js,css}
//   /api/jobs            the caller's jobs (status_api.h)
//   /api/jobs/<id>?after=SEQ&rank=R   one job: rank 0's curve points after event SEQ and the
//                        tail of rank R's log
//
// Authentication is the gRPC API's: when the Authenticator is enabled (--auth-tokens), /api/*
// and /metrics need `Authorization: Bearer <token>` (401 otherwise); a user's list holds their
// own jobs and another user's job is 403; /metrics, which covers every job, needs an admin
// (403 for users). Tokens are never taken from a URL. The shell and its static files hold no
// data and are served to anyone.
//
// A request whose Host header names anything but an IP address or "localhost" is refused (421):
// a web page cannot then reach this port through a DNS name rebound to 127.0.0.1 and read it as
// its own origin (DNS rebinding), which matters most when authentication is off.
//
// Nothing here holds the JobManager's lock while it renders or reads files: the jobs come from
// JobManager::Snapshot / Get (copies), the curves from a read-only connection of its own to the
// job store (opened per request, so no lock of its own either), the log tail from the file
// (log_tail.h). Thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "coordinator/auth/authenticator.h"
#include "coordinator/http/http_server.h"
#include "coordinator/http/metrics.h"
#include "coordinator/jobs/job_manager.h"

namespace qlora::coordinator {

struct StatusSiteOptions {
  std::string store_path;            // the job store (SQLite) the curves are read from
  int64_t log_tail_bytes = 16 << 10; // of a rank's log, per answer
};

class StatusSite {
 public:
  // All outlive the site.
  StatusSite(StatusSiteOptions options, const JobManager* manager, const Authenticator* auth,
             const CoordinatorMetrics* metrics)
      : options_(std::move(options)), manager_(manager), auth_(auth), metrics_(metrics) {}

  HttpServerResponse Handle(const HttpServerRequest& request) const;

 private:
  absl::StatusOr<Caller> CallerOf(const HttpServerRequest& request) const;
  HttpServerResponse Metrics(const Caller& caller) const;
  HttpServerResponse JobList(const Caller& caller) const;
  HttpServerResponse JobDetail(const Caller& caller, const std::string& id, const std::string& query) const;

  const StatusSiteOptions options_;
  const JobManager* const manager_;
  const Authenticator* const auth_;
  const CoordinatorMetrics* const metrics_;
};

}  // namespace qlora::coordinator
