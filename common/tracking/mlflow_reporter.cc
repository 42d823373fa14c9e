// MlflowReporter (see mlflow_reporter.h).
#include "common/tracking/mlflow_reporter.h"

#include <dirent.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace qlora::tracking {
namespace {

constexpr size_t kMetricsABatch = 1000;  // the server's limit per log-batch
constexpr size_t kParamsABatch = 100;

int64_t WallMs() { return absl::ToUnixMillis(absl::Now()); }

// Regular files under `dir`, relative paths (no links followed).
void ListFiles(const std::string& dir, const std::string& prefix, std::vector<std::string>* out) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    struct stat st;
    const std::string path = dir + "/" + name;
    if (lstat(path.c_str(), &st) != 0) continue;
    const std::string relative = prefix.empty() ? name : prefix + "/" + name;
    if (S_ISDIR(st.st_mode)) ListFiles(path, relative, out);
    if (S_ISREG(st.st_mode)) out->push_back(relative);
  }
  closedir(d);
}

}  // namespace

MlflowReporter::MlflowReporter(MlflowReporterOptions options)
    : options_(std::move(options)), client_(options_.settings, options_.http) {
  thread_ = std::thread([this] { Loop(); });
}

MlflowReporter::~MlflowReporter() {
  Finish(false);
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    changed_.SignalAll();
  }
  thread_.join();
}

void MlflowReporter::LogMetrics(std::vector<MlflowMetric> metrics) {
  absl::MutexLock lock(&mu_);
  if (end_.has_value()) return;
  const int64_t now = options_.now_ms ? options_.now_ms() : WallMs();
  for (MlflowMetric& m : metrics) {
    if (m.timestamp_ms == 0) m.timestamp_ms = now;
    metrics_.push_back(std::move(m));
  }
  while (metrics_.size() > options_.max_queued_metrics) {
    metrics_.pop_front();
    ++stats_.metrics_dropped;
  }
  changed_.SignalAll();
}

void MlflowReporter::UploadFolder(const std::string& dir, const std::string& artifact_path) {
  absl::MutexLock lock(&mu_);
  if (end_.has_value()) return;
  uploads_.push_back({dir, artifact_path});
  changed_.SignalAll();
}

void MlflowReporter::Finish(bool succeeded) {
  absl::MutexLock lock(&mu_);
  if (!end_.has_value()) end_ = succeeded;
  changed_.SignalAll();
  const absl::Time give_up = absl::Now() + options_.finish_wait;
  // A server that never answered gets no wait: nothing would be delivered in it.
  auto ended = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return stats_.ended || stop_ || (stats_.run_id.empty() && stats_.failures > 0);
  };
  while (!ended() && absl::Now() < give_up) changed_.WaitWithDeadline(&mu_, give_up);
  stop_ = true;  // whatever is left is given up
  changed_.SignalAll();
}

MlflowReporter::Stats MlflowReporter::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void MlflowReporter::Failed(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  ++stats_.failures;
  if (warned_) return;
  warned_ = true;
  options_.warn(absl::StrCat("MLflow: ", status.message(), "; metrics are kept (at most ",
                             options_.max_queued_metrics, ") and sent again, training goes on"));
}

bool MlflowReporter::Work() {
  if (run_.run_id.empty()) {
    absl::StatusOr<std::string> experiment = client_.ExperimentId(options_.settings.experiment_name);
    if (!experiment.ok()) return Failed(experiment.status()), false;
    const std::string name = options_.settings.run_name.empty() ? options_.run_name : options_.settings.run_name;
    absl::StatusOr<MlflowRun> run =
        client_.CreateRun(*experiment, name, options_.now_ms ? options_.now_ms() : WallMs(), options_.tags);
    if (!run.ok()) return Failed(run.status()), false;
    run_ = *run;
    absl::MutexLock lock(&mu_);
    stats_.run_id = run_.run_id;
  }
  if (!params_sent_) {
    for (size_t i = 0; i < options_.params.size(); i += kParamsABatch) {
      const std::vector<std::pair<std::string, std::string>> batch(
          options_.params.begin() + i, options_.params.begin() + std::min(options_.params.size(), i + kParamsABatch));
      if (absl::Status s = client_.LogBatch(run_.run_id, {}, batch); !s.ok()) return Failed(s), false;
    }
    params_sent_ = true;
  }
  std::vector<MlflowMetric> batch;
  std::optional<Upload> upload;
  std::optional<bool> end;
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < metrics_.size() && i < kMetricsABatch; ++i) batch.push_back(metrics_[i]);
    if (batch.empty() && !uploads_.empty()) upload = uploads_.front();
    if (batch.empty() && !upload) end = end_;
  }
  if (!batch.empty()) {
    if (absl::Status s = client_.LogBatch(run_.run_id, batch, {}); !s.ok()) return Failed(s), false;
    absl::MutexLock lock(&mu_);
    metrics_.erase(metrics_.begin(), metrics_.begin() + std::min(metrics_.size(), batch.size()));
    stats_.metrics_sent += static_cast<int64_t>(batch.size());
    return true;
  }
  if (upload) {
    std::vector<std::string> files;
    ListFiles(upload->dir, "", &files);
    for (const std::string& file : files) {
      std::ifstream in(upload->dir + "/" + file, std::ios::binary);
      std::ostringstream bytes;
      bytes << in.rdbuf();
      if (absl::Status s = client_.UploadArtifact(run_, upload->artifact_path + "/" + file, bytes.str()); !s.ok()) {
        return Failed(s), false;
      }
    }
    absl::MutexLock lock(&mu_);
    uploads_.pop_front();
    stats_.files_uploaded += static_cast<int64_t>(files.size());
    return true;
  }
  if (end) {
    const int64_t now = options_.now_ms ? options_.now_ms() : WallMs();
    if (absl::Status s = client_.EndRun(run_.run_id, *end ? "FINISHED" : "FAILED", now); !s.ok()) {
      return Failed(s), false;
    }
    absl::MutexLock lock(&mu_);
    stats_.ended = true;
    changed_.SignalAll();
  }
  return true;
}

void MlflowReporter::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      // Work while the run is not made yet or something is queued.
      while (!stop_ && !stats_.ended && !run_.run_id.empty() && params_sent_ && metrics_.empty() &&
             uploads_.empty() && !end_.has_value()) {
        changed_.Wait(&mu_);
      }
      if (stop_ || stats_.ended) return;
    }
    if (Work()) {
      absl::MutexLock lock(&mu_);
      if (warned_ && stats_.failures > 0) {
        warned_ = false;
        options_.warn("MLflow: the tracking server answers again");
      }
      continue;
    }
    absl::MutexLock lock(&mu_);
    changed_.WaitWithTimeout(&mu_, options_.retry_pause);  // Finish or the destructor wake it
  }
}

}  // namespace qlora::tracking
