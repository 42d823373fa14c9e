// One rank's whole training run, as the worker binary calls it: data -> engine -> strategy ->
// adapter. Torch-free interface (the implementation is the engine side), so the gRPC side of
// the worker never sees torch headers.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/config/job_config.h"
#include "common/worker_protocol.h"
#include "worker/comm/rendezvous_store.h"

namespace qlora::worker {

class TrainingObserver;  // training_observer.h (torch side)

struct TrainingContext {
  JobConfig config;
  WorkerAssignment assignment;
  comm::RendezvousStore* store = nullptr;                   // scoped to this job generation
  std::function<bool()> should_stop = [] { return false; };  // cancelled or told to stop
  std::function<void(const ProgressSnapshot&)> report_progress = [](const ProgressSnapshot&) {};
  TrainingObserver* observer = nullptr;                     // optional; tests watch the run here
  // Where Gloo listens for the other ranks: this host's address as the others reach it
  // ($QLORA_HOST_ADDRESS, set on a Ray cluster), or a network interface ($GLOO_SOCKET_IFNAME).
  std::string gloo_hostname = "127.0.0.1";
  std::string gloo_iface;
};

struct TrainingOutcome {
  std::string adapter_path;     // rank 0: the PEFT adapter folder
  std::string merged_path;      // rank 0: the merged HF model folder, when a merge was asked
  std::optional<TrainSummary> summary;  // rank 0
};

absl::StatusOr<TrainingOutcome> RunTrainingJob(const TrainingContext& context);

}  // namespace qlora::worker
