// gRPC WorkerService (see worker_service.h).
#include "coordinator/rpc/worker_service.h"

#include <algorithm>

#include "coordinator/jobs/peer_address.h"
#include "coordinator/rpc/proto_convert.h"

namespace qlora::coordinator {
namespace {

// A blocking call waits until the client's deadline (at most `cap`).
absl::Time WaitDeadline(const grpc::ServerContext* context, absl::Duration cap) {
  const absl::Time client = absl::FromChrono(context->deadline());
  return std::min(client, absl::Now() + cap);
}

}  // namespace

grpc::Status WorkerServiceImpl::Register(grpc::ServerContext* context, const v1::RegisterRequest* r,
                                         v1::RegisterResponse*) {
  return ToGrpc(manager_->Register(r->job_id(), r->startup_token(), r->rank(), r->pid(),
                                   PeerHost(context->peer())));
}

grpc::Status WorkerServiceImpl::GetAssignment(grpc::ServerContext* context, const v1::GetAssignmentRequest* r,
                                              v1::Assignment* response) {
  absl::StatusOr<WorkerAssignment> a = manager_->GetAssignment(
      r->job_id(), r->startup_token(), WaitDeadline(context, absl::Minutes(10)));
  if (!a.ok()) return ToGrpc(a.status());
  ToProto(*a, response);
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::PublishNcclId(grpc::ServerContext*, const v1::PublishNcclIdRequest* r, v1::Ack*) {
  return ToGrpc(manager_->PublishNcclId(r->job_id(), r->startup_token(), r->nccl_unique_id()));
}

grpc::Status WorkerServiceImpl::Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* r,
                                          v1::HeartbeatResponse* response) {
  absl::StatusOr<bool> cancel = manager_->Heartbeat(r->job_id(), r->startup_token());
  if (!cancel.ok()) return ToGrpc(cancel.status());
  response->set_cancel(*cancel);
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::ReportProgress(grpc::ServerContext*, const v1::ProgressReport* r, v1::Ack*) {
  return ToGrpc(manager_->ReportProgress(r->job_id(), r->startup_token(), FromProto(r->progress())));
}

grpc::Status WorkerServiceImpl::ReportCompletion(grpc::ServerContext*, const v1::CompletionReport* r, v1::Ack*) {
  WorkerCompletion completion;
  completion.ok = r->ok();
  completion.error = r->error();
  completion.retryable = r->retryable();
  completion.adapter_path = r->adapter_path();
  completion.merged_path = r->merged_path();
  if (r->has_summary()) completion.summary = FromProto(r->summary());
  return ToGrpc(manager_->ReportCompletion(r->job_id(), r->startup_token(), completion));
}

grpc::Status WorkerServiceImpl::StoreSet(grpc::ServerContext*, const v1::StoreSetRequest* r, v1::Ack*) {
  return ToGrpc(manager_->StoreSet(r->job_id(), r->startup_token(), r->generation(), r->key(), r->value()));
}

grpc::Status WorkerServiceImpl::StoreGet(grpc::ServerContext* context, const v1::StoreGetRequest* r,
                                         v1::StoreGetResponse* response) {
  const absl::Duration wait = r->timeout_ms() > 0 ? absl::Milliseconds(r->timeout_ms()) : absl::Seconds(60);
  absl::StatusOr<std::string> value = manager_->StoreGet(
      r->job_id(), r->startup_token(), r->generation(), r->key(), WaitDeadline(context, wait));
  if (!value.ok()) return ToGrpc(value.status());
  response->set_value(*value);
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::GetGenerationTask(grpc::ServerContext*, const v1::GenerationTaskRequest* r,
                                                  v1::GenerationTask* response) {
  if (sessions_ == nullptr) return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "generation is off");
  absl::StatusOr<v1::GenerationTask> task = sessions_->Task(r->session_id(), r->startup_token());
  if (!task.ok()) return ToGrpc(task.status());
  *response = *std::move(task);
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::ReportGeneration(grpc::ServerContext*, const v1::GenerationReport* r,
                                                 v1::GenerationReportResponse* response) {
  if (sessions_ == nullptr) return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "generation is off");
  absl::StatusOr<bool> stop = sessions_->Report(r->session_id(), r->startup_token(), *r);
  if (!stop.ok()) return ToGrpc(stop.status());
  response->set_stop(*stop);
  return grpc::Status::OK;
}

}  // namespace qlora::coordinator
