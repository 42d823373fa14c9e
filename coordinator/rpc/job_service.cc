// gRPC JobService (see job_service.h).
#include "coordinator/rpc/job_service.h"

#include <unistd.h>

#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/auth/caller_credentials.h"
#include "coordinator/rpc/proto_convert.h"

namespace qlora::coordinator {
namespace {

SubmitRequest FromProto(const v1::SubmitJobRequest& r) {
  SubmitRequest s;
  s.job_yaml = r.job_yaml();
  s.dataset = r.dataset();
  s.validation_dataset = r.validation_dataset();
  s.name = r.name();
  if (!r.source_name().empty()) s.source_name = r.source_name();
  s.base_dir = r.base_dir();
  return s;
}

// Reads what `path` holds past `*offset` (at most 1 MiB), advancing the offset.
std::string ReadFrom(const std::string& path, int64_t* offset) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  in.seekg(0, std::ios::end);
  const int64_t size = in.tellg();
  if (size <= *offset) return "";
  const int64_t n = std::min<int64_t>(size - *offset, 1 << 20);
  std::string data(n, '\0');
  in.seekg(*offset);
  in.read(data.data(), n);
  data.resize(in.gcount());
  *offset += static_cast<int64_t>(data.size());
  return data;
}

}  // namespace

// Returns the gRPC status of a failed absl::StatusOr / absl::Status expression.
#define QLORA_GRPC_ASSIGN_OR_RETURN(lhs, expr)          \
  auto QLORA_STATUS_CONCAT(grpc_or_, __LINE__) = (expr); \
  if (!QLORA_STATUS_CONCAT(grpc_or_, __LINE__).ok())      \
    return ToGrpc(QLORA_STATUS_CONCAT(grpc_or_, __LINE__).status()); \
  lhs = *std::move(QLORA_STATUS_CONCAT(grpc_or_, __LINE__))

absl::StatusOr<Caller> JobServiceImpl::CallerOf(const grpc::ServerContext& context) const {
  return auth_->Authenticate(CredentialsOf(context));
}

absl::StatusOr<JobRecord> JobServiceImpl::AccessibleJob(const Caller& caller, const std::string& id) const {
  QLORA_ASSIGN_OR_RETURN(JobRecord job, manager_->Get(id));
  QLORA_RETURN_IF_ERROR(CheckMayAccess(caller, job.owner, job.id));
  return job;
}

grpc::Status JobServiceImpl::SubmitJob(grpc::ServerContext* context, const v1::SubmitJobRequest* request,
                                       v1::SubmitJobResponse* response) {
  QLORA_GRPC_ASSIGN_OR_RETURN(const Caller caller, CallerOf(*context));
  SubmitRequest submit = FromProto(*request);
  submit.owner = caller.user;
  if (!request->resume_from().empty()) {
    QLORA_GRPC_ASSIGN_OR_RETURN(submit.continues, AccessibleJob(caller, request->resume_from()));
  }
  absl::StatusOr<JobRecord> job = manager_->Submit(submit);
  if (!job.ok()) return ToGrpc(job.status());
  ToProto(*job, response->mutable_job());
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ValidateJob(grpc::ServerContext* context, const v1::SubmitJobRequest* request,
                                         v1::ValidateJobResponse* response) {
  QLORA_GRPC_ASSIGN_OR_RETURN(const Caller caller, CallerOf(*context));
  SubmitRequest submit = FromProto(*request);
  if (!request->resume_from().empty()) {
    QLORA_GRPC_ASSIGN_OR_RETURN(submit.continues, AccessibleJob(caller, request->resume_from()));
  }
  absl::StatusOr<std::string> resolved = manager_->Validate(submit);
  if (!resolved.ok()) return ToGrpc(resolved.status());
  response->set_resolved_config_yaml(*resolved);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                                    v1::Job* response) {
  QLORA_GRPC_ASSIGN_OR_RETURN(const Caller caller, CallerOf(*context));
  QLORA_GRPC_ASSIGN_OR_RETURN(const JobRecord job, AccessibleJob(caller, request->id()));
  ToProto(job, response);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                                      v1::ListJobsResponse* response) {
  QLORA_GRPC_ASSIGN_OR_RETURN(const Caller caller, CallerOf(*context));
  std::set<JobState> states;
  for (int s : request->states()) {
    if (s < 1 || s > 6) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, absl::StrCat("unknown state ", s));
    states.insert(static_cast<JobState>(s));
  }
  constexpr int kDefaultPageSize = 100, kMaxPageSize = 1000;
  if (request->page_size() < 0 || request->page_size() > kMaxPageSize) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("page_size must be 0 to ", kMaxPageSize));
  }
  const int page_size = request->page_size() == 0 ? kDefaultPageSize : request->page_size();
  std::string next;
  const std::optional<std::string> owner =
      caller.admin ? std::nullopt : std::optional<std::string>(caller.user);
  absl::StatusOr<std::vector<JobRecord>> jobs =
      manager_->List(states, owner, page_size, request->page_token(), &next);
  if (!jobs.ok()) return ToGrpc(jobs.status());
  for (JobRecord& job : *jobs) {
    if (!request->include_job_yaml()) {
      job.job_yaml.clear();
      job.resolved_config_yaml.clear();
    } else if (absl::Status filled = manager_->FillJobFiles(&job); !filled.ok()) {
      return ToGrpc(filled);
    }
    ToProto(job, response->add_jobs());
  }
  response->set_next_page_token(next);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext* context, const v1::CancelJobRequest* request,
                                       v1::Job* response) {
  QLORA_GRPC_ASSIGN_OR_RETURN(const Caller caller, CallerOf(*context));
  if (absl::Status may = AccessibleJob(caller, request->id()).status(); !may.ok()) return ToGrpc(may);
  absl::StatusOr<JobRecord> job = manager_->Cancel(request->id());
  if (!job.ok()) return ToGrpc(job.status());
  ToProto(*job, response);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::OpenStream(const std::string& user, std::optional<StreamLimit::Slot>* slot) {
  StreamLimit::Refusal refusal;
  *slot = streams_.TryOpen(user, &refusal);
  if (slot->has_value()) return grpc::Status::OK;
  return grpc::Status(
      grpc::StatusCode::RESOURCE_EXHAUSTED,
      refusal == StreamLimit::Refusal::kTotal
          ? absl::StrCat("too many open watch and log streams (the coordinator's limit is ",
                         streams_.limit(), "); close some or try again later")
          : absl::StrCat(user, " has ", streams_.per_user_limit(),
                         " watch and log streams open, the limit per user (--max-streams-per-user); "
                         "close some or try again later"));
}

grpc::Status JobServiceImpl::WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                                      grpc::ServerWriter<v1::WatchJobResponse>* writer) {
  QLORA_GRPC_ASSIGN_OR_RETURN(const Caller caller, CallerOf(*context));
  absl::StatusOr<JobRecord> job = AccessibleJob(caller, request->id());
  if (!job.ok()) return ToGrpc(job.status());
  std::optional<StreamLimit::Slot> slot;
  if (grpc::Status open = OpenStream(caller.user, &slot); !open.ok()) return open;
  int64_t seen = request->from_start() ? 0 : request->after_sequence();
  if (seen == 0 && !request->from_start()) {
    // The first message is the full current state.
    v1::WatchJobResponse first;
    ToProto(*job, first.mutable_job());
    first.mutable_event()->set_sequence(job->last_sequence);
    first.mutable_event()->set_state(static_cast<v1::JobState>(job->state));
    first.mutable_event()->set_reason_code(job->reason_code);
    first.mutable_event()->set_message(job->message);
    if (!writer->Write(first)) return grpc::Status::OK;
    seen = job->last_sequence;
  }
  while (!context->IsCancelled()) {
    bool terminal = false;
    absl::StatusOr<std::vector<JobEvent>> events =
        manager_->WaitEvents(request->id(), seen, absl::Now() + absl::Milliseconds(500), &terminal);
    if (!events.ok()) return ToGrpc(events.status());
    if (!events->empty()) {
      absl::StatusOr<JobRecord> now = manager_->Get(request->id());
      if (!now.ok()) return ToGrpc(now.status());
      for (const JobEvent& e : *events) {
        v1::WatchJobResponse msg;
        ToProto(*now, msg.mutable_job());
        ToProto(e, msg.mutable_event());
        if (!writer->Write(msg)) return grpc::Status::OK;
        seen = e.sequence;
      }
    }
    if (terminal && events->empty()) return grpc::Status::OK;
  }
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::StreamLogs(grpc::ServerContext* context, const v1::StreamLogsRequest* request,
                                        grpc::ServerWriter<v1::LogChunk>* writer) {
  QLORA_GRPC_ASSIGN_OR_RETURN(const Caller caller, CallerOf(*context));
  absl::StatusOr<JobRecord> job = AccessibleJob(caller, request->id());
  if (!job.ok()) return ToGrpc(job.status());
  std::optional<StreamLimit::Slot> slot;
  if (grpc::Status open = OpenStream(caller.user, &slot); !open.ok()) return open;
  std::map<int, int64_t> offsets;  // rank -> bytes sent
  if (request->rank() >= 0) {
    offsets[request->rank()] = request->offset();
  } else {
    for (int r = 0; r < job->num_workers; ++r) offsets[r] = 0;
  }
  std::map<int, std::string> paths;
  for (const auto& [rank, offset] : offsets) {
    absl::StatusOr<std::string> path = manager_->LogPath(request->id(), rank);
    if (!path.ok()) return ToGrpc(path.status());
    paths[rank] = *path;
  }
  // Sends what each log gained since the last call; false when nothing was new.
  auto send_new = [&]() -> bool {
    bool any = false;
    for (auto& [rank, offset] : offsets) {
      const int64_t at = offset;
      std::string data = ReadFrom(paths[rank], &offset);
      if (data.empty()) continue;
      any = true;
      v1::LogChunk chunk;
      chunk.set_rank(rank);
      chunk.set_offset(at);
      chunk.set_data(std::move(data));
      if (!writer->Write(chunk)) return false;
    }
    return any;
  };
  while (!context->IsCancelled()) {
    if (send_new()) continue;
    if (!request->follow()) break;
    absl::StatusOr<JobRecord> now = manager_->Get(request->id());
    if (now.ok() && IsTerminal(now->state)) {
      // One last read after the end, so nothing written just before it is lost.
      while (send_new()) {
      }
      break;
    }
    usleep(200 * 1000);
  }
  return grpc::Status::OK;
}

}  // namespace qlora::coordinator
