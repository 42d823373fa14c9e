// Conversions between safetensors views/bytes and at::Tensor.
#pragma once

#include <string>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "common/safetensors/reader.h"

namespace qlora::engine {

absl::StatusOr<at::ScalarType> ToScalarType(safetensors::Dtype dtype);
absl::StatusOr<safetensors::Dtype> ToSafetensorsDtype(at::ScalarType type);

// A CPU tensor that OWNS a copy of the view's bytes (safe after the file is closed or evicted).
absl::StatusOr<at::Tensor> CopyToTensor(const safetensors::TensorView& view);
// Like CopyToTensor, converted to `dtype` on `device` in one step (one host copy at most).
absl::StatusOr<at::Tensor> CopyToTensor(const safetensors::TensorView& view, at::ScalarType dtype,
                                        at::Device device);

// The row-major bytes of a tensor (any device), for the safetensors writer.
std::string TensorToBytes(const at::Tensor& tensor);

}  // namespace qlora::engine
