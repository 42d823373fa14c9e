// Writes a checkpoint as transformers' save_pretrained does: one model.safetensors when it fits
// under the shard limit, else model-00001-of-0000N.safetensors shards (greedy, in the given
// order, as huggingface_hub's split_torch_state_dict_into_shards fills them) plus
// model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map"}). Torch-free; each
// tensor's bytes come from the caller's producer, one tensor at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/safetensors/writer.h"

namespace qlora::safetensors {

// transformers' default max_shard_size="5GB" (decimal gigabytes, as huggingface_hub parses it).
inline constexpr uint64_t kDefaultMaxShardBytes = 5'000'000'000;

struct ShardOptions {
  uint64_t max_shard_bytes = kDefaultMaxShardBytes;
  // Shards and an index even when everything fits in one shard (test fixtures want the index).
  bool always_index = false;
};

uint64_t TensorByteSize(const TensorSpec& spec);

// Writes into `dir` (which must exist). A tensor larger than the limit gets a shard of its own.
absl::Status WriteShardedSafetensors(const std::string& dir, const std::vector<TensorSpec>& specs,
                                     const TensorProducer& produce, const ShardOptions& options = {});

}  // namespace qlora::safetensors
