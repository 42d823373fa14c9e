// The status page's JSON (see status_api.h).
#include "coordinator/http/status_api.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"

namespace qlora::coordinator {
namespace {

using nlohmann::json;

json Number(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

json Summary(const JobRecord& job) {
  json j = {{"id", job.id},
            {"name", job.name},
            {"owner", job.owner},
            {"state", absl::AsciiStrToLower(JobStateName(job.state))},
            {"created_unix", job.created_unix},
            {"restarts", job.restarts},
            {"step", nullptr},
            {"total_steps", nullptr},
            {"loss", nullptr},
            {"eval_loss", nullptr},
            {"learning_rate", nullptr},
            {"tokens_per_second", nullptr}};
  if (!job.progress.empty()) {
    const ProgressSnapshot& p = job.progress.front();
    j["step"] = p.step;
    j["total_steps"] = p.total_steps;
    j["loss"] = Number(p.loss);
    j["eval_loss"] = Number(p.eval_loss);
    j["learning_rate"] = Number(p.learning_rate);
    double tokens = 0;
    for (const ProgressSnapshot& r : job.progress) tokens += r.tokens_per_second;
    j["tokens_per_second"] = Number(tokens);
  }
  return j;
}

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

std::string JobListJson(const std::vector<JobRecord>& jobs) {
  json list = json::array();
  for (const JobRecord& job : jobs) list.push_back(Summary(job));
  return Dump(json{{"jobs", std::move(list)}});
}

std::string LatestSamplesJson(const std::string& metrics_tail) {
  size_t end = metrics_tail.size();
  while (end > 0) {
    const size_t start = metrics_tail.rfind('\n', end - 1);
    const size_t from = start == std::string::npos ? 0 : start + 1;
    const std::string line = metrics_tail.substr(from, end - from);
    if (line.find("\"samples\"") != std::string::npos) {
      const json j = json::parse(line, nullptr, false);
      // The file is in the job's output folder, which its user may write: read nothing as a type
      // it is not (json::value throws on a mismatch).
      if (j.is_object() && j.contains("samples") && j["samples"].is_array()) {
        const int64_t step = j.contains("step") && j["step"].is_number_integer() ? j["step"].get<int64_t>() : 0;
        return Dump(json{{"step", step}, {"samples", j["samples"]}});
      }
    }
    if (start == std::string::npos) break;
    end = start;
  }
  return "null";
}

std::string JobDetailJson(const JobRecord& job, const std::vector<JobEvent>& events,
                          int64_t after_sequence, int log_rank, const std::string& log_tail,
                          const std::string& metrics_tail) {
  json summary = Summary(job);
  summary["reason_code"] = job.reason_code;
  summary["message"] = job.message;
  summary["num_workers"] = job.num_workers;
  summary["started_unix"] = job.started_unix;
  summary["finished_unix"] = job.finished_unix;
  summary["adapter_path"] = job.adapter_path;
  // Rank 0's activation checkpointing: its split of the layers and, with auto, the plan.
  summary["checkpointing"] = nullptr;
  if (!job.progress.empty() && job.progress.front().checkpointing.checkpointed_layers >= 0) {
    const CheckpointingReport& c = job.progress.front().checkpointing;
    summary["checkpointing"] = {{"checkpointed_layers", c.checkpointed_layers},
                                {"layers", c.layers},
                                {"planned_peak_bytes", c.planned_peak_bytes},
                                {"budget_bytes", c.budget_bytes},
                                {"measured_peak_bytes", c.measured_peak_bytes},
                                {"offloaded_layers", c.offloaded_layers},
                                {"dequantized_layers", c.dequantized_layers}};
  }

  std::vector<const JobEvent*> progress;
  int64_t last = after_sequence;
  for (const JobEvent& e : events) {
    last = std::max(last, e.sequence);
    if (e.progress.has_value() && e.progress->rank == 0) progress.push_back(&e);
  }
  json points = json::array();
  const size_t n = progress.size();
  const size_t stride = n > kMaxCurvePoints ? (n + kMaxCurvePoints - 1) / kMaxCurvePoints : 1;
  for (size_t i = 0; i < n; ++i) {
    if (i % stride != 0 && i + 1 != n) continue;
    const JobEvent& e = *progress[i];
    const ProgressSnapshot& p = *e.progress;
    points.push_back({{"seq", e.sequence},
                      {"time_unix", e.time_unix},
                      {"step", p.step},
                      {"loss", Number(p.loss)},
                      {"eval_loss", Number(p.eval_loss)},
                      {"learning_rate", Number(p.learning_rate)},
                      {"tokens_per_second", Number(p.tokens_per_second)}});
  }
  return Dump(json{{"job", std::move(summary)},
                   {"points", std::move(points)},
                   {"last_sequence", last},
                   {"log_rank", log_rank},
                   {"log", log_tail},
                   {"samples", json::parse(LatestSamplesJson(metrics_tail))}});
}

}  // namespace qlora::coordinator
