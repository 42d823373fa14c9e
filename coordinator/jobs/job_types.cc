// Names and predicates of job states, the state event and the record summary (see job_types.h).
#include "coordinator/jobs/job_types.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

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

std::string RecordSummary(const std::vector<ProgressSnapshot>& progress) {
  if (progress.empty()) return "";
  RecordCounts sum;
  std::vector<std::string> per_rank;
  for (const ProgressSnapshot& p : progress) {
    sum.trained += p.total_records.trained;
    sum.left_over += p.total_records.left_over;
    sum.malformed += p.total_records.malformed;
    sum.without_target += p.total_records.without_target;
    per_rank.push_back(absl::StrCat("rank ", p.rank, ": ", p.total_records.trained));
  }
  return absl::StrCat("records: ", sum.trained, " trained (", absl::StrJoin(per_rank, ", "), "), ",
                      sum.left_over, " left over, ", sum.malformed, " malformed skipped, ",
                      sum.without_target, " without a target");
}

}  // namespace qlora::coordinator
