// The status page's JSON: the job list and one job's detail (its curves' points and the tail of
// a log), rendered from plain records. Every string from a job goes through the JSON encoder
// (invalid UTF-8 replaced); the page's script puts them into the document as text only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "coordinator/jobs/job_types.h"

namespace qlora::coordinator {

// At most this many curve points per answer (evenly thinned, the latest always kept).
inline constexpr int kMaxCurvePoints = 2000;

// {"jobs": [{"id", "name", "owner", "state", "step", "total_steps", "loss", "eval_loss",
//            "learning_rate", "tokens_per_second", "created_unix", "restarts"}]}
// Progress fields are rank 0's, tokens_per_second the sum over ranks; null before any report.
std::string JobListJson(const std::vector<JobRecord>& jobs);

// {"job": {... as in the list, plus "reason_code", "message", "num_workers", "started_unix",
//          "finished_unix", "adapter_path"},
//  "points": [{"seq", "time_unix", "step", "loss", "eval_loss", "learning_rate",
//              "tokens_per_second"}],   rank 0's progress events after the asked sequence
//  "last_sequence": the last event's sequence (ask for what follows it next time),
//  "log_rank": r, "log": the tail of rank r's log,
//  "samples": {"step", "samples": [{"prompt", "output"}]} of the latest evaluation, or null}
std::string JobDetailJson(const JobRecord& job, const std::vector<JobEvent>& events,
                          int64_t after_sequence, int log_rank, const std::string& log_tail,
                          const std::string& metrics_tail = "");

// The latest evaluation samples (trainer.eval_samples) in the tail of a job's metrics.jsonl:
// its last line with "samples", as JSON text, or "null".
std::string LatestSamplesJson(const std::string& metrics_tail);

}  // namespace qlora::coordinator
