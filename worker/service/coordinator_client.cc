// gRPC implementation of CoordinatorClient (see coordinator_client.h).
#include "worker/service/coordinator_client.h"

#include <unistd.h>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/rpc/worker_protocol_convert.h"
#include "qlora/v1/worker_service.grpc.pb.h"

namespace qlora::worker {
namespace {

constexpr absl::Duration kCallDeadline = absl::Seconds(30);

absl::Status FromGrpc(const grpc::Status& s, const char* call) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat("coordinator ", call, ": ", s.error_message()));
}

class GrpcCoordinatorClient : public CoordinatorClient {
 public:
  explicit GrpcCoordinatorClient(const WorkerIdentity& id)
      : id_(id),
        stub_(v1::WorkerService::NewStub(
            grpc::CreateChannel(id.coordinator_address, grpc::InsecureChannelCredentials()))) {}

  absl::StatusOr<int64_t> Register(const std::string& device) override {
    v1::RegisterRequest req;
    req.set_job_id(id_.job_id);
    req.set_startup_token(id_.startup_token);
    req.set_rank(id_.rank);
    req.set_pid(getpid());
    req.set_device(device);
    v1::RegisterResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx, kCallDeadline);
    ctx.set_wait_for_ready(true);
    grpc::Status s = stub_->Register(&ctx, req, &resp);
    if (!s.ok()) return FromGrpc(s, "Register");
    return resp.generation();
  }

  absl::StatusOr<WorkerAssignment> GetAssignment(absl::Duration timeout) override {
    v1::GetAssignmentRequest req;
    req.set_job_id(id_.job_id);
    req.set_startup_token(id_.startup_token);
    req.set_rank(id_.rank);
    v1::Assignment resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx, timeout);
    grpc::Status s = stub_->GetAssignment(&ctx, req, &resp);
    if (!s.ok()) return FromGrpc(s, "GetAssignment");
    return FromProto(resp);
  }

  absl::Status PublishNcclId(const std::string& id) override {
    v1::PublishNcclIdRequest req;
    req.set_job_id(id_.job_id);
    req.set_startup_token(id_.startup_token);
    req.set_nccl_unique_id(id);
    v1::Ack resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx, kCallDeadline);
    return FromGrpc(stub_->PublishNcclId(&ctx, req, &resp), "PublishNcclId");
  }

  absl::StatusOr<bool> Heartbeat() override {
    v1::HeartbeatRequest req;
    req.set_job_id(id_.job_id);
    req.set_startup_token(id_.startup_token);
    req.set_rank(id_.rank);
    v1::HeartbeatResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx, absl::Seconds(10));
    grpc::Status s = stub_->Heartbeat(&ctx, req, &resp);
    if (!s.ok()) return FromGrpc(s, "Heartbeat");
    return resp.cancel();
  }

  absl::Status ReportProgress(const ProgressSnapshot& progress) override {
    v1::ProgressReport req;
    req.set_job_id(id_.job_id);
    req.set_startup_token(id_.startup_token);
    ToProto(progress, req.mutable_progress());
    v1::Ack resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx, kCallDeadline);
    return FromGrpc(stub_->ReportProgress(&ctx, req, &resp), "ReportProgress");
  }

  absl::Status ReportCompletion(bool ok, const std::string& error,
                                const std::string& adapter_path) override {
    v1::CompletionReport req;
    req.set_job_id(id_.job_id);
    req.set_startup_token(id_.startup_token);
    req.set_rank(id_.rank);
    req.set_ok(ok);
    req.set_error(error);
    req.set_adapter_path(adapter_path);
    v1::Ack resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx, kCallDeadline);
    return FromGrpc(stub_->ReportCompletion(&ctx, req, &resp), "ReportCompletion");
  }

  absl::Status StoreSet(int64_t generation, const std::string& key, const std::string& value) override {
    v1::StoreSetRequest req;
    req.set_job_id(id_.job_id);
    req.set_startup_token(id_.startup_token);
    req.set_generation(generation);
    req.set_key(key);
    req.set_value(value);
    v1::Ack resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx, kCallDeadline);
    return FromGrpc(stub_->StoreSet(&ctx, req, &resp), "StoreSet");
  }

  absl::StatusOr<std::string> StoreGet(int64_t generation, const std::string& key,
                                       absl::Duration timeout) override {
    v1::StoreGetRequest req;
    req.set_job_id(id_.job_id);
    req.set_startup_token(id_.startup_token);
    req.set_generation(generation);
    req.set_key(key);
    req.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
    v1::StoreGetResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx, timeout + absl::Seconds(5));
    grpc::Status s = stub_->StoreGet(&ctx, req, &resp);
    if (!s.ok()) return FromGrpc(s, "StoreGet");
    return resp.value();
  }

 private:
  static void SetDeadline(grpc::ClientContext* ctx, absl::Duration d) {
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + d));
  }

  WorkerIdentity id_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
};

}  // namespace

std::unique_ptr<CoordinatorClient> CoordinatorClient::Connect(const WorkerIdentity& identity) {
  return std::make_unique<GrpcCoordinatorClient>(identity);
}

}  // namespace qlora::worker
