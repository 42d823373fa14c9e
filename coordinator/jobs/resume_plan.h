// How a job continues another (`qloractl submit --resume-from JOB`, SubmitJobRequest.resume_from):
// from JOB's newest complete checkpoint, with its adapters, optimizer state, step and data
// position. Only a CANCELLED or FAILED job can be continued (a running one is cancelled first; a
// succeeded one has nothing left, and its adapter can start a new job instead). The new job's
// resolved file is compared with JOB's, leaf by leaf:
//   - the base model, its quantization and the adapter's shape and scale (adapter.type, r,
//     alpha, target_modules, use_rslora) must be the same: the checkpoint's weights are for them;
//   - a change to what orders the data (the datasets, features, prompt, preprocessing, batch
//     sizes, seed, workers) is accepted, saying that the run skips the first steps of the *new*
//     order, so records may be seen twice or not at all;
//   - any other change (learning rate, epochs, evaluation, ...) is in effect from the next step.
// The statement says all of it; it goes in the job's first event.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/jobs/job_types.h"

namespace qlora::coordinator {

struct ResumePlan {
  std::string checkpoint;  // the source's newest complete checkpoint folder
  int64_t step = 0;        // the optimizer steps it holds
  std::string statement;   // "continues job-000003 from step 40 ...; changed: ..."
};

// FAILED_PRECONDITION when `source` is not CANCELLED or FAILED, has no complete checkpoint, or
// differs from `next_resolved_yaml` where the checkpoint cannot follow (naming the key and both
// values). Reads the file system (the source's checkpoints): call it without the manager's lock.
absl::StatusOr<ResumePlan> PlanResume(const JobRecord& source, const std::string& next_resolved_yaml);

}  // namespace qlora::coordinator
