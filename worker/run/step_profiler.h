// An opt-in profile of a few training steps, for benchmarks: LibTorch's Kineto profiler (CPU
// ops with their input shapes, CUDA kernels, copies and memsets) written as a Chrome trace that
// bench/attribute_profile.py reads. Set from the environment of the worker (which inherits the
// coordinator's), so that a job of the real service can be profiled without a config change:
//
//   QLORA_PROFILE_STEPS=FIRST:COUNT   the 0-based optimizer step to start at, and how many
//   QLORA_PROFILE_OUT=PATH            the trace to write; "{rank}" in PATH becomes the rank,
//                                     without it only rank 0 profiles
//   QLORA_PROFILE_MEMORY=1            also every allocation and free of the caching allocator
//                                     ([memory] events: bench/memory_peak.py finds the peak)
//
// The profiler starts before micro-batch 0 of step FIRST and stops before micro-batch 0 of step
// FIRST + COUNT (or when Stop() is called, at the latest when the run ends), so the trace holds
// whole steps, their progress reports included; at both ends it first waits for the device's
// queue to drain (the trainer queues a step while the GPU still runs the one before: trainer.h),
// so that the GPU's work in the trace is those steps' (the start shows the host's lead taken
// away: a short idle before the first step's first kernels). Kineto is prepared one step
// earlier, so that its set-up is not in the trace. The trainer names its phases (qlora::step,
// qlora::forward, qlora::loss, qlora::backward, qlora::grads, qlora::optimizer) for the
// attribution. Torch side.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/run/training_observer.h"

namespace qlora::worker {

class StepProfiler final : public TrainingObserver {
 public:
  // Null when the environment asks for no profile (or for one of another rank only); an error
  // when QLORA_PROFILE_STEPS or QLORA_PROFILE_OUT is malformed or missing its partner.
  static absl::StatusOr<std::unique_ptr<StepProfiler>> FromEnvironment(int rank);

  StepProfiler(int rank, int64_t first_step, int64_t steps, std::string path,
               bool memory = false);
  ~StepProfiler() override;  // stops and writes the trace if it is still running

  void OnMicroBatch(int64_t step, int index, const DeviceBatch& batch) override;

  // Stops the profiler if it runs and writes the trace (once); OK when nothing was profiled.
  absl::Status Stop();

  const std::string& path() const { return path_; }

 private:
  void Prepare();
  void Start();

  const int rank_;
  const int64_t first_step_;
  const int64_t steps_;
  const std::string path_;
  const bool memory_;
  bool prepared_ = false;
  bool running_ = false;
  bool written_ = false;
  int64_t started_step_ = 0;
  double started_at_ = 0;
};

}  // namespace qlora::worker
