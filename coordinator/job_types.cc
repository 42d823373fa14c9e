// Names and predicates of job states (see job_types.h).
#include "coordinator/job_types.h"

namespace qlora::coordinator {

bool IsTerminal(JobState state) {
  return state == JobState::kSucceeded || state == JobState::kFailed || state == JobState::kCancelled;
}

const char* JobStateName(JobState state) {
  switch (state) {
    case JobState::kQueued: return "QUEUED";
    case JobState::kStarting: return "STARTING";
    case JobState::kRunning: return "RUNNING";
    case JobState::kSucceeded: return "SUCCEEDED";
    case JobState::kFailed: return "FAILED";
    case JobState::kCancelled: return "CANCELLED";
  }
  return "UNKNOWN";
}

JobEvent StateEventOf(const JobRecord& job) {
  JobEvent e;
  e.sequence = job.last_sequence;
  e.state = job.state;
  e.reason_code = job.reason_code;
  e.message = job.message;
  return e;
}

}  // namespace qlora::coordinator
