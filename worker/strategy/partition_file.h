// One rank's checkpoint partition as a safetensors file of 1-D float32 tensors ("master",
// "exp_avg", "exp_avg_sq") with string metadata, readable by Python's safetensors. The reader
// reads slices without loading the whole file (re-partitioning reads parts of several files).
// Torch-free.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace qlora::strategy {

struct NamedFloats {
  std::string name;
  const float* data;
  int64_t numel;
};

// Creates `dir` and its parents (POSIX mkdir: std::filesystem is unusable in processes that load
// libtorch.so, which exports an incompatible copy of it).
absl::Status MakeDirectories(const std::string& dir);

// Writes atomically (temporary file, then rename).
absl::Status WritePartitionFile(const std::string& path,
                                const std::map<std::string, std::string>& metadata,
                                const std::vector<NamedFloats>& tensors);

class PartitionFileReader {
 public:
  static absl::StatusOr<PartitionFileReader> Open(const std::string& path);

  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Elements of tensor `name`; NOT_FOUND when absent.
  absl::StatusOr<int64_t> Numel(const std::string& name) const;
  // Reads `count` elements of `name` starting at element `offset` into `out`.
  absl::Status Read(const std::string& name, int64_t offset, int64_t count, float* out);

 private:
  struct Entry {
    int64_t begin = 0;  // byte offset in the file
    int64_t numel = 0;
  };
  std::string path_;
  std::ifstream in_;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, Entry> entries_;
};

}  // namespace qlora::strategy
