// A dataset named by its folder, as Hugging Face `datasets` leaves one: the Arrow IPC files of
// a Dataset saved with save_to_disk (state.json lists them), of one split of a DatasetDict saved
// so (dataset_dict.json; `dataset` reads its `train` split, `validation_dataset` its
// `validation` split, which the parser also takes when only `dataset` names the folder and no
// validation share is set), or of a cache folder of `datasets` (<name>-<split>[-NNNNN-of-NNNNN].arrow:
// the role's split; any .arrow files when no name has a split). The files come back as the
// comma-separated list a job's dataset key takes, in their order (sorted for a cache folder).
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace qlora {

enum class DatasetRoleSplit { kTrain, kValidation };

// The Arrow files of `folder` (absolute) for `role`. INVALID_ARGUMENT naming the folder and what
// it lacks when it is none of the above, or when its state.json is unreadable or names a file
// outside it; NOT_FOUND when a DatasetDict lacks the role's split.
absl::StatusOr<std::string> HfDatasetFolderFiles(const std::string& folder, DatasetRoleSplit role);

}  // namespace qlora
