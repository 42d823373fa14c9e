// gRPC JobService: the client API, forwarding to JobManager. Every call is authenticated first
// (authenticator.h): UNAUTHENTICATED without valid credentials; a user's calls on another
// user's job are PERMISSION_DENIED, and their list holds only their own jobs.
#pragma once

#include "coordinator/auth/authenticator.h"
#include "coordinator/generate/generation_sessions.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/rpc/stream_limit.h"
#include "qlora/v1/job_service.grpc.pb.h"

namespace qlora::coordinator {

struct JobServiceOptions {
  // At most this many WatchJob / StreamLogs streams at once, and per user (0 = no per-user
  // cap); RESOURCE_EXHAUSTED past either. Each open stream holds a server thread: by default one
  // user may hold an eighth of them, so no single user can take every stream.
  int max_streams = 256;
  int max_streams_per_user = 32;
};

class JobServiceImpl final : public v1::JobService::Service {
 public:
  // `sessions` (null: Generate is UNIMPLEMENTED) runs Generate's workers.
  JobServiceImpl(JobManager* manager, const Authenticator* auth, const JobServiceOptions& options = {},
                 GenerationSessions* sessions = nullptr)
      : manager_(manager),
        auth_(auth),
        sessions_(sessions),
        streams_(options.max_streams, options.max_streams_per_user) {}

  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest*, v1::SubmitJobResponse*) override;
  grpc::Status ValidateJob(grpc::ServerContext*, const v1::SubmitJobRequest*, v1::ValidateJobResponse*) override;
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest*, v1::Job*) override;
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*, v1::ListJobsResponse*) override;
  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest*, v1::Job*) override;
  grpc::Status WatchJob(grpc::ServerContext*, const v1::WatchJobRequest*,
                        grpc::ServerWriter<v1::WatchJobResponse>*) override;
  grpc::Status StreamLogs(grpc::ServerContext*, const v1::StreamLogsRequest*,
                          grpc::ServerWriter<v1::LogChunk>*) override;
  // job_service_generate.cc: a session on a free slot, its text streamed; a stream like
  // WatchJob's for the caps.
  grpc::Status Generate(grpc::ServerContext*, const v1::GenerateRequest*,
                        grpc::ServerWriter<v1::GeneratedText>*) override;

 private:
  // The authenticated caller of `context`'s call.
  absl::StatusOr<Caller> CallerOf(const grpc::ServerContext& context) const;
  // Job `id` if `caller` may see it: NOT_FOUND, or PERMISSION_DENIED for another user's job.
  absl::StatusOr<JobRecord> AccessibleJob(const Caller& caller, const std::string& id) const;
  // A stream slot for `user`, or RESOURCE_EXHAUSTED naming the limit.
  grpc::Status OpenStream(const std::string& user, std::optional<StreamLimit::Slot>* slot);

  JobManager* const manager_;
  const Authenticator* const auth_;
  GenerationSessions* const sessions_;
  StreamLimit streams_;
};

}  // namespace qlora::coordinator
