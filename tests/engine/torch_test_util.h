// Tensor helpers for the engine tests: write/read named tensors as safetensors files (the
// exchange format with the reference scripts) and compare.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "common/safetensors/checkpoint_files.h"
#include "common/safetensors/writer.h"
#include "worker/engine/tensor_io.h"

namespace qlora::testing {

inline absl::Status SaveTensors(const std::string& path,
                                const std::map<std::string, at::Tensor>& tensors) {
  std::vector<std::string> bytes;
  std::vector<safetensors::TensorBytes> entries;
  bytes.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    auto dtype = engine::ToSafetensorsDtype(t.scalar_type());
    if (!dtype.ok()) return dtype.status();
    bytes.push_back(engine::TensorToBytes(t));
    entries.push_back({{name, *dtype, t.sizes().vec()}, bytes.back().data(), bytes.back().size()});
  }
  return safetensors::WriteSafetensors(path, entries);
}

inline std::map<std::string, at::Tensor> LoadTensors(const std::string& path) {
  std::map<std::string, at::Tensor> out;
  auto files = safetensors::CheckpointFiles::OpenFile(path);
  if (!files.ok()) return out;
  for (const std::string& name : files->Names()) {
    out[name] = *engine::CopyToTensor(*files->Get(name));
  }
  return out;
}

inline double MaxAbsDiff(const at::Tensor& a, const at::Tensor& b) {
  return (a.detach().to(at::kCPU, at::kDouble) - b.detach().to(at::kCPU, at::kDouble))
      .abs().max().item<double>();
}

}  // namespace qlora::testing
