// gRPC implementation of CoordinatorClient (see coordinator_client.h).
#include "worker/service/coordinator_client.h"

#include <unistd.h>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/rpc/coordinator_channel.h"
#include "common/rpc/worker_protocol_convert.h"
#include "common/status_macros.h"
#include "common/text/utf8.h"
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
  GrpcCoordinatorClient(const WorkerIdentity& id, std::shared_ptr<grpc::Channel> channel)
      : id_(id), stub_(v1::WorkerService::NewStub(std::move(channel))) {}

  absl::Status Register() override {
    v1::RegisterRequest req;
    req.set_rank(id_.rank);
    req.set_pid(getpid());
    v1::RegisterResponse resp;
    // The coordinator may still be binding: wait for the channel rather than fail at once.
    return Call(&Stub::Register, req, &resp, kCallDeadline, "Register", /*wait_for_ready=*/true);
  }

  absl::StatusOr<WorkerAssignment> GetAssignment(absl::Duration timeout) override {
    v1::GetAssignmentRequest req;
    req.set_rank(id_.rank);
    v1::Assignment resp;
    QLORA_RETURN_IF_ERROR(Call(&Stub::GetAssignment, req, &resp, timeout, "GetAssignment"));
    return FromProto(resp);
  }

  absl::Status PublishNcclId(const std::string& id) override {
    v1::PublishNcclIdRequest req;
    req.set_nccl_unique_id(id);
    v1::Ack resp;
    return Call(&Stub::PublishNcclId, req, &resp, kCallDeadline, "PublishNcclId");
  }

  absl::StatusOr<bool> Heartbeat() override {
    v1::HeartbeatRequest req;
    req.set_rank(id_.rank);
    v1::HeartbeatResponse resp;
    QLORA_RETURN_IF_ERROR(Call(&Stub::Heartbeat, req, &resp, absl::Seconds(10), "Heartbeat"));
    return resp.cancel();
  }

  absl::Status ReportProgress(const ProgressSnapshot& progress) override {
    v1::ProgressReport req;
    ToProto(progress, req.mutable_progress());
    v1::Ack resp;
    return Call(&Stub::ReportProgress, req, &resp, kCallDeadline, "ReportProgress");
  }

  absl::Status ReportCompletion(const WorkerCompletion& completion) override {
    v1::CompletionReport req;
    req.set_rank(id_.rank);
    req.set_ok(completion.ok);
    // An error may quote a record's bytes; a string field that is not UTF-8 would not serialize
    // and the cause would be lost.
    req.set_error(ValidUtf8(completion.error));
    req.set_retryable(completion.retryable);
    req.set_adapter_path(completion.adapter_path);
    req.set_merged_path(completion.merged_path);
    if (completion.summary) ToProto(*completion.summary, req.mutable_summary());
    v1::Ack resp;
    return Call(&Stub::ReportCompletion, req, &resp, kCallDeadline, "ReportCompletion");
  }

  absl::Status StoreSet(int64_t generation, const std::string& key, const std::string& value) override {
    v1::StoreSetRequest req;
    req.set_generation(generation);
    req.set_key(key);
    req.set_value(value);
    v1::Ack resp;
    return Call(&Stub::StoreSet, req, &resp, kCallDeadline, "StoreSet");
  }

  absl::StatusOr<std::string> StoreGet(int64_t generation, const std::string& key,
                                       absl::Duration timeout) override {
    v1::StoreGetRequest req;
    req.set_generation(generation);
    req.set_key(key);
    req.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
    v1::StoreGetResponse resp;
    QLORA_RETURN_IF_ERROR(Call(&Stub::StoreGet, req, &resp, timeout + absl::Seconds(5), "StoreGet"));
    return resp.value();
  }

 private:
  using Stub = v1::WorkerService::Stub;

  // Stamps this worker's job id and startup token on `req`, calls `method` with a deadline and
  // maps the result to an absl::Status naming the call.
  template <typename Request, typename Response>
  absl::Status Call(grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
                    Request& req, Response* resp, absl::Duration deadline, const char* name,
                    bool wait_for_ready = false) {
    req.set_job_id(id_.job_id);
    req.set_startup_token(id_.startup_token);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    ctx.set_wait_for_ready(wait_for_ready);
    return FromGrpc((stub_.get()->*method)(&ctx, req, resp), name);
  }

  WorkerIdentity id_;
  std::unique_ptr<Stub> stub_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorClient>> CoordinatorClient::Connect(const WorkerIdentity& identity) {
  // The coordinator that started this worker put its TLS settings in the environment.
  QLORA_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                         DialCoordinator(identity.coordinator_address, ClientTlsFromEnvironment()));
  return std::make_unique<GrpcCoordinatorClient>(identity, std::move(channel));
}

}  // namespace qlora::worker
