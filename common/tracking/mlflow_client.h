// MLflow's tracking server through its REST API (mlflow.org/docs/latest/rest-api.html):
// experiments by name (made when missing), runs, batches of params and metrics, the run's end,
// and artifacts uploaded through the server's artifact proxy (`mlflow server`'s default
// --serve-artifacts: PUT /api/2.0/mlflow-artifacts/artifacts/<run's artifact path>/<file>).
// Blocking calls with timeouts; the reporter (mlflow_reporter.h) makes them off the training
// thread. Torch-free.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/http/http_client.h"

namespace qlora::tracking {

struct MlflowSettings {
  std::string tracking_uri;       // http(s)://host:port[/prefix]
  std::string experiment_name = "Default";
  std::string run_name;
  // Credentials, never logged: a bearer token, or a user name and password (basic auth).
  std::string token, username, password;
};

// From the environment, as mlflow's own client reads it: MLFLOW_TRACKING_URI,
// MLFLOW_EXPERIMENT_NAME, MLFLOW_RUN_NAME, MLFLOW_TRACKING_TOKEN, MLFLOW_TRACKING_USERNAME and
// MLFLOW_TRACKING_PASSWORD. FAILED_PRECONDITION without an http(s) MLFLOW_TRACKING_URI.
absl::StatusOr<MlflowSettings> MlflowSettingsFromEnvironment();

struct MlflowMetric {
  std::string key;
  double value = 0;
  int64_t step = 0;
  int64_t timestamp_ms = 0;
};

struct MlflowRun {
  std::string run_id;
  std::string artifact_uri;  // "mlflow-artifacts:/<experiment>/<run>/artifacts" with the proxy
};

class MlflowClient {
 public:
  explicit MlflowClient(const MlflowSettings& settings, HttpClientOptions http = {});

  // The experiment's id, made when the server has none of that name.
  absl::StatusOr<std::string> ExperimentId(const std::string& name) const;
  absl::StatusOr<MlflowRun> CreateRun(const std::string& experiment_id, const std::string& run_name,
                                      int64_t start_ms, const std::map<std::string, std::string>& tags) const;
  // At most 1000 metrics and 100 params a call (the server's limits); values of params are cut
  // to 6000 characters.
  absl::Status LogBatch(const std::string& run_id, const std::vector<MlflowMetric>& metrics,
                        const std::vector<std::pair<std::string, std::string>>& params) const;
  // status: FINISHED, FAILED or KILLED.
  absl::Status EndRun(const std::string& run_id, const std::string& status, int64_t end_ms) const;
  // `bytes` as the artifact `path` (relative, "adapter/adapter_config.json") of `run`.
  absl::Status UploadArtifact(const MlflowRun& run, const std::string& path, const std::string& bytes) const;

 private:
  // POST (or GET without a body) of `method` under /api/2.0/mlflow/; an error names the call and
  // the server's error_code and message.
  absl::StatusOr<std::string> Call(const std::string& method, const std::string* json) const;

  std::string base_;
  HttpClient http_;
};

}  // namespace qlora::tracking
