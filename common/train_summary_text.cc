// The one-line form of a TrainSummary (see train_summary_text.h).
#include "common/train_summary_text.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace qlora {

std::string FormatTrainSummary(const TrainSummary& s) {
  std::string line = absl::StrFormat("train_runtime %.1fs, train_loss %.4f, steps %d", s.train_runtime_seconds,
                                     s.train_loss, s.steps);
  if (s.global_step != s.steps) absl::StrAppend(&line, " (", s.global_step, " in all)");
  absl::StrAppend(&line, absl::StrFormat(
                             ", samples %d, tokens %d, train_samples_per_second %.3g, "
                             "train_steps_per_second %.3g, tokens/s %.0f, peak_memory %.1f MiB",
                             s.samples, s.tokens, s.train_samples_per_second, s.train_steps_per_second,
                             s.tokens_per_second, s.peak_memory_bytes / (1024.0 * 1024.0)));
  if (!std::isnan(s.eval_loss)) {
    absl::StrAppend(&line, absl::StrFormat(", eval_loss %.4f (best %.4f)", s.eval_loss, s.best_eval_loss));
  }
  return line;
}

}  // namespace qlora
