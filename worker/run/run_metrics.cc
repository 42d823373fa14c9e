// TensorBoard scalars and metrics.jsonl lines for each optimizer step (see run_metrics.h).
#include "worker/run/run_metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/posix_files.h"
#include "nlohmann/json.hpp"

namespace qlora::worker {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

}  // namespace

absl::StatusOr<std::unique_ptr<RunMetrics>> RunMetrics::Open(const RunMetricsOptions& options) {
  tensorboard::EventFileOptions event_options;
  event_options.wall_time = options.wall_time;
  event_options.host = options.host;
  event_options.pid = options.pid;
  absl::StatusOr<std::unique_ptr<tensorboard::EventFileWriter>> events =
      tensorboard::EventFileWriter::Open(JoinPath(options.output_dir, "runs"), event_options);
  if (!events.ok()) return events.status();
  if (!options.hparams.empty()) {
    for (const std::string& summary :
         {tensorboard::HParamsExperimentSummary(options.hparams, options.hparam_metrics, options.wall_time),
          tensorboard::HParamsSessionStartSummary(options.hparams, options.wall_time)}) {
      if (absl::Status s = (*events)->AddSummary(0, options.wall_time, summary); !s.ok()) return s;
    }
  }
  const std::string path = JoinPath(options.output_dir, "metrics.jsonl");
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0644);
  std::FILE* file = fd < 0 ? nullptr : fdopen(fd, "ab");
  if (file == nullptr) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) close(fd);
    return absl::InternalError(absl::StrCat("cannot open ", path, ": ", why));
  }
  return std::unique_ptr<RunMetrics>(new RunMetrics(std::move(*events), file, options.mlflow));
}

RunMetrics::~RunMetrics() { std::fclose(jsonl_); }

absl::Status RunMetrics::Record(const StepMetrics& m) {
  std::vector<std::pair<std::string, float>> scalars = {
      {"train/loss", static_cast<float>(m.loss)},
      {"train/learning_rate", static_cast<float>(m.learning_rate)},
      {"train/grad_norm", static_cast<float>(m.grad_norm)},
      {"train/tokens_per_second", static_cast<float>(m.tokens_per_second)},
      {"train/epoch", static_cast<float>(m.epoch)},
      {"memory/device_allocated_gib", static_cast<float>(m.device_allocated_bytes / kGiB)},
      {"memory/device_peak_gib", static_cast<float>(m.device_peak_bytes / kGiB)},
  };
  nlohmann::json line = {{"step", m.step},
                         {"epoch", m.epoch},
                         {"loss", m.loss},
                         {"learning_rate", m.learning_rate},
                         {"grad_norm", m.grad_norm},
                         {"tokens_per_second", m.tokens_per_second},
                         {"device_allocated_bytes", m.device_allocated_bytes},
                         {"device_peak_bytes", m.device_peak_bytes},
                         {"elapsed_seconds", m.elapsed_seconds},
                         {"wall_time", m.wall_time}};
  if (!std::isnan(m.eval_loss)) {
    scalars.emplace_back("eval/loss", static_cast<float>(m.eval_loss));
    line["eval_loss"] = m.eval_loss;
  }
  for (const auto& [name, value] : m.metrics) {
    scalars.emplace_back("train/" + name, static_cast<float>(value));
    line[name] = value;
  }
  for (const auto& [name, value] : m.eval_metrics) {
    scalars.emplace_back("eval/" + name, static_cast<float>(value));
    line["eval_" + name] = value;
  }
  if (mlflow_ != nullptr) {
    const int64_t ms = static_cast<int64_t>(m.wall_time * 1000);
    std::vector<tracking::MlflowMetric> sent = {
        {"loss", m.loss, m.step, ms}, {"learning_rate", m.learning_rate, m.step, ms},
        {"grad_norm", m.grad_norm, m.step, ms}, {"epoch", static_cast<double>(m.epoch), m.step, ms},
        {"tokens_per_second", m.tokens_per_second, m.step, ms}};
    if (!std::isnan(m.eval_loss)) sent.push_back({"eval_loss", m.eval_loss, m.step, ms});
    for (const auto& [name, value] : m.metrics) sent.push_back({name, value, m.step, ms});
    for (const auto& [name, value] : m.eval_metrics) sent.push_back({"eval_" + name, value, m.step, ms});
    mlflow_->LogMetrics(std::move(sent));
  }
  if (absl::Status s = events_->AddScalars(m.step, m.wall_time, scalars); !s.ok()) return s;
  // Non-finite losses are written as null (JSON has no NaN); nlohmann does that by itself.
  return WriteLine(line.dump());
}

absl::Status RunMetrics::RecordEvaluation(int64_t step, double wall_time, double eval_loss,
                                          const std::vector<std::pair<std::string, double>>& metrics) {
  const int64_t ms = static_cast<int64_t>(wall_time * 1000);
  std::vector<tracking::MlflowMetric> sent = {{"eval_loss", eval_loss, step, ms}};
  std::vector<std::pair<std::string, float>> scalars = {{"eval/loss", static_cast<float>(eval_loss)}};
  nlohmann::json line = {{"step", step}, {"eval_loss", eval_loss}, {"wall_time", wall_time}};
  for (const auto& [name, value] : metrics) {
    sent.push_back({"eval_" + name, value, step, ms});
    scalars.emplace_back("eval/" + name, static_cast<float>(value));
    line["eval_" + name] = value;
  }
  if (mlflow_ != nullptr) mlflow_->LogMetrics(std::move(sent));
  if (absl::Status s = events_->AddScalars(step, wall_time, scalars); !s.ok()) return s;
  return WriteLine(line.dump());
}

absl::Status RunMetrics::RecordSamples(int64_t step, double wall_time, const std::vector<EvalSample>& samples) {
  nlohmann::json list = nlohmann::json::array();
  for (size_t i = 0; i < samples.size(); ++i) {
    // Markdown with the texts in code blocks, so the TEXT tab shows them as written.
    const std::string text = absl::StrCat("**prompt**\n\n```\n", samples[i].prompt, "\n```\n\n**output**\n\n```\n",
                                          samples[i].output, "\n```");
    if (absl::Status s = events_->AddSummary(step, wall_time,
                                             tensorboard::TextSummary(absl::StrCat("eval/sample_", i + 1), text));
        !s.ok()) {
      return s;
    }
    list.push_back({{"prompt", samples[i].prompt}, {"output", samples[i].output}});
  }
  return WriteLine(nlohmann::json{{"step", step}, {"wall_time", wall_time}, {"samples", list}}.dump(
      -1, ' ', false, nlohmann::json::error_handler_t::replace));
}

void RunMetrics::RecordAdapter(const std::string& dir) {
  if (mlflow_ != nullptr) mlflow_->UploadFolder(dir, "adapter");
}

absl::Status RunMetrics::RecordEnd(bool succeeded, double wall_time) {
  if (mlflow_ != nullptr) mlflow_->Finish(succeeded);
  return events_->AddSummary(0, wall_time, tensorboard::HParamsSessionEndSummary(succeeded, wall_time));
}

absl::Status RunMetrics::WriteLine(const std::string& json) {
  const std::string text = json + "\n";
  if (std::fwrite(text.data(), 1, text.size(), jsonl_) != text.size() || std::fflush(jsonl_) != 0) {
    return absl::InternalError(absl::StrCat("cannot write metrics.jsonl: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace qlora::worker
