// The worker slots a generation session runs on (generation_sessions.h), leased from whoever
// schedules the slots (JobManager), and how to launch a worker there. No gRPC in it.
#pragma once

#include "absl/status/statusor.h"
#include "coordinator/launch/worker_launch.h"
#include "coordinator/launch/worker_launcher.h"

namespace qlora::coordinator {

// Where sessions' workers come from: the JobManager (or a test) leases its free slots and says how
// to launch on them.
class GenerationSlots {
 public:
  virtual ~GenerationSlots() = default;
  // A free slot, held until Return: RESOURCE_EXHAUSTED when every slot is busy.
  virtual absl::StatusOr<int> Lease() = 0;
  virtual void Return(int slot) = 0;
  // The worker binary, coordinator address, environment and confinement of a launch; the
  // caller fills in the rest.
  virtual WorkerLaunchRequest LaunchBasics() const = 0;
  virtual WorkerLauncher* launcher() = 0;
};

}  // namespace qlora::coordinator
