// What `qloractl watch -o json` prints, for scripts: one JSON object per line,
//   {"type": "state", "job", "sequence", "time_unix", "state", "reason_code", "message"}
//     for every state change (the job's output_dir and adapter_path with an ended one), and
//   {"type": "step", "job", "step", "total_steps", "epoch", "loss", "learning_rate",
//    "eval_loss", "tokens_per_second", "elapsed_seconds", "ranks": [...]}
//     once per optimizer step, when every rank has reported it (or the job moved on without
//     them): loss and learning rate are the job's (every rank reports the same), tokens/s the
//     sum over ranks, elapsed the longest, and "ranks" each rank's whole report.
// Integers are JSON numbers (protobuf's JSON writes 64-bit ones as strings), a NaN is null, an
// enum its name; the job file's texts are not repeated on every line.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "qlora/v1/job_service.pb.h"

namespace qlora::cli {

class EventJson {
 public:
  // The lines one WatchJob response adds (none while a step waits for its other ranks).
  std::vector<std::string> Add(const v1::WatchJobResponse& response);
  // The steps still waiting for ranks that never reported them, in order.
  std::vector<std::string> Flush();

 private:
  std::string StepLine(int64_t step) const;

  std::string job_id_;
  std::map<int64_t, std::map<int, v1::Progress>> pending_;  // step -> rank -> its report
};

// A message as JSON with every field (reflection): integers as numbers, NaN as null.
std::string MessageJson(const google::protobuf::Message& message);

}  // namespace qlora::cli
