// gRPC WorkerService: the API qlora-worker processes call, forwarding to JobManager (training
// ranks) or GenerationSessions (generation workers).
#pragma once

#include "coordinator/generate/generation_sessions.h"
#include "coordinator/jobs/job_manager.h"
#include "qlora/v1/worker_service.grpc.pb.h"

namespace qlora::coordinator {

class WorkerServiceImpl final : public v1::WorkerService::Service {
 public:
  explicit WorkerServiceImpl(JobManager* manager, GenerationSessions* sessions = nullptr)
      : manager_(manager), sessions_(sessions) {}

  grpc::Status Register(grpc::ServerContext*, const v1::RegisterRequest*, v1::RegisterResponse*) override;
  grpc::Status GetAssignment(grpc::ServerContext*, const v1::GetAssignmentRequest*, v1::Assignment*) override;
  grpc::Status PublishNcclId(grpc::ServerContext*, const v1::PublishNcclIdRequest*, v1::Ack*) override;
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*, v1::HeartbeatResponse*) override;
  grpc::Status ReportProgress(grpc::ServerContext*, const v1::ProgressReport*, v1::Ack*) override;
  grpc::Status ReportCompletion(grpc::ServerContext*, const v1::CompletionReport*, v1::Ack*) override;
  grpc::Status StoreSet(grpc::ServerContext*, const v1::StoreSetRequest*, v1::Ack*) override;
  grpc::Status StoreGet(grpc::ServerContext*, const v1::StoreGetRequest*, v1::StoreGetResponse*) override;
  grpc::Status GetGenerationTask(grpc::ServerContext*, const v1::GenerationTaskRequest*,
                                 v1::GenerationTask*) override;
  grpc::Status ReportGeneration(grpc::ServerContext*, const v1::GenerationReport*,
                                v1::GenerationReportResponse*) override;

 private:
  JobManager* const manager_;
  GenerationSessions* const sessions_;
};

}  // namespace qlora::coordinator
