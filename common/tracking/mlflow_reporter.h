// A run's metrics on an MLflow tracking server without ever holding training up: every call
// only queues work for a thread of the reporter's own, which makes the run (experiment made
// when missing; the job's params and tags), sends metrics in batches, uploads artifacts and ends
// the run. A server that is down or refuses is retried (a pause between tries) while the queue
// holds at most `max_queued_metrics` (the oldest are dropped beyond it), and said once through
// `warn` (and once more when it answers again); training never waits for it, and at the end
// Finish waits at most `finish_wait` for what is queued. Torch-free.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/tracking/mlflow_client.h"

namespace qlora::tracking {

struct MlflowReporterOptions {
  MlflowSettings settings;
  std::string run_name;              // when MLFLOW_RUN_NAME is not set
  std::map<std::string, std::string> tags;
  std::vector<std::pair<std::string, std::string>> params;
  size_t max_queued_metrics = 100000;
  absl::Duration retry_pause = absl::Seconds(2);
  absl::Duration finish_wait = absl::Seconds(60);
  HttpClientOptions http{absl::Seconds(20), absl::Seconds(3)};
  std::function<void(const std::string&)> warn = [](const std::string&) {};
  std::function<int64_t()> now_ms;   // default: the wall clock
};

class MlflowReporter {
 public:
  explicit MlflowReporter(MlflowReporterOptions options);
  ~MlflowReporter();  // Finish(false) if not finished
  MlflowReporter(const MlflowReporter&) = delete;
  MlflowReporter& operator=(const MlflowReporter&) = delete;

  void LogMetrics(std::vector<MlflowMetric> metrics);
  // Every regular file under `dir` (recursively), as artifacts under `artifact_path`.
  void UploadFolder(const std::string& dir, const std::string& artifact_path);
  // Ends the run FINISHED or FAILED after what is queued, waiting at most finish_wait.
  void Finish(bool succeeded);

  // What happened, for logs and tests.
  struct Stats {
    std::string run_id;
    int64_t metrics_sent = 0, metrics_dropped = 0, files_uploaded = 0, failures = 0;
    bool ended = false;
  };
  Stats stats() const;

 private:
  struct Upload {
    std::string dir, artifact_path;
  };
  void Loop();
  // One step of work; false when it failed (the loop pauses and tries again).
  bool Work();
  void Failed(const absl::Status& status);

  const MlflowReporterOptions options_;
  const MlflowClient client_;
  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  std::deque<MlflowMetric> metrics_ ABSL_GUARDED_BY(mu_);
  std::deque<Upload> uploads_ ABSL_GUARDED_BY(mu_);
  std::optional<bool> end_ ABSL_GUARDED_BY(mu_);  // set: end the run (succeeded?) when drained
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool warned_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);
  MlflowRun run_;                    // the loop thread's only
  bool params_sent_ = false;         // the loop thread's only
  std::thread thread_;
};

}  // namespace qlora::tracking
