// The devices a kernel test runs on: the CPU, and the first GPU when there is one and this build
// has the CUDA kernels.
#pragma once

#include <vector>

#include <ATen/ATen.h>

#include "kernels/quantize_4bit.h"

namespace qlora::kernels {

inline std::vector<at::Device> KernelTestDevices() {
  std::vector<at::Device> devices = {at::kCPU};
  if (at::hasCUDA() && HasCudaKernels()) devices.emplace_back(at::kCUDA, 0);
  return devices;
}

}  // namespace qlora::kernels
