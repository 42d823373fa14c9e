// MicroBatchSource over the data path's DataLoader (see micro_batches.h).
#include "worker/run/micro_batches.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/data/tokenizer.h"

namespace qlora::worker {
namespace {

// [rows, seq_len] int64 on `device`. For a GPU the host copy is pinned and the transfer
// non-blocking: StepBatches reads a step ahead on a thread of its own, and a copy from pageable
// memory ends in a stream synchronization, which waits for every kernel the training thread has
// queued on the stream (profiles showed that thread blocked for most of a step, and the next
// step starting late, with the GPU idle meanwhile). The pinned block is not reused before the
// copy has run (the caching host allocator records the copy's stream).
at::Tensor HostTensor(const std::vector<int32_t>& values, int rows, int seq_len, bool pinned) {
  at::Tensor t = at::empty({rows, seq_len}, at::TensorOptions().dtype(at::kLong).pinned_memory(pinned));
  std::copy(values.begin(), values.end(), t.data_ptr<int64_t>());
  return t;
}

// `host` (HostTensor's, pinned for a GPU) on `device`.
at::Tensor OnDevice(const at::Tensor& host, const at::Device& device) {
  return host.to(device, /*non_blocking=*/device.is_cuda());
}

at::Tensor ToTensor(const std::vector<int32_t>& values, int rows, int seq_len, const at::Device& device) {
  return OnDevice(HostTensor(values, rows, seq_len, device.is_cuda()), device);
}

class LoaderSource : public MicroBatchSource {
 public:
  LoaderSource(std::unique_ptr<data::Tokenizer> tokenizer, std::unique_ptr<data::DataLoader> loader,
               bool packing, at::Device device)
      : tokenizer_(std::move(tokenizer)), loader_(std::move(loader)), packing_(packing), device_(device) {}

  absl::Status Restart(int epoch) override { return loader_->StartEpoch(epoch); }

  absl::StatusOr<std::optional<DeviceBatch>> Next() override {
    QLORA_ASSIGN_OR_RETURN(std::optional<data::MicroBatch> mb, loader_->Next());
    if (!mb) return std::optional<DeviceBatch>();
    DeviceBatch b;
    // The ids stay on the host as well (pinned; the copy's source): an input embedding table in
    // host memory gathers its rows there (engine::ForwardOptions::host_input_ids).
    b.forward.host_input_ids = HostTensor(mb->input_ids, mb->rows, mb->seq_len, device_.is_cuda());
    b.input_ids = OnDevice(b.forward.host_input_ids, device_);
    b.labels = ToTensor(mb->labels, mb->rows, mb->seq_len, device_);
    if (packing_) {
      // On the host: the model reads the documents' layout there (no device synchronization)
      // and copies the positions to the device itself.
      b.forward.position_ids = ToTensor(mb->position_ids, mb->rows, mb->seq_len, at::kCPU);
      b.forward.block_diagonal = true;
    }
    // Each row's first label is -100 (the batcher's rule), so these are exactly the labels that
    // count after the causal shift.
    b.target_tokens = mb->num_label_tokens;
    b.input_tokens = mb->num_tokens;
    b.examples = mb->num_examples;
    if (mb->pairs > 0) {
      b.pairs = mb->pairs;
      std::vector<int32_t> lengths;
      for (const std::vector<int32_t>& row : mb->sequence_lengths) lengths.push_back(row.empty() ? 0 : row[0]);
      b.lengths = ToTensor(lengths, 1, mb->rows, at::kCPU).view({-1});
      b.host_input_ids = ToTensor(mb->input_ids, mb->rows, mb->seq_len, at::kCPU);
      b.host_labels = ToTensor(mb->labels, mb->rows, mb->seq_len, at::kCPU);
    }
    return std::optional<DeviceBatch>(std::move(b));
  }

  absl::StatusOr<data::EpochCount> CountMicroBatches(int epoch) override {
    return data::CountMicroBatches(*loader_, epoch);
  }

 private:
  std::unique_ptr<data::Tokenizer> tokenizer_;  // the loader points into it
  std::unique_ptr<data::DataLoader> loader_;
  bool packing_;
  at::Device device_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MicroBatchSource>> MicroBatchSource::Open(const std::vector<data::ShardSpec>& shards,
                                                                        const MicroBatchOptions& options) {
  const JobConfig& cfg = *options.config;
  QLORA_ASSIGN_OR_RETURN(std::unique_ptr<data::Tokenizer> tokenizer, data::LoadTokenizer(options.model_dir));
  if (shards.empty()) return absl::FailedPreconditionError("this rank has no data shard (fewer records than ranks?)");
  QLORA_ASSIGN_OR_RETURN(data::LoaderOptions lo,
                         data::LoaderOptionsForJob(cfg, *tokenizer, options.role, options.rank));
  QLORA_ASSIGN_OR_RETURN(std::unique_ptr<data::DataLoader> loader, data::DataLoader::Create(shards, tokenizer.get(), lo));
  return std::unique_ptr<MicroBatchSource>(
      new LoaderSource(std::move(tokenizer), std::move(loader), cfg.data.packing, options.device));
}

}  // namespace qlora::worker
