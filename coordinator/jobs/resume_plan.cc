// Checks and describes a job continuing another's checkpoint (see resume_plan.h).
#include "coordinator/jobs/resume_plan.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checkpoint_dirs.h"
#include "common/config/resolved_diff.h"
#include "common/status_macros.h"

namespace qlora::coordinator {
namespace {

// `key` is `prefix` or lies under it.
bool Under(const std::string& key, const char* prefix) {
  return key == prefix || absl::StartsWith(key, absl::StrCat(prefix, "."));
}

template <size_t N>
bool UnderAny(const std::string& key, const char* const (&prefixes)[N]) {
  for (const char* prefix : prefixes) {
    if (Under(key, prefix)) return true;
  }
  return false;
}

// What the checkpoint's weights are for.
constexpr const char* kFixedKeys[] = {"model_type", "base_model", "base_model_path", "quantization",
                                      "adapter.type", "adapter.r", "adapter.alpha",
                                      "adapter.target_modules", "adapter.use_rslora"};
// What decides which records each step trains on.
constexpr const char* kDataOrderKeys[] = {
    "dataset", "input_features", "output_features", "prompt", "preprocessing", "data.format",
    "data.prompt_template", "data.max_sequence_length", "data.packing", "data.validation_fraction",
    "data.test_fraction", "trainer.batch_size", "trainer.gradient_accumulation_steps",
    "trainer.seed", "backend.trainer.num_workers"};
// Bookkeeping of the new job, not a change of its training.
constexpr const char* kIgnoredKeys[] = {"name", "output_dir", "trainer.resume_from_checkpoint",
                                        "backend.trainer.strategy.zero_stage_reason"};

std::string Value(const std::string& text) { return text.empty() ? "(unset)" : text; }

}  // namespace

absl::StatusOr<ResumePlan> PlanResume(const JobRecord& source, const std::string& next_resolved_yaml) {
  if (source.state == JobState::kSucceeded) {
    return absl::FailedPreconditionError(absl::StrCat(
        source.id, " succeeded, so it has nothing left to continue; to train its adapter further, "
        "start a new job from it with adapter.pretrained_adapter_weights: ", source.adapter_path));
  }
  if (source.state != JobState::kCancelled && source.state != JobState::kFailed) {
    return absl::FailedPreconditionError(absl::StrCat(
        source.id, " is ", JobStateName(source.state), ": only a cancelled or failed job can be "
        "continued (`qloractl cancel ", source.id, "` first)"));
  }
  ResumePlan plan;
  plan.checkpoint = LatestCheckpoint(CheckpointsDir(source.output_dir, source.id, source.uid));
  plan.step = plan.checkpoint.empty() ? -1 : StepOfCheckpoint(plan.checkpoint);
  if (plan.step < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        source.id, " left no complete checkpoint to continue from (a job saves one every "
        "trainer.steps_per_checkpoint steps and every trainer.checkpoint_every_minutes); submit "
        "its job file again to start over"));
  }
  QLORA_ASSIGN_OR_RETURN(std::vector<KeyChange> changes,
                         ChangedKeys(source.resolved_config_yaml, next_resolved_yaml));
  std::vector<std::string> data_order, others;
  for (const KeyChange& c : changes) {
    if (UnderAny(c.key, kIgnoredKeys)) continue;
    const std::string change = absl::StrCat(c.key, " ", Value(c.before), " -> ", Value(c.after));
    if (UnderAny(c.key, kFixedKeys)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot continue ", source.id, ": its checkpoint was trained with ", c.key, " ",
          Value(c.before), " and this job has ", Value(c.after), "; keep the base model, its "
          "quantization and the adapter's shape, or start a new job from that checkpoint's "
          "adapter with adapter.pretrained_adapter_weights: ", plan.checkpoint, "/adapter"));
    }
    (UnderAny(c.key, kDataOrderKeys) ? data_order : others).push_back(change);
  }
  plan.statement = absl::StrCat("continues ", source.id, " from step ", plan.step, " (", plan.checkpoint,
                                "): its adapters, optimizer state and data position");
  if (data_order.empty() && others.empty()) {
    absl::StrAppend(&plan.statement, "; same job file");
    return plan;
  }
  if (!others.empty()) {
    absl::StrAppend(&plan.statement, "; changed from step ", plan.step + 1, ": ",
                    absl::StrJoin(others, ", "));
  }
  if (!data_order.empty()) {
    absl::StrAppend(&plan.statement, "; the data order changed (", absl::StrJoin(data_order, ", "),
                    "): the run skips the first ", plan.step, " steps of the new order, so some "
                    "records may train twice and others not at all");
  }
  return plan;
}

}  // namespace qlora::coordinator
