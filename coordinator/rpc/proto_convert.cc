// Record <-> protobuf mapping (see proto_convert.h).
#include "coordinator/rpc/proto_convert.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/rpc/worker_protocol_convert.h"
#include "common/text/utf8.h"

namespace qlora::coordinator {

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // The message travels in a trailer that clients cap (8 KiB by default): an error quoting a
  // hostile input at length would reach the client as a transport error instead of itself.
  constexpr size_t kMaxMessage = 2048;
  std::string message = ValidUtf8(std::string(status.message()));
  if (message.size() > kMaxMessage) {
    const size_t kept = Utf8Prefix(message, kMaxMessage).size();
    message = absl::StrCat(message.substr(0, kept), "... (", message.size() - kept,
                           " more bytes of the message left out)");
  }
  // absl::StatusCode and grpc::StatusCode share google.rpc.Code numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), message);
}

void ToProto(const JobRecord& in, v1::Job* out) {
  out->set_id(in.id);
  out->set_name(in.name);
  out->set_state(static_cast<v1::JobState>(in.state));
  out->set_state_reason_code(in.reason_code);
  out->set_state_message(ValidUtf8(in.message));  // messages may quote a file's bytes
  out->set_created_unix(in.created_unix);
  out->set_started_unix(in.started_unix);
  out->set_finished_unix(in.finished_unix);
  out->set_job_yaml(in.job_yaml);
  out->set_resolved_config_yaml(in.resolved_config_yaml);
  out->set_num_workers(in.num_workers);
  out->set_zero_stage(in.zero_stage);
  out->set_output_dir(in.output_dir);
  out->set_adapter_path(in.adapter_path);
  out->set_merged_path(in.merged_path);
  if (in.summary) qlora::ToProto(*in.summary, out->mutable_summary());
  out->set_last_sequence(in.last_sequence);
  out->set_owner(in.owner);
  out->set_restarts(in.restarts);
  for (const std::string& cause : in.restart_causes) out->add_restart_causes(ValidUtf8(cause));
  for (const ProgressSnapshot& p : in.progress) ToProto(p, out->add_progress());
}

}  // namespace qlora::coordinator
