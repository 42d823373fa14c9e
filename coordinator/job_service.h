// gRPC JobService: the client API, forwarding to JobManager.
#pragma once

#include "coordinator/job_manager.h"
#include "qlora/v1/job_service.grpc.pb.h"

namespace qlora::coordinator {

class JobServiceImpl final : public v1::JobService::Service {
 public:
  explicit JobServiceImpl(JobManager* manager) : manager_(manager) {}

  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest*, v1::SubmitJobResponse*) override;
  grpc::Status ValidateJob(grpc::ServerContext*, const v1::SubmitJobRequest*, v1::ValidateJobResponse*) override;
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest*, v1::Job*) override;
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*, v1::ListJobsResponse*) override;
  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest*, v1::Job*) override;
  grpc::Status WatchJob(grpc::ServerContext*, const v1::WatchJobRequest*,
                        grpc::ServerWriter<v1::WatchJobResponse>*) override;
  grpc::Status StreamLogs(grpc::ServerContext*, const v1::StreamLogsRequest*,
                          grpc::ServerWriter<v1::LogChunk>*) override;

 private:
  JobManager* const manager_;
};

}  // namespace qlora::coordinator
