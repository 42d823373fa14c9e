// JobManager's worker-facing calls (WorkerService forwards here): each authenticates the caller
// by (job id, startup token), then acts on that worker's job. Split from job_manager.cc, which
// holds the client calls, the queue and the monitor; the class is declared in job_manager.h.
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/jobs/job_manager.h"

namespace qlora::coordinator {

absl::StatusOr<JobManager::WorkerCall> JobManager::FindForWorker(const std::string& job_id,
                                                                 const std::string& token) {
  QLORA_ASSIGN_OR_RETURN(Job * job, Find(job_id));
  WorkerProcess* worker = job->FindWorker(token);
  if (worker == nullptr) return absl::PermissionDeniedError("unknown startup token for this job");
  // A token serves its rank while that rank runs: once it has completed or its process has
  // ended, a call with it can only be a replay.
  if (worker->completed || worker->exited) {
    return absl::PermissionDeniedError(absl::StrCat(
        "rank ", worker->rank, " of this start has ", worker->completed ? "completed" : "ended",
        "; its startup token is spent"));
  }
  return WorkerCall{job, worker};  // a job with workers has its rendezvous (Job::Start)
}

absl::StatusOr<JobManager::RendezvousSeat> JobManager::SeatFor(const std::string& job_id,
                                                               const std::string& token) {
  absl::MutexLock lock(&mu_);
  QLORA_ASSIGN_OR_RETURN(WorkerCall call, FindForWorker(job_id, token));
  return RendezvousSeat{call.job->rendezvous(), call.worker->rank};
}

absl::Status JobManager::Register(const std::string& job_id, const std::string& token, int rank,
                                  int64_t pid, const std::string& host) {
  absl::MutexLock lock(&mu_);
  QLORA_ASSIGN_OR_RETURN(WorkerCall call, FindForWorker(job_id, token));
  return call.job->Register(*call.worker, rank, host, pid);
}

absl::StatusOr<WorkerAssignment> JobManager::GetAssignment(const std::string& job_id,
                                                           const std::string& token,
                                                           absl::Time deadline) {
  QLORA_ASSIGN_OR_RETURN(RendezvousSeat seat, SeatFor(job_id, token));
  // Waits without the manager's lock: the other ranks register meanwhile.
  QLORA_ASSIGN_OR_RETURN(std::string nccl_id, seat.rendezvous->AwaitPeers(seat.rank, deadline));
  absl::MutexLock lock(&mu_);
  QLORA_ASSIGN_OR_RETURN(WorkerCall call, FindForWorker(job_id, token));
  if (stop_ || call.job->rendezvous() != seat.rendezvous) {
    return absl::AbortedError(absl::StrCat("job ", job_id, " has ended"));
  }
  return call.job->Assignment(*call.worker, std::move(nccl_id));
}

absl::Status JobManager::PublishNcclId(const std::string& job_id, const std::string& token,
                                       const std::string& id) {
  absl::MutexLock lock(&mu_);
  QLORA_ASSIGN_OR_RETURN(WorkerCall call, FindForWorker(job_id, token));
  return call.job->rendezvous()->PublishNcclId(call.worker->rank, id);
}

absl::StatusOr<bool> JobManager::Heartbeat(const std::string& job_id, const std::string& token) {
  absl::MutexLock lock(&mu_);
  QLORA_ASSIGN_OR_RETURN(WorkerCall call, FindForWorker(job_id, token));
  return call.job->Heartbeat(*call.worker);
}

absl::Status JobManager::ReportProgress(const std::string& job_id, const std::string& token,
                                        const ProgressSnapshot& progress) {
  absl::MutexLock lock(&mu_);
  QLORA_ASSIGN_OR_RETURN(WorkerCall call, FindForWorker(job_id, token));
  call.job->ReportProgress(*call.worker, progress);
  return absl::OkStatus();
}

absl::Status JobManager::ReportCompletion(const std::string& job_id, const std::string& token,
                                          const WorkerCompletion& completion) {
  absl::MutexLock lock(&mu_);
  QLORA_ASSIGN_OR_RETURN(WorkerCall call, FindForWorker(job_id, token));
  return call.job->ReportCompletion(*call.worker, completion);
}

absl::Status JobManager::StoreSet(const std::string& job_id, const std::string& token,
                                  int64_t generation, const std::string& key,
                                  const std::string& value) {
  absl::MutexLock lock(&mu_);
  QLORA_ASSIGN_OR_RETURN(WorkerCall call, FindForWorker(job_id, token));
  return call.job->rendezvous()->Set(generation, key, value);
}

absl::StatusOr<std::string> JobManager::StoreGet(const std::string& job_id, const std::string& token,
                                                 int64_t generation, const std::string& key,
                                                 absl::Time deadline) {
  QLORA_ASSIGN_OR_RETURN(RendezvousSeat seat, SeatFor(job_id, token));
  return seat.rendezvous->Get(generation, key, deadline);  // waits without the manager's lock
}

}  // namespace qlora::coordinator
