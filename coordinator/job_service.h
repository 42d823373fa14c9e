// gRPC JobService: the client API, forwarding to JobManager.
#pragma once

#include "coordinator/job_manager.h"
#include "coordinator/stream_limit.h"
#include "qlora/v1/job_service.grpc.pb.h"

namespace qlora::coordinator {

class JobServiceImpl final : public v1::JobService::Service {
 public:
  // At most `max_streams` WatchJob / StreamLogs streams at once (RESOURCE_EXHAUSTED past it).
  explicit JobServiceImpl(JobManager* manager, int max_streams = 256)
      : manager_(manager), streams_(max_streams) {}

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
  // A stream slot, or RESOURCE_EXHAUSTED naming the limit.
  grpc::Status OpenStream(std::optional<StreamLimit::Slot>* slot);

  JobManager* const manager_;
  StreamLimit streams_;
};

}  // namespace qlora::coordinator
