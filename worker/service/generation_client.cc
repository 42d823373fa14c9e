// gRPC implementation of GenerationClient (see generation_client.h).
#include "worker/service/generation_client.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/rpc/coordinator_channel.h"
#include "common/status_macros.h"
#include "common/text/utf8.h"
#include "qlora/v1/worker_service.grpc.pb.h"

namespace qlora::worker {
namespace {

constexpr absl::Duration kCallDeadline = absl::Seconds(30);

class GrpcGenerationClient : public GenerationClient {
 public:
  GrpcGenerationClient(std::string session_id, std::string token, std::shared_ptr<grpc::Channel> channel)
      : session_id_(std::move(session_id)),
        token_(std::move(token)),
        stub_(v1::WorkerService::NewStub(std::move(channel))) {}

  absl::StatusOr<v1::GenerationTask> Task() override {
    v1::GenerationTaskRequest req;
    req.set_session_id(session_id_);
    req.set_startup_token(token_);
    v1::GenerationTask task;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
    ctx.set_wait_for_ready(true);  // the coordinator may still be binding
    QLORA_RETURN_IF_ERROR(Check(stub_->GetGenerationTask(&ctx, req, &task), "GetGenerationTask"));
    return task;
  }

  absl::StatusOr<bool> Report(const v1::GeneratedText& piece) override {
    v1::GenerationReport req;
    *req.mutable_piece() = piece;
    v1::GenerationReportResponse resp;
    QLORA_RETURN_IF_ERROR(Send(req, &resp));
    return !resp.stop();
  }

  absl::Status ReportFailure(const absl::Status& failure) override {
    v1::GenerationReport req;
    req.set_error(ValidUtf8(std::string(failure.message())));
    req.set_code(static_cast<int>(failure.code()));
    v1::GenerationReportResponse resp;
    return Send(req, &resp);
  }

 private:
  absl::Status Send(v1::GenerationReport& req, v1::GenerationReportResponse* resp) {
    req.set_session_id(session_id_);
    req.set_startup_token(token_);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
    return Check(stub_->ReportGeneration(&ctx, req, resp), "ReportGeneration");
  }

  static absl::Status Check(const grpc::Status& s, const char* call) {
    if (s.ok()) return absl::OkStatus();
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat("coordinator ", call, ": ", s.error_message()));
  }

  std::string session_id_, token_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GenerationClient>> GenerationClient::Connect(
    const std::string& coordinator_address, const std::string& session_id,
    const std::string& startup_token) {
  QLORA_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                         DialCoordinator(coordinator_address, ClientTlsFromEnvironment()));
  return std::make_unique<GrpcGenerationClient>(session_id, startup_token, std::move(channel));
}

}  // namespace qlora::worker
