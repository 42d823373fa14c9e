// Progress lines of `qloractl watch` and `submit --follow`. On a terminal one line is redrawn on
// every change; piped (a log file, CI), one line is printed per optimizer step and per state
// change, not per rank event (every rank reports each step).
#pragma once

#include <string>

#include "qlora/v1/job_service.pb.h"

namespace qlora::cli {

// "RUNNING", "FAILED", ...
const char* StateName(v1::JobState state);
// SUCCEEDED, FAILED or CANCELLED: the job has ended.
bool IsTerminal(v1::JobState state);

// "job-000001 RUNNING step 12/40 [=====>     ] loss 2.3140 lr 0.0002 tok/s 812 ETA 0:00:31".
std::string ProgressLine(const v1::Job& job);

// A rank's activation-checkpointing choice as `qloractl get` prints it: "rank 0: 10 of 32
// layers activation-checkpointed, planned peak 21.6 GiB of a 24.0 GiB budget, measured 21.1 GiB,
// 4 offloaded to host memory, 26 with dequantized weights" (each part after the first only
// where it is set); "" where the rank reported no choice.
std::string CheckpointLine(const v1::Progress& progress);

// Where a rank's base weights live and what the reported step moved: "rank 0: partitioned over
// 2 rank(s), in host memory; last step gathered 412.0 MiB, copied 3072.0 MiB from host memory,
// waited 0.01 s"; "" where they sit whole on the device.
std::string BaseWeightsLine(const v1::Progress& progress);

// "1:02:03"; "--:--" for a negative or non-finite duration.
std::string FormatDuration(double seconds);

class ProgressPrinter {
 public:
  explicit ProgressPrinter(bool tty) : tty_(tty) {}

  // What to write for this update of the job ("" for nothing): on a terminal "\r\033[K" and the
  // line when it changed; piped, the line and "\n" when the step, the state, the eval loss or
  // (before the first step) the state message changed.
  std::string Update(const v1::Job& job);
  // What to write once the stream ends: "\n" on a terminal after a redrawn line, else "".
  std::string Finish();

 private:
  bool tty_;
  std::string last_line_;  // terminal: the line on screen
  std::string last_key_;   // piped: what the last printed line stood for
};

}  // namespace qlora::cli
