// The progress printer of `qloractl watch` / `submit --follow`: piped, one line per optimizer
// step and state change however many ranks report each step; on a terminal, a redrawn line.
#include "cli/progress.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace qlora::cli {
namespace {

v1::Job JobAt(v1::JobState state, int ranks, int step, int total, double tokens_per_second) {
  v1::Job job;
  job.set_id("job-000001");
  job.set_state(state);
  for (int r = 0; r < ranks; ++r) {
    v1::Progress* p = job.add_progress();
    p->set_step(step);
    p->set_total_steps(total);
    p->set_loss(2.0 - 0.01 * step);
    p->set_elapsed_seconds(step);
    p->set_tokens_per_second(tokens_per_second + r);
  }
  return job;
}

// The events of a 2-rank job of `steps` steps as the coordinator streams them: state changes,
// then each rank's report of each step (rank 1 first half of the time), then the end.
std::vector<v1::Job> Events(int steps) {
  std::vector<v1::Job> events;
  v1::Job queued;
  queued.set_id("job-000001");
  queued.set_state(v1::JOB_STATE_QUEUED);
  events.push_back(queued);
  v1::Job starting = queued;
  starting.set_state(v1::JOB_STATE_STARTING);
  starting.set_state_message("waiting for 2 workers");
  events.push_back(starting);
  for (int step = 1; step <= steps; ++step) {
    v1::Job rank0 = JobAt(v1::JOB_STATE_RUNNING, 2, step, steps, 100 + step);
    v1::Job rank1 = rank0;  // rank 1's report first: rank 0's entry still at the last step
    rank1.mutable_progress(0)->set_step(step - 1);
    if (step > 1) events.push_back(rank1);
    events.push_back(rank0);
  }
  events.push_back(JobAt(v1::JOB_STATE_SUCCEEDED, 2, steps, steps, 0));
  return events;
}

TEST(ProgressPrinterTest, PipedPrintsOneLinePerStep) {
  ProgressPrinter printer(/*tty=*/false);
  std::string out;
  for (const v1::Job& e : Events(60)) out += printer.Update(e);
  out += printer.Finish();
  const std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  // QUEUED, STARTING, 60 steps, SUCCEEDED.
  ASSERT_EQ(lines.size(), 63u) << out;
  EXPECT_EQ(lines[0], "job-000001 QUEUED");
  EXPECT_EQ(lines[1], "job-000001 STARTING  waiting for 2 workers");
  EXPECT_NE(lines[2].find("step 1/60"), std::string::npos) << lines[2];
  EXPECT_NE(lines[61].find("RUNNING step 60/60"), std::string::npos) << lines[61];
  EXPECT_NE(lines[62].find("SUCCEEDED step 60/60"), std::string::npos) << lines[62];
  EXPECT_EQ(out.find('\r'), std::string::npos);
}

TEST(ProgressPrinterTest, PipedPrintsAnEvalLossWhenItArrives) {
  ProgressPrinter printer(/*tty=*/false);
  v1::Job job = JobAt(v1::JOB_STATE_RUNNING, 1, 20, 60, 100);
  EXPECT_FALSE(printer.Update(job).empty());
  job.mutable_progress(0)->set_eval_loss(1.5);
  EXPECT_NE(printer.Update(job).find("eval 1.5000"), std::string::npos);
  EXPECT_TRUE(printer.Update(job).empty());
}

TEST(ProgressPrinterTest, TerminalRedrawsChangedLines) {
  ProgressPrinter printer(/*tty=*/true);
  v1::Job job = JobAt(v1::JOB_STATE_RUNNING, 2, 3, 60, 100);
  const std::string first = printer.Update(job);
  EXPECT_EQ(first.rfind("\r\033[K", 0), 0u);
  EXPECT_TRUE(printer.Update(job).empty());
  job.mutable_progress(1)->set_tokens_per_second(500);  // another rank's report: redrawn
  EXPECT_FALSE(printer.Update(job).empty());
  EXPECT_EQ(printer.Finish(), "\n");
}

TEST(ProgressPrinterTest, LineShowsStepLossAndEta) {
  const std::string line = ProgressLine(JobAt(v1::JOB_STATE_RUNNING, 2, 30, 60, 100));
  EXPECT_NE(line.find("step 30/60 [==========>         ]"), std::string::npos) << line;
  EXPECT_NE(line.find("loss 1.7000"), std::string::npos) << line;
  EXPECT_NE(line.find("tok/s 201"), std::string::npos) << line;
  EXPECT_NE(line.find("ETA 0:00:30"), std::string::npos) << line;
  EXPECT_EQ(FormatDuration(-1), "--:--");
  EXPECT_EQ(FormatDuration(3723), "1:02:03");
}

// `qloractl get`'s checkpoint line: every part the worker reported, GiB from bytes, and nothing
// for a rank without a choice (-1, as the coordinator stores a report without one, or none).
TEST(CheckpointLineTest, SaysEachPartTheRankReported) {
  v1::Progress p;
  p.set_rank(1);
  EXPECT_EQ(CheckpointLine(p), "");
  v1::CheckpointingReport* c = p.mutable_checkpointing();
  c->set_checkpointed_layers(-1);
  EXPECT_EQ(CheckpointLine(p), "");
  c->set_checkpointed_layers(0);
  c->set_layers(32);
  EXPECT_EQ(CheckpointLine(p), "rank 1: 0 of 32 layers activation-checkpointed");
  constexpr int64_t kGiB = int64_t{1} << 30;
  c->set_checkpointed_layers(10);
  c->set_planned_peak_bytes(kGiB * 216 / 10);
  c->set_budget_bytes(24 * kGiB);
  c->set_measured_peak_bytes(kGiB * 211 / 10);
  c->set_offloaded_layers(4);
  c->set_dequantized_layers(26);
  EXPECT_EQ(CheckpointLine(p),
            "rank 1: 10 of 32 layers activation-checkpointed, planned peak 21.6 GiB of a 24.0 GiB "
            "budget, measured 21.1 GiB, 4 offloaded to host memory, 26 with dequantized weights");
  c->set_budget_bytes(0);
  c->set_offloaded_layers(0);
  EXPECT_EQ(CheckpointLine(p),
            "rank 1: 10 of 32 layers activation-checkpointed, measured 21.1 GiB, 26 with dequantized "
            "weights");
}

// `qloractl get`'s weights line: only where the base weights are partitioned or in host memory,
// with the reported step's traffic.
TEST(BaseWeightsLineTest, SaysWhereTheWeightsLiveAndWhatTheStepMoved) {
  v1::Progress p;
  p.set_rank(0);
  v1::StrategyReport* s = p.mutable_strategy();
  s->set_world_size(2);
  EXPECT_EQ(BaseWeightsLine(p), "");
  s->set_partitioned_base_weights(true);
  s->set_base_weight_gathered_bytes(int64_t{412} << 20);
  s->set_base_weight_wait_seconds(0.014);
  EXPECT_EQ(BaseWeightsLine(p),
            "rank 0: partitioned over 2 rank(s); last step gathered 412.0 MiB, copied 0.0 MiB "
            "from host memory, waited 0.01 s");
  s->set_partitioned_base_weights(false);
  s->set_base_weights_in_host_memory(true);
  s->set_base_weight_gathered_bytes(0);
  s->set_base_weight_copied_bytes(int64_t{3} << 30);
  EXPECT_EQ(BaseWeightsLine(p),
            "rank 0: whole, in host memory; last step gathered 0.0 MiB, copied 3072.0 MiB from "
            "host memory, waited 0.01 s");
}

}  // namespace
}  // namespace qlora::cli
