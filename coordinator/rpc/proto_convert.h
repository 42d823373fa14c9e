// Maps the coordinator's plain records to and from the public protobuf messages, and absl
// statuses to gRPC statuses (1:1 by code). Events map in store/job_event_proto.h, which the
// store shares.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "coordinator/jobs/job_manager.h"
#include "common/rpc/worker_protocol_convert.h"
#include "coordinator/jobs/job_types.h"
#include "coordinator/store/job_event_proto.h"
#include "qlora/v1/job.pb.h"

namespace qlora::coordinator {

grpc::Status ToGrpc(const absl::Status& status);

using qlora::FromProto;
using qlora::ToProto;
void ToProto(const JobRecord& in, v1::Job* out);

}  // namespace qlora::coordinator
