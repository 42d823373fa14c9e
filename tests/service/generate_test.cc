// `qloractl generate` end to end (and a job's GGUF output): the real coordinator starts a generation worker on a free CPU
// slot with a succeeded job's adapter (or one of its checkpoints), and the text streams back.
// That the engine's tokens equal transformers' generate is engine_generation_test's to show;
// this checks what a user of the service relies on: text for every prompt, the finish reasons
// and counts, greedy and seeded output that repeat, the right refusals, and the slot given back.
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/service_harness.h"
#include "tests/util/files.h"

namespace qlora::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::vector<nlohmann::json> JsonLines(const std::string& output) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] == '{') lines.push_back(nlohmann::json::parse(line));
  }
  return lines;
}

class GenerateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(TinyModelDir().empty()) << "could not make the tiny model";
    state_ = MakeTempDir("qlora-generate-");
  }
  void TearDown() override { fs::remove_all(state_); }
  std::string state_;
};

TEST_F(GenerateTest, ASucceededJobGeneratesForEveryPromptAndGivesItsSlotBack) {
  CoordinatorProcess c(state_, 1);  // one slot: a job after the generation needs it back
  ASSERT_TRUE(c.started());
  // output.gguf: the merged model is written as GGUF too (gguf_export_test checks its bytes).
  v1::Job job = SubmitJob(c, TinyJobYaml({.steps_per_checkpoint = 2}) + "output: {gguf: q8_0}\n");
  job = c.WaitForState(job.id(), {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, 300);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.state_message();
  const fs::path gguf = fs::path(job.adapter_path()).parent_path() / "model-q8_0.gguf";
  ASSERT_TRUE(fs::exists(gguf)) << gguf;
  EXPECT_EQ(ReadFile(gguf.string()).substr(0, 4), "GGUF");
  EXPECT_TRUE(fs::exists(job.merged_path() + "/config.json"));

  const std::string prompts = WriteFile(state_ + "/prompts.txt",
                                        "Name a colour.\n\n{\"instruction\": \"Count to three.\"}\n");
  CommandResult greedy = c.Ctl(absl::StrCat("generate ", job.id(), " --prompts-file ", prompts,
                                            " --max-new-tokens 12 -o json"));
  ASSERT_EQ(greedy.exit_code, 0) << greedy.output;
  const std::vector<nlohmann::json> lines = JsonLines(greedy.output);
  ASSERT_EQ(lines.size(), 2u) << greedy.output;
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(lines[i]["prompt_index"], i);
    EXPECT_GT(lines[i]["prompt_tokens"].get<int>(), 3);
    const int generated = lines[i]["generated_tokens"].get<int>();
    EXPECT_GE(generated, 1);
    EXPECT_LE(generated, 12);
    const std::string reason = lines[i]["finish_reason"];
    EXPECT_TRUE(reason == "eos" || (reason == "length" && generated == 12)) << lines[i].dump();
  }
  EXPECT_EQ(lines[1]["prompt"], "{\"instruction\": \"Count to three.\"}");
  // Greedy decoding gives the same text again; so does sampling with the same seed.
  CommandResult again = c.Ctl(absl::StrCat("generate ", job.id(), " --prompts-file ", prompts,
                                           " --max-new-tokens 12 -o json"));
  EXPECT_EQ(JsonLines(again.output), lines);
  const std::string sample = absl::StrCat("generate ", job.id(),
                                          " -p 'Name a colour.' --sample --temperature 2 --top-k 0 "
                                          "--max-new-tokens 16 --min-new-tokens 16 -o json --seed ");
  CommandResult seeded = c.Ctl(sample + "7");
  ASSERT_EQ(seeded.exit_code, 0) << seeded.output;
  EXPECT_EQ(JsonLines(c.Ctl(sample + "7").output), JsonLines(seeded.output));
  EXPECT_EQ(JsonLines(seeded.output).at(0)["generated_tokens"], 16);
  // A stop string ends the output before it.
  const std::string full = lines[0]["text"];
  for (size_t at = 1; at < full.size(); ++at) {
    if (!std::isalnum(static_cast<unsigned char>(full[at]))) continue;
    const std::string stop = full.substr(at, 1);
    CommandResult stopped = c.Ctl(absl::StrCat("generate ", job.id(), " -p 'Name a colour.' --max-new-tokens 12 --stop ",
                                               stop, " -o json"));
    ASSERT_EQ(stopped.exit_code, 0) << stopped.output;
    const nlohmann::json line = JsonLines(stopped.output).at(0);
    EXPECT_EQ(line["text"], full.substr(0, full.find(stop))) << full << " stop " << stop;
    EXPECT_EQ(line["finish_reason"], "stop");
    break;
  }
  // Text output streams the same words.
  CommandResult text = c.Ctl(absl::StrCat("generate ", job.id(), " -p 'Name a colour.' --max-new-tokens 12"));
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_EQ(text.output, lines[0]["text"].get<std::string>() + "\n");
  // A checkpoint's adapter.
  CommandResult checkpoint = c.Ctl(absl::StrCat("generate ", job.id(), " -p hi --checkpoint step-2 -o json"));
  EXPECT_EQ(checkpoint.exit_code, 0) << checkpoint.output;
  EXPECT_EQ(JsonLines(checkpoint.output).size(), 1u);
  // The worker's log sits beside the job's.
  EXPECT_TRUE(fs::exists(state_ + "/jobs/" + job.id() + "/logs/generate-1.log"));

  // The slot came back: the next job runs on it.
  v1::Job next = SubmitJob(c, ShortJob());
  next = c.WaitForState(next.id(), {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, 300);
  EXPECT_EQ(next.state(), v1::JOB_STATE_SUCCEEDED) << next.state_message();
}

// trainer.eval_samples: at each evaluation the model generates for the first validation records
// (here the training file's: the job has no validation file), recorded in metrics.jsonl, in
// TensorBoard's TEXT tab (read back with tensorboard's own reader) and in the log.
TEST_F(GenerateTest, EvaluationSamplesShowWhatTheModelWritesAsItTrains) {
  CoordinatorProcess c(state_, 1);
  ASSERT_TRUE(c.started());
  TestTraining training = ShortTraining();
  training.eval_steps = 2;
  training.more_trainer = "eval_samples: 2";
  v1::Job job = SubmitJob(c, TinyJobYaml(training));
  job = c.WaitForState(job.id(), {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, 300);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.state_message();
  const fs::path output = fs::path(job.adapter_path()).parent_path();
  std::vector<int64_t> steps;
  std::istringstream lines(ReadFile((output / "metrics.jsonl").string()));
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (!j.contains("samples")) continue;
    steps.push_back(j["step"].get<int64_t>());
    ASSERT_EQ(j["samples"].size(), 2u) << line;
    for (const nlohmann::json& sample : j["samples"]) {
      EXPECT_THAT(sample["prompt"].get<std::string>(), HasSubstr("### Response:")) << line;
      EXPECT_TRUE(sample.contains("output"));
    }
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{2, 4}));
  EXPECT_THAT(c.Ctl("logs " + job.id()).output, HasSubstr("sample 2 at step 4: "));
  const char* python = std::getenv("QLORA_PYTHON");
  if (python == nullptr || *python == 0) return;
  const CommandResult texts = RunCommand(absl::StrCat("'", python, "' '", SourceDir(),
                                                      "/tests/common/read_events.py' '", (output / "runs").string(),
                                                      "' --text"));
  ASSERT_EQ(texts.exit_code, 0) << texts.output;
  const nlohmann::json read = nlohmann::json::parse(texts.output, nullptr, false);
  ASSERT_TRUE(read.is_object()) << texts.output;
  ASSERT_EQ(read["eval/sample_1"].size(), 2u) << texts.output;
  EXPECT_THAT(read["eval/sample_1"][0][1].get<std::string>(), HasSubstr("**output**"));
}

TEST_F(GenerateTest, BadRequestsAreRefusedWithTheRightStatus) {
  CoordinatorProcess c(state_, 1);
  ASSERT_TRUE(c.started());
  // Temperature 0 in the job file: greedy decoding, as transformers takes it.
  v1::Job job = SubmitJob(c, ShortJob() + "generation: {temperature: 0}\n");
  job = c.WaitForState(job.id(), {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, 300);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.state_message();
  CommandResult greedy = c.Ctl(absl::StrCat("generate ", job.id(), " -p hi --max-new-tokens 4"));
  EXPECT_EQ(greedy.exit_code, 0) << greedy.output;
  // Sampling asked for by the request at the job's temperature 0: refused before any worker.
  CommandResult job_cold = c.Ctl(absl::StrCat("generate ", job.id(), " -p hi --sample"));
  EXPECT_EQ(job_cold.exit_code, 3) << job_cold.output;
  EXPECT_THAT(job_cold.output, HasSubstr("temperature from the job file"));

  CommandResult unknown = c.Ctl("generate job-000099 -p hi");
  EXPECT_EQ(unknown.exit_code, 4) << unknown.output;  // NOT_FOUND
  CommandResult bad_setting = c.Ctl(absl::StrCat("generate ", job.id(), " -p hi --top-p 1.5"));
  EXPECT_EQ(bad_setting.exit_code, 3) << bad_setting.output;  // INVALID_ARGUMENT
  EXPECT_THAT(bad_setting.output, HasSubstr("top_p"));
  CommandResult cold_sample = c.Ctl(absl::StrCat("generate ", job.id(), " -p hi --sample --temperature 0"));
  EXPECT_EQ(cold_sample.exit_code, 3) << cold_sample.output;  // INVALID_ARGUMENT, before any worker
  EXPECT_THAT(cold_sample.output, HasSubstr("temperature 0 with do_sample"));
  CommandResult no_checkpoint = c.Ctl(absl::StrCat("generate ", job.id(), " -p hi --checkpoint step-3"));
  EXPECT_EQ(no_checkpoint.exit_code, 4) << no_checkpoint.output;
  // A JSON prompt without the template's column fails in the worker, naming it.
  CommandResult wrong_column = c.Ctl(absl::StrCat("generate ", job.id(), " -p '{\"instrucion\": \"hi\"}'"));
  EXPECT_EQ(wrong_column.exit_code, 3) << wrong_column.output;
  EXPECT_THAT(wrong_column.output, HasSubstr("instruction"));
  CommandResult no_prompt = c.Ctl(absl::StrCat("generate ", job.id()));
  EXPECT_EQ(no_prompt.exit_code, 2) << no_prompt.output;

  // A job that has not succeeded has no final adapter.
  v1::Job running = SubmitJob(c, LongJob());
  c.WaitForState(running.id(), {v1::JOB_STATE_RUNNING}, 120);
  CommandResult early = c.Ctl(absl::StrCat("generate ", running.id(), " -p hi"));
  EXPECT_NE(early.exit_code, 0);
  EXPECT_THAT(early.output, HasSubstr("no final adapter"));
  // Its slot is taken: generation for the other job waits for none and says so.
  CommandResult busy = c.Ctl(absl::StrCat("generate ", job.id(), " -p hi"));
  EXPECT_NE(busy.exit_code, 0);
  EXPECT_THAT(busy.output, HasSubstr("busy"));
  c.Ctl("cancel " + running.id());
}

}  // namespace
}  // namespace qlora::testing
