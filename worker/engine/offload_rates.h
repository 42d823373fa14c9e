// Measures what offload_activation_layers: auto plans with (activation_offload_plan.h) on this worker's
// GPU: the pinned host link in both directions and a warm bf16 GEMM of the model's MLP shape.
// About a quarter of a second, once per run. Torch side; the CUDA build only.
#pragma once

#include <cstdint>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "absl/status/statusor.h"
#include "common/model/llama_config.h"
#include "worker/memory/activation_offload_plan.h"

namespace qlora::engine {

struct OffloadRateOptions {
  c10::Device device = c10::Device(c10::kCPU);
  LlamaConfig model;
  int64_t tokens = 0;                       // a micro-batch's: the GEMM's rows (at most 8192)
  c10::ScalarType dtype = c10::kBFloat16;   // the compute dtype
  int64_t host_bytes = 0;                   // passed through: what the host may pin
  int64_t link_bytes = int64_t{256} << 20;  // each timed copy
  double gemm_seconds = 0.2;                // GEMMs run this long, the second half timed
};

// FailedPrecondition on a CPU device or a build without CUDA.
absl::StatusOr<memory::OffloadRates> MeasureOffloadRates(const OffloadRateOptions& options);

}  // namespace qlora::engine
