// Test harness for the service: starts the real qlora-coordinator binary on 127.0.0.1 port 0
// with a temporary state folder, talks to it with a real gRPC client and the real qloractl,
// and finds a job's worker processes by scanning /proc.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "qlora/v1/job_service.grpc.pb.h"
#include "tests/util/job_yaml.h"

namespace qlora::testing {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs a shell command and captures its output.
CommandResult RunCommand(const std::string& command);

std::string BinaryDir();    // the build folder (QLORA_BINARY_DIR)
std::string SourceDir();    // the source folder (QLORA_SOURCE_DIR)
std::string MakeTempDir(const std::string& prefix);

// A tiny HF model folder (random weights, the example tokenizer) made once per test binary.
std::string TinyModelDir();
// The original Ludwig job file (tests/assets/jobs/good/ludwig_original.yaml) with base_model
// pointing at the tiny model; its `backend.type: ray` becomes `local` unless `on_ray`.
std::string OriginalJobYaml(bool on_ray = false);
// The same without its `trainer:` line, and `extra` YAML (a trainer section) appended.
std::string TinyJobYaml(const std::string& extra = "");
// The same with the trainer and data sections that `training` describes (tests/util/job_yaml.h).
inline std::string TinyJobYaml(const TestTraining& training) {
  return TinyJobYaml(TrainingYaml(training));
}
// The tiny job with a few optimizer steps: quick on a CPU.
inline std::string ShortJob() { return TinyJobYaml(ShortTraining()); }
// The tiny job running long enough to be cancelled, killed or looked at while it trains.
inline std::string LongJob() { return TinyJobYaml(LongTraining()); }

class CoordinatorProcess {
 public:
  // Starts the coordinator with `cpu_workers` slots on state folder `state_dir`.
  CoordinatorProcess(const std::string& state_dir, int cpu_workers, const std::string& extra_flags = "");
  ~CoordinatorProcess();

  bool started() const { return port_ > 0; }
  std::string address() const;
  pid_t pid() const { return pid_; }
  v1::JobService::Stub* jobs() { return stub_.get(); }
  std::shared_ptr<grpc::Channel> channel() { return channel_; }
  // Sends `signal` and waits for the process to end; returns its wait status.
  int Stop(int signal);
  // Runs qloractl against this coordinator.
  CommandResult Ctl(const std::string& args) const;

  v1::Job GetJob(const std::string& id);
  // Polls until the job is in one of `states` or `seconds` pass; returns the last state seen.
  v1::Job WaitForState(const std::string& id, const std::vector<v1::JobState>& states, double seconds);

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> stub_;
};

// The example training data (examples/data/train.jsonl).
std::string TrainData();

// Submits `yaml` over gRPC with `dataset` (default: TrainData()); the new job, and the call's
// status in *status when given.
v1::Job SubmitJob(CoordinatorProcess& c, const std::string& yaml, grpc::Status* status = nullptr,
                  const std::string& dataset = "");

// Every stored event of `job_id` in the coordinator's SQLite store under `state_dir`, one line
// each: "REASON: message @step loss" (step and loss empty for state changes).
std::string StoredEvents(const std::string& state_dir, const std::string& job_id);

// Polls `done` every 100 ms until it holds or `seconds` pass; its last answer.
bool WaitUntil(const std::function<bool()>& done, double seconds);

// Whether a complete checkpoint of `step` (its manifest) is under `output_dir`/checkpoints, for
// any job.
bool CheckpointWritten(const std::string& output_dir, int step);

// PIDs of live qlora-worker processes that the coordinator at `coordinator_address` started
// for `job_id` (every coordinator numbers its jobs from job-000001, and tests run in parallel).
std::vector<pid_t> WorkerPids(const std::string& coordinator_address, const std::string& job_id);

}  // namespace qlora::testing
