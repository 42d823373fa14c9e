// Plain job records shared by the coordinator's store, manager and gRPC layer (no gRPC, no
// SQLite, no torch here; coordinator/rpc/proto_convert.h maps them to the public API).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/worker_protocol.h"

namespace qlora::coordinator {

// Values equal the public proto's JobState numbers.
enum class JobState { kQueued = 1, kStarting = 2, kRunning = 3, kSucceeded = 4, kFailed = 5, kCancelled = 6 };

bool IsTerminal(JobState state);
const char* JobStateName(JobState state);

using qlora::MemorySnapshot;
using qlora::ProgressSnapshot;
using qlora::TrainSummary;

struct JobEvent {
  int64_t sequence = 0;
  double time_unix = 0;
  JobState state = JobState::kQueued;
  std::string reason_code;
  std::string message;
  std::optional<ProgressSnapshot> progress;
};

struct JobRecord {
  std::string id;
  std::string name;
  std::string owner;                 // the user who submitted it ("" for jobs stored before owners)
  std::string uid;                   // random, unique per job (WorkerAssignment::job_uid)
  int restarts = 0;                  // automatic restarts so far
  std::vector<std::string> restart_causes;  // why each start failed, oldest first
  JobState state = JobState::kQueued;
  std::string reason_code;
  std::string message;
  double created_unix = 0;
  double started_unix = 0;
  double finished_unix = 0;
  std::string job_yaml;
  std::string resolved_config_yaml;
  int num_workers = 0;
  int zero_stage = 0;
  std::string output_dir;
  std::string adapter_path;
  std::string merged_path;           // the merged HF model folder, when a merge was asked
  std::optional<TrainSummary> summary;  // rank 0's, once succeeded
  int64_t last_sequence = 0;
  std::vector<ProgressSnapshot> progress;  // latest per rank (index = rank)
};

// The job's state as an event: its state, reason and message, numbered last_sequence, with the
// time of its last state change unknown (0) and no progress.
JobEvent StateEventOf(const JobRecord& job);

// The end-of-job account of the training records from each rank's latest progress:
// "records: 214 trained (rank 0: 107, rank 1: 107), 0 left over, 0 malformed skipped, 0 without
// a target"; "" without progress.
std::string RecordSummary(const std::vector<ProgressSnapshot>& progress);

}  // namespace qlora::coordinator
