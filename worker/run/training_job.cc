// RunTrainingJob: the worker binary's entry into training (see training_job.h). The phases are
// the Trainer's (trainer.h); this is the boundary where LibTorch's exceptions become statuses.
#include "worker/run/training_job.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/run/trainer.h"

namespace qlora::worker {

absl::StatusOr<TrainingOutcome> RunTrainingJob(const TrainingContext& context) {
  try {
    QLORA_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::Create(context));
    return trainer->Run();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("torch: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("error: ", e.what()));
  }
}

}  // namespace qlora::worker
