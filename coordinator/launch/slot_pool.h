// The coordinator's worker slots: its GPU ids (one worker per GPU) or its CPU slot numbers, and
// which of them a live worker process holds. A slot is taken when a worker is launched on it and
// given back only when that process has been reaped, so a job whose workers are still exiting
// keeps its slots.
//
// Not thread-safe: JobManager keeps it under its lock.
#pragma once

#include <set>
#include <vector>

namespace qlora::coordinator {

class SlotPool {
 public:
  // `gpus` non-empty: one slot per GPU id; otherwise `cpu_workers` slots numbered 0..n-1.
  SlotPool(const std::vector<int>& gpus, int cpu_workers);

  int total() const { return static_cast<int>(all_.size()); }
  bool gpu() const { return gpu_; }
  // The slots no live worker holds, in configuration order.
  std::vector<int> Free() const;
  void Take(int slot) { busy_.insert(slot); }
  void Release(int slot) { busy_.erase(slot); }

 private:
  std::vector<int> all_;
  bool gpu_ = false;
  std::set<int> busy_;
};

}  // namespace qlora::coordinator
