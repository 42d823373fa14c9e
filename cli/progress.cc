// Progress lines for watch / submit --follow (see progress.h).
#include "cli/progress.h"

#include <cmath>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace qlora::cli {
namespace {

bool HasSteps(const v1::Job& job) { return job.progress_size() > 0 && job.progress(0).total_steps() > 0; }

// What a piped line stands for: rank 0's step (the other ranks report the same steps), the state,
// the eval loss; the state message only before training reports steps.
std::string PipedKey(const v1::Job& job) {
  if (!HasSteps(job)) return absl::StrCat(job.state(), "|", job.state_message());
  const v1::Progress& p = job.progress(0);
  return absl::StrCat(job.state(), "|", p.step(), "/", p.total_steps(), "|", p.eval_loss());
}

}  // namespace

bool IsTerminal(v1::JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED;
}

const char* StateName(v1::JobState s) {
  switch (s) {
    case v1::JOB_STATE_QUEUED: return "QUEUED";
    case v1::JOB_STATE_STARTING: return "STARTING";
    case v1::JOB_STATE_RUNNING: return "RUNNING";
    case v1::JOB_STATE_SUCCEEDED: return "SUCCEEDED";
    case v1::JOB_STATE_FAILED: return "FAILED";
    case v1::JOB_STATE_CANCELLED: return "CANCELLED";
    default: return "UNSPECIFIED";
  }
}

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  return absl::StrFormat("%d:%02d:%02d", s / 3600, (s / 60) % 60, s % 60);
}

std::string CheckpointLine(const v1::Progress& p) {
  const v1::CheckpointingReport& c = p.checkpointing();
  if (!p.has_checkpointing() || c.checkpointed_layers() < 0) return "";
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  std::string line = absl::StrFormat("rank %d: %d of %d layers activation-checkpointed", p.rank(),
                                     c.checkpointed_layers(), c.layers());
  if (c.budget_bytes() > 0) {
    absl::StrAppendFormat(&line, ", planned peak %.1f GiB of a %.1f GiB budget",
                          c.planned_peak_bytes() / kGiB, c.budget_bytes() / kGiB);
  }
  if (c.measured_peak_bytes() > 0) {
    absl::StrAppendFormat(&line, ", measured %.1f GiB", c.measured_peak_bytes() / kGiB);
  }
  if (c.offloaded_layers() > 0) {
    absl::StrAppendFormat(&line, ", %d offloaded to host memory", c.offloaded_layers());
  }
  if (c.dequantized_layers() > 0) {
    absl::StrAppendFormat(&line, ", %d with dequantized weights", c.dequantized_layers());
  }
  return line;
}

std::string BaseWeightsLine(const v1::Progress& p) {
  const v1::StrategyReport& s = p.strategy();
  if (!s.partitioned_base_weights() && !s.base_weights_in_host_memory()) return "";
  constexpr double kMiB = 1024.0 * 1024.0;
  std::string where = s.partitioned_base_weights()
                          ? absl::StrFormat("partitioned over %d rank(s)", s.world_size())
                          : std::string("whole");
  if (s.base_weights_in_host_memory()) where += ", in host memory";
  return absl::StrFormat("rank %d: %s; last step gathered %.1f MiB, copied %.1f MiB from host "
                         "memory, waited %.2f s",
                         p.rank(), where, s.base_weight_gathered_bytes() / kMiB,
                         s.base_weight_copied_bytes() / kMiB, s.base_weight_wait_seconds());
}

std::string ProgressLine(const v1::Job& job) {
  std::string line = absl::StrCat(job.id(), " ", StateName(job.state()));
  if (!HasSteps(job)) {
    if (!job.state_message().empty()) absl::StrAppend(&line, "  ", job.state_message());
    return line;
  }
  const v1::Progress& p = job.progress(0);
  double tokens = 0;
  for (const v1::Progress& r : job.progress()) tokens += r.tokens_per_second();
  const double frac = static_cast<double>(p.step()) / static_cast<double>(p.total_steps());
  const int width = 20;
  const int filled = static_cast<int>(frac * width);
  std::string bar(width, ' ');
  for (int i = 0; i < filled; ++i) bar[i] = '=';
  if (filled < width) bar[filled] = '>';
  const double eta = p.step() > 0 ? p.elapsed_seconds() / p.step() * (p.total_steps() - p.step()) : NAN;
  absl::StrAppendFormat(&line, " step %d/%d [%s] loss %.4f lr %.3g tok/s %.0f ETA %s", p.step(),
                        p.total_steps(), bar, p.loss(), p.learning_rate(), tokens, FormatDuration(eta));
  if (std::isfinite(p.eval_loss()) && p.eval_loss() > 0) absl::StrAppendFormat(&line, " eval %.4f", p.eval_loss());
  // Preference tuning: how often the chosen side wins and by how much (TRL's rewards).
  const auto& metrics = p.metrics();
  for (const auto& [name, label] : {std::pair{"rewards/accuracies", "acc"}, {"rewards/margins", "margin"}}) {
    if (const auto it = metrics.find(name); it != metrics.end()) absl::StrAppendFormat(&line, " %s %.3f", label, it->second);
  }
  return line;
}

std::string ProgressPrinter::Update(const v1::Job& job) {
  const std::string line = ProgressLine(job);
  if (tty_) {
    if (line == last_line_) return "";
    last_line_ = line;
    return absl::StrCat("\r\033[K", line);
  }
  std::string key = PipedKey(job);
  if (key == last_key_) return "";
  last_key_ = std::move(key);
  return absl::StrCat(line, "\n");
}

std::string ProgressPrinter::Finish() { return tty_ && !last_line_.empty() ? "\n" : ""; }

}  // namespace qlora::cli
