// Maps the worker protocol's plain structs (common/worker_protocol.h) to and from their
// protobuf messages, for both ends of WorkerService. The only common/ code that sees protobuf.
#pragma once

#include "common/worker_protocol.h"
#include "qlora/v1/job.pb.h"
#include "qlora/v1/worker_service.pb.h"

namespace qlora {

void ToProto(const ProgressSnapshot& in, v1::Progress* out);
ProgressSnapshot FromProto(const v1::Progress& in);
void ToProto(const TrainSummary& in, v1::TrainSummary* out);
TrainSummary FromProto(const v1::TrainSummary& in);
void ToProto(const WorkerAssignment& in, v1::Assignment* out);
WorkerAssignment FromProto(const v1::Assignment& in);

}  // namespace qlora
