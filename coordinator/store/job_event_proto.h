// A job event <-> its public protobuf message (qlora.v1.JobEvent). The store keeps each event as
// this message's bytes, and the gRPC layer sends the same message, so a new progress field
// reaches both through the proto and its producer alone. No gRPC here.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "coordinator/jobs/job_types.h"
#include "qlora/v1/job.pb.h"

namespace qlora::coordinator {

void ToProto(const JobEvent& in, v1::JobEvent* out);
JobEvent FromProto(const v1::JobEvent& in);

// The event as the serialized message, and back; a record that does not parse is INTERNAL
// (the store's file was damaged or written by something else).
std::string EncodeJobEvent(const JobEvent& event);
absl::StatusOr<JobEvent> DecodeJobEvent(absl::string_view bytes);

}  // namespace qlora::coordinator
