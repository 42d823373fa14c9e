// qloractl watch -o json (cli/event_json.h): a step is one line once every rank reported it, in
// step order, with integers as JSON numbers and the ranks' own reports; a state change is a line
// of its own, an ended job's with its adapter path; a step a rank never reported still comes
// out when the job moves on.
#include "cli/event_json.h"

#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "nlohmann/json.hpp"

namespace qlora::cli {
namespace {

v1::WatchJobResponse ProgressOf(int rank, int64_t step, int world) {
  v1::WatchJobResponse r;
  r.mutable_job()->set_id("job-000007");
  r.mutable_job()->set_num_workers(world);
  r.mutable_job()->set_resolved_config_yaml(std::string(4000, 'y'));  // never repeated
  v1::Progress* p = r.mutable_event()->mutable_progress();
  p->set_rank(rank);
  p->set_step(step);
  p->set_total_steps(4);
  p->set_loss(2.5 - 0.1 * step);
  p->set_learning_rate(1e-4);
  p->set_eval_loss(std::nan(""));
  p->set_tokens_per_second(1000 + rank);
  p->set_elapsed_seconds(step + 0.1 * rank);
  p->mutable_memory()->set_device_peak_bytes(int64_t{5} << 33);
  p->mutable_strategy()->set_world_size(world);
  return r;
}

v1::WatchJobResponse StateOf(v1::JobState state, int64_t sequence) {
  v1::WatchJobResponse r;
  r.mutable_job()->set_id("job-000007");
  r.mutable_job()->set_state(state);
  r.mutable_job()->set_adapter_path("/out/adapter");
  r.mutable_event()->set_sequence(sequence);
  r.mutable_event()->set_state(state);
  r.mutable_event()->set_message("done");
  return r;
}

std::vector<nlohmann::json> Parsed(const std::vector<std::string>& lines) {
  std::vector<nlohmann::json> out;
  for (const std::string& line : lines) {
    EXPECT_EQ(line.find('\n'), std::string::npos);
    EXPECT_EQ(line.find("yyyy"), std::string::npos);
    out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

TEST(CliEventJson, OneLinePerStepOnceEveryRankReportedIt) {
  EventJson json;
  std::vector<std::string> lines;
  auto add = [&](const v1::WatchJobResponse& r) {
    for (std::string& line : json.Add(r)) lines.push_back(std::move(line));
  };
  add(StateOf(v1::JOB_STATE_RUNNING, 1));
  add(ProgressOf(1, 1, 2));
  EXPECT_EQ(lines.size(), 1u);  // step 1 waits for rank 0
  add(ProgressOf(0, 1, 2));
  add(ProgressOf(0, 2, 2));
  add(ProgressOf(1, 2, 2));
  add(ProgressOf(0, 3, 2));  // rank 1 never reports step 3
  add(StateOf(v1::JOB_STATE_SUCCEEDED, 9));
  const std::vector<nlohmann::json> j = Parsed(lines);
  ASSERT_EQ(j.size(), 5u);
  EXPECT_EQ(j[0]["type"], "state");
  EXPECT_EQ(j[0]["state"], "JOB_STATE_RUNNING");
  for (int s = 1; s <= 3; ++s) {
    const nlohmann::json& step = j[s];
    EXPECT_EQ(step["type"], "step");
    EXPECT_EQ(step["job"], "job-000007");
    ASSERT_TRUE(step["step"].is_number_integer()) << step.dump();
    EXPECT_EQ(step["step"], s);
    EXPECT_EQ(step["total_steps"], 4);
    EXPECT_DOUBLE_EQ(step["loss"].get<double>(), 2.5 - 0.1 * s);
    EXPECT_TRUE(step["eval_loss"].is_null());
    ASSERT_EQ(step["ranks"].size(), s < 3 ? 2u : 1u);
    EXPECT_DOUBLE_EQ(step["tokens_per_second"].get<double>(), s < 3 ? 2001 : 1000);
    const nlohmann::json& memory = step["ranks"][0]["memory"];
    ASSERT_TRUE(memory["device_peak_bytes"].is_number_integer()) << memory.dump();
    EXPECT_EQ(memory["device_peak_bytes"].get<int64_t>(), int64_t{5} << 33);
  }
  EXPECT_DOUBLE_EQ(j[2]["elapsed_seconds"].get<double>(), 2.1);
  EXPECT_EQ(j[4]["type"], "state");
  EXPECT_EQ(j[4]["state"], "JOB_STATE_SUCCEEDED");
  EXPECT_EQ(j[4]["sequence"], 9);
  EXPECT_EQ(j[4]["adapter_path"], "/out/adapter");
}

}  // namespace
}  // namespace qlora::cli
