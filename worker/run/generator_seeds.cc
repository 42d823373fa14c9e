// SeedGeneratorsForStep (see generator_seeds.h).
#include "worker/run/generator_seeds.h"

#include <ATen/Context.h>

#include <mutex>

namespace qlora::worker {

void SeedGeneratorsForStep(const at::Device& device, uint64_t job_seed, int rank, int64_t step) {
  const uint64_t seed =
      (job_seed * 1000003u + static_cast<uint64_t>(rank)) * 1000003u + static_cast<uint64_t>(step);
  {
    at::Generator cpu = at::globalContext().defaultGenerator(at::kCPU);
    std::lock_guard<std::mutex> lock(cpu.mutex());
    cpu.set_current_seed(seed);
  }
  if (device.is_cuda()) {
    at::Generator gpu = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(gpu.mutex());
    gpu.set_current_seed(seed);
  }
}

}  // namespace qlora::worker
