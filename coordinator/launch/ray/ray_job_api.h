// Ray's Job Submission REST API on the head's dashboard port (http://HEAD:8265), the calls the
// Ray launcher needs: submit a job, read its status and its driver's log, stop it, list jobs,
// and the cluster's total CPUs and GPUs. Facts from Ray's docs ("Ray Jobs REST API"):
// POST /api/jobs/ {entrypoint, submission_id, runtime_env, metadata}; GET /api/jobs/{id};
// GET /api/jobs/{id}/logs -> {"logs": "..."}; POST /api/jobs/{id}/stop; GET /api/jobs/;
// GET /api/cluster_status -> data.clusterStatus.loadMetricsReport.usage {RES: [used, total]}.
// Blocking (HTTP); thread-safe.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/http/http_client.h"
#include "coordinator/launch/worker_launcher.h"

namespace qlora::coordinator {

struct RayJobInfo {
  std::string submission_id;
  std::string status;                          // PENDING RUNNING STOPPED SUCCEEDED FAILED
  std::string message;
  std::map<std::string, std::string> metadata;
  bool terminal() const;
};

struct RaySubmission {
  std::string submission_id;
  std::string entrypoint;                      // a shell command run by the cluster
  std::map<std::string, std::string> env_vars;  // runtime_env.env_vars
  std::map<std::string, std::string> metadata;
};

// Parsers of the API's answers (exposed for tests).
absl::StatusOr<RayJobInfo> ParseRayJobInfo(const std::string& json);
absl::StatusOr<std::vector<RayJobInfo>> ParseRayJobList(const std::string& json);
absl::StatusOr<LauncherCapacity> ParseRayClusterCapacity(const std::string& json);
std::string RaySubmissionJson(const RaySubmission& submission);

class RayJobApi {
 public:
  // `address`: http://HOST:PORT of the dashboard (no trailing slash needed).
  RayJobApi(std::string address, const HttpClient* http);
  const std::string& address() const { return address_; }

  absl::Status Submit(const RaySubmission& submission) const;
  absl::StatusOr<RayJobInfo> Get(const std::string& submission_id) const;
  absl::StatusOr<std::string> Logs(const std::string& submission_id) const;
  absl::Status Stop(const std::string& submission_id) const;
  absl::StatusOr<std::vector<RayJobInfo>> List() const;
  absl::StatusOr<LauncherCapacity> Capacity() const;

 private:
  // The body of a 200 answer; another status is an error naming the call and the answer.
  absl::StatusOr<std::string> Call(const std::string& what, const std::string& path,
                                   const std::string* post_json) const;
  std::string address_;
  const HttpClient* http_;
};

}  // namespace qlora::coordinator
