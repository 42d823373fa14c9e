// The safetensors files of a Hugging Face model folder: either `model.safetensors` or the shards
// named by `model.safetensors.index.json` ({"metadata": {...}, "weight_map": {name: shard}}).
// Shards are opened (memory-mapped) on first use and stay mapped.
//
// Thread-safety: not thread-safe (Get opens shards lazily).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/safetensors/reader.h"

namespace qlora::safetensors {

inline constexpr char kSingleFileName[] = "model.safetensors";
inline constexpr char kIndexFileName[] = "model.safetensors.index.json";

class CheckpointFiles {
 public:
  // Opens `dir`/model.safetensors.index.json if present, else `dir`/model.safetensors.
  // NotFound when neither exists; InvalidArgument for a malformed index or a shard whose tensors
  // disagree with the index.
  static absl::StatusOr<CheckpointFiles> Open(const std::string& dir);
  // A single file given by path (adapters, tests).
  static absl::StatusOr<CheckpointFiles> OpenFile(const std::string& path);

  // Every tensor name, sorted.
  std::vector<std::string> Names() const;
  bool Contains(const std::string& name) const { return shard_of_.count(name) > 0; }
  absl::StatusOr<TensorInfo> Info(const std::string& name);
  absl::StatusOr<TensorView> Get(const std::string& name);
  // See SafetensorsFile::Evict.
  void Evict(const std::string& name, const TensorView& view);

 private:
  absl::StatusOr<SafetensorsFile*> Shard(const std::string& name);

  std::string dir_;
  std::map<std::string, std::string> shard_of_;  // tensor name -> shard file name
  std::map<std::string, std::unique_ptr<SafetensorsFile>> open_;  // shard file name -> file
};

}  // namespace qlora::safetensors
