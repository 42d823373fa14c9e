// RunTrainingJob: the worker binary's entry into training (see training_job.h). The phases are
// the Trainer's (trainer.h); this is the boundary where LibTorch's exceptions become statuses.
#include "worker/run/training_job.h"

#include <cstdio>
#include <new>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/run/step_profiler.h"
#include "worker/run/trainer.h"

namespace qlora::worker {

absl::StatusOr<TrainingOutcome> RunTrainingJob(const TrainingContext& context) {
  try {
    // An opt-in profile of a few steps for benchmarks (QLORA_PROFILE_STEPS, step_profiler.h).
    // Declared before the trainer, which holds references to both, so that both outlive it.
    std::unique_ptr<StepProfiler> profiler;
    TrainingContext run = context;
    if (run.observer == nullptr) {
      QLORA_ASSIGN_OR_RETURN(profiler, StepProfiler::FromEnvironment(context.assignment.rank));
      run.observer = profiler.get();
    }
    QLORA_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::Create(run));
    absl::StatusOr<TrainingOutcome> outcome = trainer->Run();
    if (profiler != nullptr) {
      const absl::Status stopped = profiler->Stop();
      if (!stopped.ok()) fprintf(stderr, "[rank %d] profiler: %s\n", context.assignment.rank, stopped.ToString().c_str());
    }
    return outcome;
  } catch (const c10::OutOfMemoryError& e) {  // a CUDA or host allocation that failed
    return absl::ResourceExhaustedError(absl::StrCat("out of memory: ", e.what_without_backtrace()));
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("torch: ", e.what_without_backtrace()));
  } catch (const std::bad_alloc& e) {
    return absl::ResourceExhaustedError(absl::StrCat("out of host memory: ", e.what()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("error: ", e.what()));
  }
}

}  // namespace qlora::worker
