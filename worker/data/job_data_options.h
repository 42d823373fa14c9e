// From the resolved JobConfig to a rank's LoaderOptions: the one place where the job's data,
// features and trainer fields become data-path settings.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/config/job_config.h"
#include "worker/data/data_loader.h"
#include "worker/data/tokenizer.h"

namespace qlora::data {

enum class DatasetRole {
  kTrain,       // the training file (minus the validation fraction, if any), shuffled
  kValidation,  // the validation file, or the validation fraction of the training file
};

// Options for reading `role` on `rank`. The path decides the format when data.format is
// "auto". Micro-batch rows: trainer.batch_size for training, eval_batch_size for validation.
absl::StatusOr<LoaderOptions> LoaderOptionsForJob(const JobConfig& job, const Tokenizer& tokenizer,
                                                  DatasetRole role, int rank);

// The file `role` reads: data.train_path, or data.validation_path when there is one.
const std::string& DatasetPathForRole(const JobConfig& job, DatasetRole role);

}  // namespace qlora::data
