// Single file or shards + index, as transformers writes a checkpoint (see sharded_writer.h).
#include "common/safetensors/sharded_writer.h"

#include "absl/strings/str_format.h"
#include "common/posix_files.h"
#include "common/safetensors/checkpoint_files.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace qlora::safetensors {

uint64_t TensorByteSize(const TensorSpec& spec) {
  uint64_t n = DtypeBits(spec.dtype) / 8;
  for (int64_t d : spec.shape) n *= static_cast<uint64_t>(d);
  return n;
}

absl::Status WriteShardedSafetensors(const std::string& dir, const std::vector<TensorSpec>& specs,
                                     const TensorProducer& produce, const ShardOptions& options) {
  std::vector<std::vector<TensorSpec>> shards(1);
  uint64_t shard_bytes = 0, total = 0;
  for (const TensorSpec& spec : specs) {
    const uint64_t size = TensorByteSize(spec);
    if (!shards.back().empty() && shard_bytes + size > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(spec);
    shard_bytes += size;
    total += size;
  }
  if (shards.size() == 1 && !options.always_index) {
    return WriteSafetensors(JoinPath(dir, kSingleFileName), shards[0], produce);
  }
  nlohmann::json index = {{"metadata", {{"total_size", total}}},
                          {"weight_map", nlohmann::json::object()}};
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string file = absl::StrFormat("model-%05d-of-%05d.safetensors", k + 1, shards.size());
    for (const TensorSpec& spec : shards[k]) index["weight_map"][spec.name] = file;
    QLORA_RETURN_IF_ERROR(WriteSafetensors(JoinPath(dir, file), shards[k], produce));
  }
  return WriteFileAtomically(JoinPath(dir, kIndexFileName), index.dump(2));
}

}  // namespace qlora::safetensors
