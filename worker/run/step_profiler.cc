// The opt-in step profiler (see step_profiler.h).
#include "worker/run/step_profiler.h"

#include <ATen/Context.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace qlora::worker {
namespace {

namespace kineto = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

constexpr char kRankPlaceholder[] = "{rank}";

// Waits for the work queued so far on `device`'s current stream (nothing on a CPU).
void DrainQueue(const c10::Device& device) {
  if (device.is_cpu()) return;
  const c10::impl::VirtualGuardImpl guard(device.type());
  c10::Event queued(device.type());
  queued.record(guard.getStream(device));
  queued.synchronize();
}

double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU ops with their input shapes (the attribution tells LoRA GEMMs from base GEMMs by the
// rank in their shapes); no stacks; memory events only when asked: the trace of a 7B step stays
// small.
ProfilerConfig Config(bool memory) {
  return ProfilerConfig(ProfilerState::KINETO, /*report_input_shapes=*/true, /*profile_memory=*/memory,
                        /*with_stack=*/false, /*with_flops=*/false, /*with_modules=*/false);
}

std::set<ActivityType> Activities() {
  std::set<ActivityType> activities{ActivityType::CPU};
  if (at::globalContext().hasCUDA()) activities.insert(ActivityType::CUDA);
  return activities;
}

}  // namespace

absl::StatusOr<std::unique_ptr<StepProfiler>> StepProfiler::FromEnvironment(int rank) {
  const char* steps = std::getenv("QLORA_PROFILE_STEPS");
  const char* out = std::getenv("QLORA_PROFILE_OUT");
  const bool has_steps = steps != nullptr && *steps != '\0';
  const bool has_out = out != nullptr && *out != '\0';
  if (!has_steps && !has_out) return std::unique_ptr<StepProfiler>();
  if (has_steps != has_out) {
    return absl::InvalidArgumentError("QLORA_PROFILE_STEPS and QLORA_PROFILE_OUT go together");
  }
  const std::vector<std::string> parts = absl::StrSplit(steps, ':');
  int64_t first = 0, count = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &first) || !absl::SimpleAtoi(parts[1], &count) ||
      first < 0 || count < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("QLORA_PROFILE_STEPS must be FIRST:COUNT (0-based first step, count >= 1), not '", steps, "'"));
  }
  std::string path = out;
  if (path.find(kRankPlaceholder) != std::string::npos) {
    path = absl::StrReplaceAll(path, {{kRankPlaceholder, absl::StrCat(rank)}});
  } else if (rank != 0) {
    return std::unique_ptr<StepProfiler>();
  }
  const char* memory = std::getenv("QLORA_PROFILE_MEMORY");
  const bool with_memory = memory != nullptr && std::string(memory) == "1";
  return std::make_unique<StepProfiler>(rank, first, count, std::move(path), with_memory);
}

StepProfiler::StepProfiler(int rank, int64_t first_step, int64_t steps, std::string path,
                           bool memory)
    : rank_(rank), first_step_(first_step), steps_(steps), path_(std::move(path)), memory_(memory) {}

StepProfiler::~StepProfiler() {
  const absl::Status stopped = Stop();
  if (!stopped.ok()) fprintf(stderr, "[rank %d] profiler: %s\n", rank_, stopped.ToString().c_str());
}

void StepProfiler::Prepare() {
  if (prepared_) return;
  kineto::prepareProfiler(Config(memory_), Activities());
  prepared_ = true;
}

void StepProfiler::Start() {
  Prepare();
  kineto::enableProfiler(Config(memory_), Activities());
  running_ = true;
  started_at_ = SteadySeconds();
  fprintf(stderr, "[rank %d] profiler: on for steps %ld..%ld (0-based)\n", rank_,
          static_cast<long>(started_step_), static_cast<long>(first_step_ + steps_ - 1));
  fflush(stderr);
}

void StepProfiler::OnMicroBatch(int64_t step, int index, const DeviceBatch& batch) {
  if (index != 0 || written_) return;
  if (step == first_step_ - 1) Prepare();
  if (!running_ && step >= first_step_ && step < first_step_ + steps_) {
    started_step_ = step;
    DrainQueue(batch.input_ids.device());
    Start();
  } else if (running_ && step >= first_step_ + steps_) {
    DrainQueue(batch.input_ids.device());
    const absl::Status stopped = Stop();
    if (!stopped.ok()) fprintf(stderr, "[rank %d] profiler: %s\n", rank_, stopped.ToString().c_str());
  }
}

absl::Status StepProfiler::Stop() {
  if (!running_) return absl::OkStatus();
  running_ = false;
  written_ = true;
  const double profiled_s = SteadySeconds() - started_at_;
  try {
    std::unique_ptr<kineto::ProfilerResult> result = kineto::disableProfiler();
    const double t0 = SteadySeconds();
    result->save(path_);
    fprintf(stderr, "[rank %d] profiler: %.3f s profiled, trace written to %s in %.1f s\n", rank_, profiled_s,
            path_.c_str(), SteadySeconds() - t0);
    fflush(stderr);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("cannot write the trace ", path_, ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("cannot write the trace ", path_, ": ", e.what()));
  }
  return absl::OkStatus();
}

}  // namespace qlora::worker
