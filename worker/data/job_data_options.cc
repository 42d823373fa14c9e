// JobConfig -> LoaderOptions (see job_data_options.h).
#include "worker/data/job_data_options.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace qlora::data {

const std::string& DatasetPathForRole(const JobConfig& job, DatasetRole role) {
  if (role == DatasetRole::kValidation && !job.data.validation_path.empty())
    return job.data.validation_path;
  return job.data.train_path;
}

absl::StatusOr<LoaderOptions> LoaderOptionsForJob(const JobConfig& job, const Tokenizer& tokenizer,
                                                  DatasetRole role, int rank) {
  const DataConfig& data = job.data;
  const std::string& path = DatasetPathForRole(job, role);
  LoaderOptions options;
  QLORA_ASSIGN_OR_RETURN(options.reader.format, ResolveFormat(data.format, path));
  options.reader.skip_malformed = data.malformed_records == MalformedRecords::kSkip;
  options.reader.max_record_bytes = MaxRecordBytesForRows(data.max_sequence_length);
  std::vector<std::string> inputs, outputs;
  for (const FeatureConfig& feature : job.input_features) inputs.push_back(feature.name);
  for (const FeatureConfig& feature : job.output_features) outputs.push_back(feature.name);
  if (IsPreferenceJob(job)) {
    QLORA_ASSIGN_OR_RETURN(options.example, PreferenceLayout(options.reader.format, inputs, outputs,
                                                             data.max_sequence_length));
  } else {
    QLORA_ASSIGN_OR_RETURN(options.example,
                           ExampleBuilder::OptionsFor(options.reader.format, inputs, outputs,
                                                      data.prompt_template,
                                                      data.max_sequence_length));
  }
  const SpecialTokens& special = tokenizer.special();
  options.batch.rows = role == DatasetRole::kTrain ? job.trainer.batch_size : job.trainer.eval_batch_size;
  options.batch.seq_len = data.max_sequence_length;
  options.batch.packing = data.packing;
  options.batch.pairs = IsPreferenceJob(job);
  // Padding is never a target (labels are -100 there), so any valid id does: the pad token,
  // else EOS, else 0.
  options.batch.pad_id = special.pad_id >= 0 ? special.pad_id : special.eos_id >= 0 ? special.eos_id : 0;
  options.seed = job.trainer.seed;
  options.rank = rank;
  options.shuffle = role == DatasetRole::kTrain;
  const bool split_train = data.validation_path.empty() && data.validation_fraction > 0;
  options.validation_fraction = split_train ? data.validation_fraction : 0.0;
  // The test share is held out of the training file only (never of a validation file).
  const bool reads_train_file = role == DatasetRole::kTrain || split_train;
  options.test_fraction = reads_train_file ? data.test_fraction : 0.0;
  options.split = !split_train ? SplitRole::kAll
                  : role == DatasetRole::kTrain ? SplitRole::kTrain
                                                : SplitRole::kValidation;
  if (role == DatasetRole::kValidation && !split_train && data.validation_path.empty())
    return absl::FailedPreconditionError(
        "no validation data: set data.validation_path or data.validation_fraction");
  return options;
}

}  // namespace qlora::data
