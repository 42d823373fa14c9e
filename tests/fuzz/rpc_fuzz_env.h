// The world the RPC fuzz target calls into, fresh for every input: a real JobManager on a real
// SQLite JobStore in a new temporary state folder, a launcher that records each launch (and its
// startup token) but never spawns anything, and the gRPC services over them, called directly.
// The manager's clock stands still at kFuzzClock, so an input replays the same way, and a job's
// rendezvous generation (its start time in microseconds) is kFuzzGeneration.
//
// MakeServices and MakeServerContext are the one place that builds the services and the
// per-call contexts: when the handlers start authenticating their callers, adapt them there
// (grpcpp/test/server_context_test_spouse.h can add client metadata to a ServerContext). With
// authentication off, the default, every caller is allowed.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/server_context.h>

#include "absl/synchronization/mutex.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/rpc/job_service.h"
#include "coordinator/store/job_store.h"
#include "coordinator/launch/process_launcher.h"
#include "coordinator/rpc/worker_service.h"
#include "tests/util/temp_dir.h"

namespace qlora::fuzz {

inline constexpr int64_t kFuzzClockUnixSeconds = 1700000000;
inline constexpr int64_t kFuzzGeneration = kFuzzClockUnixSeconds * 1000000;

// Records launches; a launched "worker" runs until it is sent SIGKILL.
class RecordingLauncher : public coordinator::ProcessLauncher {
 public:
  absl::StatusOr<pid_t> Launch(const coordinator::LaunchSpec& spec) override;
  std::optional<coordinator::ExitInfo> Poll(pid_t pid) override;
  void Signal(pid_t pid, int signal) override;
  // The startup token of the `index`-th launch, "" when there was none.
  std::string TokenOf(size_t index) const;

 private:
  mutable absl::Mutex mu_;
  pid_t next_pid_ ABSL_GUARDED_BY(mu_) = 1000;
  std::vector<std::string> tokens_ ABSL_GUARDED_BY(mu_);
  std::map<pid_t, bool> killed_ ABSL_GUARDED_BY(mu_);  // pid -> reaped
};

struct Services {
  std::unique_ptr<coordinator::Authenticator> auth;  // off: every caller is the local admin
  std::unique_ptr<coordinator::JobServiceImpl> jobs;
  std::unique_ptr<coordinator::WorkerServiceImpl> workers;
};
Services MakeServices(coordinator::JobManager* manager);
// A context for one direct call of a handler.
std::unique_ptr<grpc::ServerContext> MakeServerContext();

class RpcFuzzEnv {
 public:
  // Aborts when the environment cannot be built: that is a broken harness, not a finding.
  RpcFuzzEnv();

  // The folder holding model/ (a base model: config.json), train.jsonl, train.csv, train.txt;
  // relative paths of a submission resolve here unless it names its own base_dir.
  const std::string& root() const { return dir_.path(); }
  coordinator::JobManager& manager() { return *manager_; }
  Services& services() { return services_; }
  const RecordingLauncher& launcher() const { return launcher_; }

 private:
  testing::TempDir dir_;
  RecordingLauncher launcher_;
  std::unique_ptr<coordinator::JobStore> store_;
  std::unique_ptr<coordinator::JobManager> manager_;  // stops its workers before the store goes
  Services services_;
};

}  // namespace qlora::fuzz
