// Writes .safetensors files the way the reference writer does: `__metadata__` first (default
// {"format": "pt"}, which transformers requires), tensors ordered by dtype alignment (largest
// first) then name, the header padded with spaces to a multiple of 8 bytes, and no holes.
// The file is written to `path`.tmp and renamed, so readers never see a partial file.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/safetensors/dtype.h"

namespace qlora::safetensors {

struct TensorSpec {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;
};

// A tensor whose bytes are already in memory (little-endian, row-major).
struct TensorBytes {
  TensorSpec spec;
  const void* data = nullptr;
  size_t nbytes = 0;
};

using Metadata = std::map<std::string, std::string>;
inline Metadata DefaultMetadata() { return {{"format", "pt"}}; }

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorBytes>& tensors,
                              const Metadata& metadata = DefaultMetadata());

// Streaming form: the header is written from `specs`, then `produce` is called once per tensor,
// in file order, to fill `bytes` (it must produce exactly numel x bits / 8 bytes). Only one
// tensor's bytes are held at a time.
using TensorProducer = std::function<absl::Status(const TensorSpec& spec, std::string* bytes)>;
absl::Status WriteSafetensors(const std::string& path, std::vector<TensorSpec> specs,
                              const TensorProducer& produce,
                              const Metadata& metadata = DefaultMetadata());

}  // namespace qlora::safetensors
