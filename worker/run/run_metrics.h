// Rank 0's per-step training metrics, where tools read them: TensorBoard event files under
// <output>/runs/ and one JSON object per line in <output>/metrics.jsonl (torch-free).
//
// Per optimizer step: train/loss, train/learning_rate, train/grad_norm, train/tokens_per_second
// (rank 0's input tokens per second, i.e. per GPU), train/epoch, memory/device_allocated_gib,
// memory/device_peak_gib, and eval/loss at the steps where the job evaluated; the objective's
// metrics beside them (StepMetrics::metrics). A resumed run adds
// a new event file beside the old ones (TensorBoard shows them as one run) and appends to
// metrics.jsonl, so steps after the resumed checkpoint can appear twice there; the later line is
// the run that went on. Files are flushed every step, never synced (a metrics write must not
// stall training); a write error is reported once and metrics stop, training goes on.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tensorboard/event_file_writer.h"
#include "common/tensorboard/hparams_summary.h"
#include "common/tracking/mlflow_reporter.h"
#include "worker/run/eval_sample.h"

namespace qlora::worker {

struct StepMetrics {
  int64_t step = 0;  // optimizer steps done (1-based)
  int epoch = 0;
  double loss = 0;
  double learning_rate = 0;
  double grad_norm = 0;
  double tokens_per_second = 0;
  double eval_loss = std::numeric_limits<double>::quiet_NaN();  // NaN: not evaluated this step
  int64_t device_allocated_bytes = 0;
  int64_t device_peak_bytes = 0;
  double elapsed_seconds = 0;
  double wall_time = 0;  // seconds since the epoch
  // The objective's metrics (preference tuning: TRL's names, rewards/chosen, ...): train/<name>
  // in TensorBoard, <name> in metrics.jsonl and MLflow; eval_metrics (evaluated steps) as
  // eval/<name> and eval_<name>.
  std::vector<std::pair<std::string, double>> metrics;
  std::vector<std::pair<std::string, double>> eval_metrics;
};

struct RunMetricsOptions {
  std::string output_dir;  // runs/ and metrics.jsonl go here
  std::string host = "localhost";
  int64_t pid = 0;
  double wall_time = 0;    // now, for the event file's name
  // Written first for TensorBoard's HParams tab (hparams_summary.h), when given.
  std::vector<tensorboard::HParam> hparams;
  std::vector<std::string> hparam_metrics;  // the scalar tags shown beside them
  // Also sent to MLflow (report_to: mlflow) when set: each step's metrics under HF Trainer's
  // names (loss, learning_rate, grad_norm, epoch, eval_loss, tokens_per_second), the adapter
  // as artifacts, the run's end.
  std::shared_ptr<tracking::MlflowReporter> mlflow;
};

class RunMetrics {
 public:
  static absl::StatusOr<std::unique_ptr<RunMetrics>> Open(const RunMetricsOptions& options);
  ~RunMetrics();
  RunMetrics(const RunMetrics&) = delete;
  RunMetrics& operator=(const RunMetrics&) = delete;

  absl::Status Record(const StepMetrics& m);
  // An evaluation outside a step's record (the final one): eval/loss (and the objective's eval
  // metrics) at `step`.
  absl::Status RecordEvaluation(int64_t step, double wall_time, double eval_loss,
                                const std::vector<std::pair<std::string, double>>& metrics = {});
  // Evaluation samples at `step`: each as TensorBoard text `eval/sample_<i>` (prompt and output
  // in markdown), and one metrics.jsonl line {"step", "samples": [{"prompt", "output"}]}.
  absl::Status RecordSamples(int64_t step, double wall_time, const std::vector<EvalSample>& samples);
  // The final adapter's files, as MLflow artifacts under adapter/ (queued; nothing without it).
  void RecordAdapter(const std::string& dir);
  // The HParams tab's status of the run (success or failure), once it has ended; MLflow's run
  // ends too (waiting at most the reporter's finish_wait for what it has queued).
  absl::Status RecordEnd(bool succeeded, double wall_time);
  const std::string& event_file() const { return events_->path(); }

 private:
  RunMetrics(std::unique_ptr<tensorboard::EventFileWriter> events, std::FILE* jsonl,
             std::shared_ptr<tracking::MlflowReporter> mlflow)
      : events_(std::move(events)), jsonl_(jsonl), mlflow_(std::move(mlflow)) {}
  absl::Status WriteLine(const std::string& json);
  std::unique_ptr<tensorboard::EventFileWriter> events_;
  std::FILE* jsonl_;
  std::shared_ptr<tracking::MlflowReporter> mlflow_;  // null: not reporting to MLflow
};

}  // namespace qlora::worker
