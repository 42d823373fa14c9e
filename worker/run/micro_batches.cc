// MicroBatchSource over the data path's DataLoader (see micro_batches.h).
#include "worker/run/micro_batches.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/data/data_loader.h"
#include "worker/data/tokenizer.h"

namespace qlora::worker {
namespace {

at::Tensor ToTensor(const std::vector<int32_t>& values, int rows, int seq_len, const at::Device& device) {
  at::Tensor t = at::empty({rows, seq_len}, at::TensorOptions().dtype(at::kInt));
  std::memcpy(t.data_ptr<int32_t>(), values.data(), values.size() * sizeof(int32_t));
  return t.to(device, at::kLong);
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
    b.input_ids = ToTensor(mb->input_ids, mb->rows, mb->seq_len, device_);
    b.labels = ToTensor(mb->labels, mb->rows, mb->seq_len, device_);
    if (packing_) {
      b.forward.position_ids = ToTensor(mb->position_ids, mb->rows, mb->seq_len, device_);
      b.forward.block_diagonal = true;
    }
    // Each row's first label is -100 (the batcher's rule), so these are exactly the labels that
    // count after the causal shift.
    b.target_tokens = mb->num_label_tokens;
    b.input_tokens = mb->num_tokens;
    return std::optional<DeviceBatch>(std::move(b));
  }

  absl::StatusOr<int64_t> CountMicroBatches(int epoch) override {
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
  QLORA_ASSIGN_OR_RETURN(data::DataFormat format, data::ResolveFormat(cfg.data.format, shards.front().path));
  std::vector<std::string> inputs, outputs;
  for (const FeatureConfig& f : cfg.input_features) inputs.push_back(f.name);
  for (const FeatureConfig& f : cfg.output_features) outputs.push_back(f.name);
  data::LoaderOptions lo;
  lo.reader.format = format;
  lo.reader.skip_malformed = cfg.data.malformed_records == "skip";
  QLORA_ASSIGN_OR_RETURN(lo.example, data::ExampleBuilder::OptionsFor(format, inputs, outputs, cfg.data.prompt_template,
                                                                      cfg.data.max_sequence_length));
  lo.batch.rows = options.batch_size > 0 ? options.batch_size : cfg.trainer.batch_size;
  lo.batch.seq_len = cfg.data.max_sequence_length;
  lo.batch.packing = cfg.data.packing;
  const data::SpecialTokens& special = tokenizer->special();
  lo.batch.pad_id = special.pad_id >= 0 ? special.pad_id : (special.eos_id >= 0 ? special.eos_id : 0);
  lo.seed = cfg.trainer.seed;
  lo.rank = options.rank;
  lo.shuffle = options.shuffle;
  lo.split = options.split == MicroBatchOptions::Split::kTrain        ? data::SplitRole::kTrain
             : options.split == MicroBatchOptions::Split::kValidation ? data::SplitRole::kValidation
                                                                      : data::SplitRole::kAll;
  lo.validation_fraction = cfg.data.validation_fraction;
  QLORA_ASSIGN_OR_RETURN(std::unique_ptr<data::DataLoader> loader, data::DataLoader::Create(shards, tokenizer.get(), lo));
  return std::unique_ptr<MicroBatchSource>(
      new LoaderSource(std::move(tokenizer), std::move(loader), cfg.data.packing, options.device));
}

}  // namespace qlora::worker
