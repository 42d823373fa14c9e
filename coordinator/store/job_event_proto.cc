// JobEvent <-> qlora.v1.JobEvent (see job_event_proto.h).
#include "coordinator/store/job_event_proto.h"

#include "absl/status/status.h"
#include "common/rpc/worker_protocol_convert.h"
#include "common/text/utf8.h"

namespace qlora::coordinator {

void ToProto(const JobEvent& in, v1::JobEvent* out) {
  out->set_sequence(in.sequence);
  out->set_time_unix(in.time_unix);
  out->set_state(static_cast<v1::JobState>(in.state));
  out->set_reason_code(in.reason_code);
  out->set_message(ValidUtf8(in.message));  // may quote a file's bytes
  if (in.progress) qlora::ToProto(*in.progress, out->mutable_progress());
}

JobEvent FromProto(const v1::JobEvent& in) {
  JobEvent e;
  e.sequence = in.sequence();
  e.time_unix = in.time_unix();
  e.state = static_cast<JobState>(in.state());
  e.reason_code = in.reason_code();
  e.message = in.message();
  if (in.has_progress()) e.progress = qlora::FromProto(in.progress());
  return e;
}

std::string EncodeJobEvent(const JobEvent& event) {
  v1::JobEvent message;
  ToProto(event, &message);
  return message.SerializeAsString();
}

absl::StatusOr<JobEvent> DecodeJobEvent(absl::string_view bytes) {
  v1::JobEvent message;
  if (!message.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InternalError("a stored job event does not parse as qlora.v1.JobEvent");
  }
  return FromProto(message);
}

}  // namespace qlora::coordinator
