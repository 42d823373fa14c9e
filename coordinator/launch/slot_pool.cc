// Worker slot accounting (see slot_pool.h).
#include "coordinator/launch/slot_pool.h"

namespace qlora::coordinator {

SlotPool::SlotPool(const std::vector<int>& gpus, int cpu_workers) : all_(gpus), gpu_(!gpus.empty()) {
  if (!gpu_) {
    for (int i = 0; i < cpu_workers; ++i) all_.push_back(i);
  }
}

std::vector<int> SlotPool::Free() const {
  std::vector<int> free;
  for (int s : all_) {
    if (busy_.count(s) == 0) free.push_back(s);
  }
  return free;
}

}  // namespace qlora::coordinator
