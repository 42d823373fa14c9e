// The training loop's view of the data: this rank's shards as device tensors, one micro-batch
// at a time, in a deterministic per-epoch order. Built on the data path (worker/data: readers,
// tokenizer, example builder, batcher), which is torch-free; this is where ids become tensors.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "common/config/job_config.h"
#include "common/dataset/record.h"
#include "worker/data/data_loader.h"
#include "worker/data/job_data_options.h"
#include "worker/engine/llama_model.h"

namespace qlora::worker {

struct DeviceBatch {
  at::Tensor input_ids;              // [rows, seq] int64
  at::Tensor labels;                 // [rows, seq] int64, -100 = no loss
  engine::ForwardOptions forward;    // position ids (on the host) and block-diagonal attention
                                     // when packed
  int64_t target_tokens = 0;         // labels that count after the causal shift
  int64_t input_tokens = 0;          // non-padding tokens
  int64_t examples = 0;              // examples (records) in it
  // Preference pairs: rows = 2 x pairs, the chosen sequences first (batcher.h); 0 otherwise.
  int64_t pairs = 0;
  // Preference pairs only, on the host (the objective picks the positions to score there, which
  // spares a device synchronization): [rows] tokens before each row's padding, and copies of
  // input_ids and labels.
  at::Tensor lengths, host_input_ids, host_labels;
};

struct MicroBatchOptions {
  const JobConfig* config = nullptr;
  std::string model_dir;             // where the tokenizer is
  at::Device device = at::kCPU;
  int rank = 0;
  // Training data (shuffled, trainer.batch_size rows) or validation data (in order,
  // eval_batch_size rows; the validation file, or the validation fraction of the train shards).
  data::DatasetRole role = data::DatasetRole::kTrain;
};

class MicroBatchSource {
 public:
  static absl::StatusOr<std::unique_ptr<MicroBatchSource>> Open(const std::vector<data::ShardSpec>& shards,
                                                                const MicroBatchOptions& options);
  virtual ~MicroBatchSource() = default;
  // Starts epoch `epoch` (its own shuffle).
  virtual absl::Status Restart(int epoch) = 0;
  // The next micro-batch of the epoch; nullopt at its end.
  virtual absl::StatusOr<std::optional<DeviceBatch>> Next() = 0;
  // Micro-batches and records in epoch `epoch` (a streaming pass that keeps nothing); rewinds,
  // so call Restart(epoch) afterwards.
  virtual absl::StatusOr<data::EpochCount> CountMicroBatches(int epoch) = 0;
};

}  // namespace qlora::worker
