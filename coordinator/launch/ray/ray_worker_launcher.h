// The WorkerLauncher for a Ray cluster. Each start of a job is one Ray job, submitted through the
// Job Submission REST API (ray_job_api.h) with the entrypoint `PYTHON LAUNCHER_SCRIPT`
// (deploy/ray/qlora_ray_launcher.py, present at the same path on the cluster's hosts, as
// qlora-worker is). That driver reserves a placement group of one bundle per rank ({CPU: n} or
// {CPU: n, GPU: 1}; PACK, SPREAD, STRICT_PACK or STRICT_SPREAD), runs qlora-worker for each
// rank in its bundle with the argv and environment a local worker gets, forwards each rank's
// output and reports each rank's end in its log (driver_log.h).
//
// Guarantees: Launch never blocks (no HTTP under the caller's lock): a thread of this launcher
// submits, polls the job's status and log every poll_interval, writes each rank's output to the
// rank's log file on this host (what `qloractl logs -f --rank N` reads), and stops jobs. A rank
// ends when the driver reports its exit, or when the Ray job ends without saying (its status and
// message are the cause), or when the cluster stops answering for `unreachable_timeout`.
// Terminate and Kill stop the Ray job (Ray sends the driver SIGTERM; the driver passes it on to
// every rank and, after the grace, kills them; a rank's process also dies with its Ray worker).
// Before submitting, jobs of the same job uid left RUNNING by an earlier coordinator are stopped.
// The startup tokens travel in the Ray job's runtime_env: anyone who can reach the dashboard can
// read them, and can run code on the cluster anyway: keep the dashboard port private.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/http/http_client.h"
#include "coordinator/launch/ray/ray_job_api.h"
#include "coordinator/launch/worker_launcher.h"

namespace qlora::coordinator {

struct RayLauncherOptions {
  std::string address;                                  // http://HEAD:8265
  std::string python = "python3";                       // the cluster's Python, which has ray
  std::string launcher_script;                          // qlora_ray_launcher.py on the cluster
  absl::Duration poll_interval = absl::Seconds(1);
  absl::Duration placement_timeout = absl::Seconds(300);  // the driver's wait for its bundles
  absl::Duration stop_grace = absl::Seconds(3);         // SIGTERM to a rank, then SIGKILL
  absl::Duration unreachable_timeout = absl::Seconds(60);
  // Often enough that a restart after a lost node sees the cluster without it (elastic jobs).
  absl::Duration capacity_refresh = absl::Seconds(2);
};

class RayWorkerLauncher : public WorkerLauncher {
 public:
  // Starts the launcher's thread, which learns the cluster's capacity first.
  explicit RayWorkerLauncher(RayLauncherOptions options);
  // Sends the stops still pending (for at most a few seconds) and joins the thread.
  ~RayWorkerLauncher() override;

  absl::StatusOr<std::unique_ptr<LaunchedGroup>> Launch(const GroupLaunch& launch) override;
  std::string Describe() const override;
  LauncherCapacity Capacity() const override;

  struct Start;  // one submitted (or to be submitted) Ray job; ray_worker_launcher.cc

 private:
  void Loop();
  // One pass over `start`: submit, stop, read status and log. HTTP; called without mu_.
  void Advance(Start& start);
  void RefreshCapacity();

  const RayLauncherOptions options_;
  const HttpClient http_;
  const RayJobApi api_;

  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<Start>> starts_ ABSL_GUARDED_BY(mu_);
  LauncherCapacity capacity_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace qlora::coordinator
