// End-to-end tests of the service: the real coordinator binary on 127.0.0.1 port 0, real
// qlora-worker processes on CPU, the real qloractl, and a C++ gRPC client.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include <grpcpp/grpcpp.h>
#include "grpc/health/v1/health.grpc.pb.h"
#include "qlora/v1/worker_service.grpc.pb.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/safetensors/reader.h"
#include "tests/service/service_harness.h"
#include "tests/util/files.h"

namespace qlora::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;


// grpc.health's overall status, or -1 when the call fails within `seconds`.
int HealthOf(CoordinatorProcess& c, double seconds = 2) {
  auto health = grpc::health::v1::Health::NewStub(c.channel());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::duration_cast<std::chrono::milliseconds>(
                                                          std::chrono::duration<double>(seconds)));
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status s = health->Check(&ctx, req, &resp);
  return s.ok() ? resp.status() : -1;
}

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(TinyModelDir().empty()) << "could not make the tiny model";
    state_ = MakeTempDir("qlora-service-");
  }
  void TearDown() override { fs::remove_all(state_); }
  std::string state_;
};

// With roots, the workers confine their own file accesses (Landlock) and a job still trains:
// the model, tokenizer and data are read beneath the read roots, the adapter and the merged
// model written beneath the job's output folder.
TEST_F(ServiceTest, JobsTrainWithWorkersConfinedToTheRoots) {
  CoordinatorProcess c(state_, 1,
                       absl::StrCat("--read-roots ", TinyModelDir(), ",", SourceDir(),
                                    "/examples --output-root ", state_));
  ASSERT_TRUE(c.started());
  std::string yaml = TinyJobYaml({.steps_per_checkpoint = 2});
  const std::string adapter = "adapter: {type: lora}";
  yaml.replace(yaml.find(adapter), adapter.size(),
               "adapter: {type: lora, postprocessor: {merge_adapter_into_base_model: true}}");
  v1::Job job = SubmitJob(c, yaml);
  ASSERT_FALSE(job.id().empty());
  job = c.WaitForState(job.id(), {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, 300);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.state_message();
  EXPECT_TRUE(fs::exists(job.adapter_path() + "/adapter_model.safetensors"));
  EXPECT_TRUE(fs::exists(job.merged_path() + "/config.json"));
  CommandResult logs = c.Ctl("logs " + job.id());
  const bool unsupported = logs.output.find("has no Landlock") != std::string::npos;
  if (!unsupported) EXPECT_THAT(logs.output, HasSubstr("file accesses confined: reads beneath"));
}

TEST_F(ServiceTest, CliAndClientJobsSucceedWithTwoCpuWorkersAndWatchShowsProgress) {
  CoordinatorProcess c(state_, 2);
  ASSERT_TRUE(c.started());
  const std::string job_file = WriteFile(state_ + "/job.yaml", ShortJob());
  CommandResult submit = c.Ctl(absl::StrCat("submit ", job_file, " --dataset ", TrainData()));
  ASSERT_EQ(submit.exit_code, 0) << submit.output;
  const std::string cli_id(submit.output.substr(0, submit.output.find('\n')));
  ASSERT_THAT(cli_id, ::testing::StartsWith("job-"));

  CommandResult watch = c.Ctl("watch " + cli_id);
  EXPECT_EQ(watch.exit_code, 0) << watch.output;
  EXPECT_THAT(watch.output, HasSubstr("step 4/4"));
  EXPECT_THAT(watch.output, HasSubstr("loss"));
  EXPECT_THAT(watch.output, HasSubstr("SUCCEEDED"));
  // -o json replays the whole history of a finished job, one JSON object per event.
  CommandResult history = c.Ctl("watch " + cli_id + " -o json");
  EXPECT_EQ(history.exit_code, 0) << history.output;
  EXPECT_GE(std::count(history.output.begin(), history.output.end(), '\n'), 5) << history.output;
  EXPECT_THAT(history.output, HasSubstr("JOB_STATE_QUEUED"));
  EXPECT_THAT(history.output, HasSubstr("JOB_STATE_SUCCEEDED"));
  // One line per optimizer step with both ranks' reports, integers as numbers.
  for (int step = 1; step <= 4; ++step) {
    const std::string line = absl::StrCat("{\"type\":\"step\",\"job\":\"", cli_id, "\",\"step\":", step, ",");
    size_t count = 0;
    for (size_t at = history.output.find(line); at != std::string::npos; at = history.output.find(line, at + 1)) ++count;
    EXPECT_EQ(count, 1u) << line << "\n" << history.output;
  }
  EXPECT_THAT(history.output, HasSubstr("\"rank\":1,"));
  // Piped, one line per optimizer step, though both ranks report every step.
  for (int step = 1; step <= 4; ++step) {
    const std::string line = absl::StrCat("RUNNING step ", step, "/4 ");
    size_t count = 0;
    for (size_t at = watch.output.find(line); at != std::string::npos; at = watch.output.find(line, at + 1)) ++count;
    EXPECT_LE(count, 1u) << line << " printed " << count << " times:\n" << watch.output;
  }
  v1::Job cli_job = c.GetJob(cli_id);
  EXPECT_EQ(cli_job.state(), v1::JOB_STATE_SUCCEEDED) << cli_job.state_message();
  EXPECT_EQ(cli_job.num_workers(), 2);
  EXPECT_TRUE(fs::exists(cli_job.adapter_path() + "/adapter_config.json")) << cli_job.adapter_path();
  EXPECT_TRUE(fs::exists(cli_job.adapter_path() + "/adapter_model.safetensors"));

  // Rank 0 wrote one metrics.jsonl line and one TensorBoard event per optimizer step, beside
  // the adapter; tensorboard itself reads the events.
  const std::string output = fs::path(cli_job.adapter_path()).parent_path();
  std::ifstream metrics(output + "/metrics.jsonl");
  std::vector<std::string> lines;
  for (std::string line; std::getline(metrics, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 4u) << output;
  EXPECT_THAT(lines[0], HasSubstr("\"step\":1"));
  EXPECT_THAT(lines[3], HasSubstr("\"step\":4"));
  EXPECT_THAT(lines[3], HasSubstr("\"loss\":"));
  if (const char* python = getenv("QLORA_PYTHON"); python != nullptr && *python != '\0') {
    CommandResult events = RunCommand(absl::StrCat(python, " ", SourceDir(), "/tests/common/read_events.py ",
                                                   output, "/runs"));
    ASSERT_EQ(events.exit_code, 0) << events.output;
    EXPECT_THAT(events.output, HasSubstr("\"train/loss\": [[1, "));
    EXPECT_THAT(events.output, HasSubstr("[4, "));
    EXPECT_THAT(events.output, HasSubstr("\"train/tokens_per_second\""));
    // The HParams tab: the job's keys with their values, the metrics, and the run's success.
    CommandResult hparams = RunCommand(absl::StrCat(python, " ", SourceDir(), "/tests/common/read_events.py ",
                                                    output, "/runs --hparams"));
    ASSERT_EQ(hparams.exit_code, 0) << hparams.output;
    EXPECT_THAT(hparams.output, HasSubstr("\"trainer.learning_rate\": 0.001")) << hparams.output;
    EXPECT_THAT(hparams.output, HasSubstr("\"workers\": 2.0")) << hparams.output;
    EXPECT_THAT(hparams.output, HasSubstr("\"metrics\": [\"train/loss\", \"eval/loss\"]")) << hparams.output;
    EXPECT_THAT(hparams.output, HasSubstr("\"end\": \"STATUS_SUCCESS\"")) << hparams.output;
  }

  v1::Job client_job = SubmitJob(c, ShortJob());
  ASSERT_FALSE(client_job.id().empty());
  client_job = c.WaitForState(client_job.id(), {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, 300);
  EXPECT_EQ(client_job.state(), v1::JOB_STATE_SUCCEEDED) << client_job.state_message();
  ASSERT_EQ(client_job.progress_size(), 2);
  EXPECT_EQ(client_job.progress(0).step(), 4);
  EXPECT_GT(client_job.progress(0).tokens_per_second(), 0);

  // Logs of both ranks are there and streamable.
  CommandResult logs = c.Ctl("logs " + client_job.id());
  EXPECT_EQ(logs.exit_code, 0);
  EXPECT_THAT(logs.output, HasSubstr("rank 0 |"));
  EXPECT_THAT(logs.output, HasSubstr("rank 1 |"));
}

// Issue 16: 214 records, one with a 20,000-character field, and one malformed line. Byte-range
// shards gave 2 workers 1 step per epoch where 1 worker trained 26; interleaved records give 2
// workers the one-worker record count to within one micro-batch per rank, and every record is
// accounted for (trained, left over, malformed, without a target) per rank in the progress, the
// end message and the log.
TEST_F(ServiceTest, SkewedRecordsTrainAsManyOnTwoWorkersAsOnOneAndAreAccountedFor) {
  std::string data;
  for (int i = 0; i < 214; ++i) {
    const std::string instruction = i == 100 ? std::string(20000, 'x') : absl::StrCat("Add ", i, " and 1.");
    absl::StrAppend(&data, "{\"instruction\": \"", instruction, "\", \"output\": \"", i + 1, "\"}\n");
  }
  data += "not json\n";
  const std::string dataset = WriteFile(state_ + "/skewed.jsonl", data);
  CoordinatorProcess c(state_, 2);
  ASSERT_TRUE(c.started());
  constexpr int kRows = 2;
  std::map<int, int64_t> trained;
  for (int workers : {1, 2}) {
    SCOPED_TRACE(absl::StrCat(workers, " workers"));
    std::string yaml = TinyJobYaml({.batch_size = 2, .gradient_accumulation_steps = 1, .epochs = 1,
                                    .train_steps = 0, .more_data = "malformed_records: skip"});
    const std::string backend = "  trainer:\n";
    yaml.replace(yaml.find(backend), backend.size(), absl::StrCat("  trainer:\n    num_workers: ", workers, "\n"));
    grpc::Status submitted;
    v1::Job job = SubmitJob(c, yaml, &submitted, dataset);
    ASSERT_TRUE(submitted.ok()) << submitted.error_message();
    job = c.WaitForState(job.id(), {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, 300);
    ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.state_message();
    ASSERT_EQ(job.progress_size(), workers);
    int64_t accounted = 0;
    for (const v1::Progress& p : job.progress()) {
      const v1::RecordReport& r = p.total_records();
      EXPECT_GE(r.trained(), 212 / workers - kRows) << "rank " << p.rank();
      trained[workers] += r.trained();
      accounted += r.trained() + r.left_over() + r.malformed() + r.without_target();
      // One epoch: the epoch's figures are the job's.
      EXPECT_EQ(p.epoch_records().trained(), r.trained());
      EXPECT_EQ(p.epoch_records().left_over(), r.left_over());
    }
    EXPECT_EQ(accounted, 215);
    EXPECT_THAT(job.state_message(), HasSubstr(absl::StrCat("records: ", trained[workers], " trained (rank 0: ")));
    EXPECT_THAT(job.state_message(), HasSubstr("1 malformed skipped, 1 without a target"));
    CommandResult logs = c.Ctl("logs " + job.id());
    EXPECT_THAT(logs.output, HasSubstr("epoch 0: trained "));
    CommandResult get = c.Ctl("get " + job.id());
    EXPECT_THAT(get.output, HasSubstr("records:     rank 0 epoch 0: "));
  }
  EXPECT_GE(trained[1], 212);
  EXPECT_LE(std::abs(trained[1] - trained[2]), 2 * kRows) << trained[1] << " on 1 worker, " << trained[2] << " on 2";
}

// A finished job's outputs, ready to serve, and its summary: the adapter with a model card, a PEFT
// adapter in every checkpoint (the LoRA weights gathered from the ZeRO-2 partitions of 2 ranks),
// the merged folder that transformers loads and generates with, and HF-like end-of-run figures
// in the job, its completion event and `qloractl get`.
TEST_F(ServiceTest, FinishedJobHasServableOutputsAndATrainSummary) {
  std::string yaml = TinyJobYaml({.steps_per_checkpoint = 2, .eval_steps = 2,
                                  .more_data = "validation_fraction: 0.25"});
  const std::string adapter = "adapter: {type: lora}";
  yaml.replace(yaml.find(adapter), adapter.size(),
               "adapter: {type: lora, postprocessor: {merge_adapter_into_base_model: true}}");
  CoordinatorProcess c(state_, 2);
  ASSERT_TRUE(c.started());
  v1::Job job = SubmitJob(c, yaml);
  ASSERT_FALSE(job.id().empty());
  job = c.WaitForState(job.id(), {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, 300);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.state_message();

  ASSERT_TRUE(job.has_summary());
  const v1::TrainSummary& s = job.summary();
  EXPECT_GT(s.train_runtime_seconds(), 0);
  EXPECT_TRUE(std::isfinite(s.train_loss()) && s.train_loss() > 0) << s.train_loss();
  EXPECT_TRUE(std::isfinite(s.final_train_loss())) << s.final_train_loss();
  EXPECT_EQ(s.steps(), 4);
  EXPECT_EQ(s.global_step(), 4);
  EXPECT_EQ(s.samples(), 4 * 2 * 2) << "batch 1 x accumulation 2 x 2 ranks per step";
  EXPECT_GT(s.tokens(), s.samples());
  EXPECT_GT(s.train_samples_per_second(), 0);
  EXPECT_NEAR(s.train_steps_per_second(), s.steps() / s.train_runtime_seconds(), 1e-9);
  EXPECT_GT(s.tokens_per_second(), 0);
  EXPECT_GT(s.peak_memory_bytes(), 1 << 20);
  EXPECT_TRUE(std::isfinite(s.eval_loss())) << s.eval_loss();
  EXPECT_LE(s.best_eval_loss(), s.eval_loss());

  EXPECT_EQ(job.merged_path(), job.output_dir() + "/merged");
  EXPECT_THAT(job.state_message(), HasSubstr("merged model written to " + job.merged_path()));
  EXPECT_THAT(job.state_message(), HasSubstr("train_runtime "));
  EXPECT_THAT(StoredEvents(state_, job.id()), HasSubstr("merged model written to "));
  CommandResult get = c.Ctl("get " + job.id());
  EXPECT_EQ(get.exit_code, 0) << get.output;
  EXPECT_THAT(get.output, HasSubstr("merged:      " + job.merged_path()));
  EXPECT_THAT(get.output, HasSubstr("summary:     train_runtime "));
  std::cout << get.output;
  CommandResult logs = c.Ctl("logs " + job.id());
  EXPECT_THAT(logs.output, HasSubstr("train_samples_per_second"));

  // The step-2 checkpoint: ZeRO shards and manifest for an exact resume, and a PEFT adapter.
  std::string checkpoint_adapter;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(job.output_dir() + "/checkpoints", ec)) {
    if (e.path().filename().string().rfind(job.id() + "-", 0) == 0) {
      EXPECT_TRUE(fs::exists(e.path() / "step-2/manifest.json"));
      checkpoint_adapter = (e.path() / "step-2/adapter").string();
    }
  }
  ASSERT_FALSE(checkpoint_adapter.empty()) << "no checkpoint folder";
  EXPECT_TRUE(fs::exists(checkpoint_adapter + "/adapter_config.json"));
  EXPECT_TRUE(fs::exists(job.adapter_path() + "/README.md"));

  const char* python = getenv("QLORA_PYTHON");
  if (python == nullptr || *python == '\0' || access(python, X_OK) != 0) {
    GTEST_SKIP() << "QLORA_PYTHON is not set: the peft and transformers checks did not run";
  }
  CommandResult peft = RunCommand(absl::StrCat(python, " ", SourceDir(), "/tests/service/peft_loads.py ",
                                               TinyModelDir(), " ", checkpoint_adapter, " 8 16"));
  EXPECT_EQ(peft.exit_code, 0) << peft.output;
  CommandResult served = RunCommand(absl::StrCat(python, " ", SourceDir(), "/tests/service/outputs_check.py ",
                                                 TinyModelDir(), " ", job.adapter_path(), " ", job.merged_path()));
  EXPECT_EQ(served.exit_code, 0) << served.output;
  std::cout << served.output;
}

// The original job file verbatim (only base_model points at the tiny model) with ZeRO stage 2 on
// 2 CPU workers: it trains its three epochs and writes a PEFT adapter that peft loads as is.
TEST_F(ServiceTest, OriginalJobFileTrainsUnderStage2AndItsAdapterLoadsInPeft) {
  const std::string yaml = OriginalJobYaml();
  ASSERT_FALSE(yaml.empty()) << "the original job file fixture changed";
  CoordinatorProcess c(state_, 2);
  ASSERT_TRUE(c.started());
  const std::string job_file = WriteFile(state_ + "/original.yaml", yaml);
  // 100 records: 3 epochs (the default) of about 12 steps (about 50 records per rank, 4
  // micro-batches per step).
  CommandResult submit = c.Ctl(absl::StrCat("submit ", job_file, " --dataset ", SourceDir(),
                                            "/examples/data/validation.jsonl --follow"));
  ASSERT_EQ(submit.exit_code, 0) << submit.output;
  const std::string id = submit.output.substr(0, submit.output.find('\n'));
  v1::Job job = c.GetJob(id);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.state_message();
  EXPECT_EQ(job.zero_stage(), 2);
  ASSERT_EQ(job.progress_size(), 2);
  EXPECT_EQ(job.progress(0).step(), job.progress(0).total_steps());
  EXPECT_GE(job.progress(0).total_steps(), 30);
  EXPECT_EQ(job.progress(0).total_steps() % 3, 0) << "three equal epochs";
  const char* python = getenv("QLORA_PYTHON");
  if (python == nullptr || *python == '\0' || access(python, X_OK) != 0) {
    GTEST_SKIP() << "QLORA_PYTHON is not set: the peft check did not run";
  }
  CommandResult peft = RunCommand(absl::StrCat(python, " ", SourceDir(), "/tests/service/peft_loads.py ",
                                               TinyModelDir(), " ", job.adapter_path(), " 8 16"));
  EXPECT_EQ(peft.exit_code, 0) << peft.output;
}

// Tiny Mistral (a window of 16, shorter than the 48-token rows) and Qwen2 (q/k/v biases, tied
// embeddings) folders train through the service like LLaMA ones, on 2 CPU workers, and their
// adapters load in peft on transformers' own Mistral and Qwen2 classes.
TEST_F(ServiceTest, MistralAndQwen2FoldersTrainAndTheirAdaptersLoadInPeft) {
  CoordinatorProcess c(state_, 2);
  ASSERT_TRUE(c.started());
  const char* python = getenv("QLORA_PYTHON");
  const struct {
    const char* model_type;
    const char* flags;
  } families[] = {{"mistral", "--sliding_window 16"}, {"qwen2", "--tie_embeddings --rope_theta 1000000"}};
  for (const auto& family : families) {
    SCOPED_TRACE(family.model_type);
    const std::string dir = absl::StrCat(state_, "/tiny-", family.model_type);
    CommandResult made = RunCommand(absl::StrCat(
        BinaryDir(), "/worker/engine/qlora-make-tiny-model ", dir, " --vocab 512 --model_type ",
        family.model_type, " ", family.flags, " && cp ", SourceDir(), "/examples/tokenizer/* ", dir));
    ASSERT_EQ(made.exit_code, 0) << made.output;
    std::string yaml = ShortJob();
    const std::string llama = "base_model: " + TinyModelDir();
    ASSERT_NE(yaml.find(llama), std::string::npos);
    yaml.replace(yaml.find(llama), llama.size(), "base_model: " + dir);
    v1::Job job = SubmitJob(c, yaml);
    job = c.WaitForState(job.id(), {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, 300);
    ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.state_message();
    EXPECT_EQ(job.progress(0).step(), 4);
    if (python == nullptr || *python == '\0' || access(python, X_OK) != 0) continue;
    CommandResult peft = RunCommand(absl::StrCat(python, " ", SourceDir(), "/tests/service/peft_loads.py ",
                                                 dir, " ", job.adapter_path(), " 8 16"));
    EXPECT_EQ(peft.exit_code, 0) << peft.output;
  }
}

std::map<std::string, std::vector<float>> ReadAdapter(const std::string& adapter_dir) {
  std::map<std::string, std::vector<float>> weights;
  auto file = safetensors::SafetensorsFile::Open(adapter_dir + "/adapter_model.safetensors");
  if (!file.ok()) return weights;
  for (const auto& [name, info] : (*file)->tensors()) {
    auto view = (*file)->Get(name);
    if (!view.ok() || view->dtype != safetensors::Dtype::kF32) continue;
    const float* data = reinterpret_cast<const float*>(view->data);
    weights[name].assign(data, data + view->nbytes / sizeof(float));
  }
  return weights;
}

// The same job under ZeRO stage 0, 1 and 2 on 2 and on 4 CPU workers (same data, same global
// batches) gives the same LoRA weights: only the partitioning of the optimizer state and the
// gradients differs, and the reductions add in the same order.
TEST_F(ServiceTest, StagesZeroOneTwoGiveTheSameAdapter) {
  for (int workers : {2, 4}) {
    SCOPED_TRACE(absl::StrCat(workers, " workers"));
    CoordinatorProcess c(absl::StrCat(state_, "/w", workers), workers);
    ASSERT_TRUE(c.started());
    std::vector<std::map<std::string, std::vector<float>>> adapters;
    for (int stage : {0, 1, 2}) {
      std::string yaml = ShortJob();
      const std::string from = "zero_optimization: {stage: 2}";
      yaml.replace(yaml.find(from), from.size(), absl::StrCat("zero_optimization: {stage: ", stage, "}"));
      v1::Job job = SubmitJob(c, yaml);
      job = c.WaitForState(job.id(), {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, 300);
      ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << "stage " << stage << ": " << job.state_message();
      EXPECT_EQ(job.zero_stage(), stage);
      EXPECT_EQ(job.num_workers(), workers);
      // What every worker ran, as its strategy reports it: the stage, and under stages 1-2 a
      // 1/workers share of the optimizer state (the flat buffer is padded to a multiple of
      // 2 x workers; stage 0 keeps all of it on every rank).
      ASSERT_EQ(job.progress_size(), workers);
      for (const v1::Progress& p : job.progress()) {
        const v1::StrategyReport& s = p.strategy();
        EXPECT_EQ(s.zero_stage(), stage) << "rank " << p.rank();
        EXPECT_EQ(s.world_size(), workers);
        ASSERT_GT(s.trainable_elements(), 0);
        const int64_t padded = (s.trainable_elements() + 2 * workers - 1) / (2 * workers) * (2 * workers);
        EXPECT_EQ(s.partition_elements(), stage == 0 ? padded : padded / workers);
        EXPECT_EQ(s.partitioned_optimizer(), stage >= 1);
        EXPECT_EQ(s.partitioned_gradients(), stage == 2);
      }
      adapters.push_back(ReadAdapter(job.adapter_path()));
    }
    ASSERT_FALSE(adapters[0].empty());
    for (int stage : {1, 2}) {
      ASSERT_EQ(adapters[stage].size(), adapters[0].size());
      double worst = 0;
      for (const auto& [name, ref] : adapters[0]) {
        const std::vector<float>& got = adapters[stage].at(name);
        ASSERT_EQ(got.size(), ref.size()) << name;
        for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::abs(double(got[i]) - ref[i]));
      }
      // Weights are O(0.1) after 4 AdamW steps of lr 1e-3; a reduction-order difference moves
      // them by ~1e-7, a wrong partition by ~1e-3 (one AdamW step).
      EXPECT_LT(worst, 1e-5) << "stage " << stage << " differs from stage 0";
      printf("%d workers, stage %d vs stage 0: max |difference| of the LoRA weights %.3g\n", workers, stage, worst);
    }
  }
}

// A coordinator killed mid-job: the restarted one queues the job again, its workers resume from
// the last complete checkpoint, and the final adapter is bit-identical to an uninterrupted run's
// (same data order, same dropout masks: generators are seeded per step).
TEST_F(ServiceTest, JobResumedAfterCoordinatorRestartEqualsUninterruptedRun) {
  std::string yaml =
      TinyJobYaml({.gradient_accumulation_steps = 1, .train_steps = 240, .steps_per_checkpoint = 40});
  const std::string adapter = "adapter: {type: lora}";
  yaml.replace(yaml.find(adapter), adapter.size(), "adapter: {type: lora, dropout: 0.1}");
  std::string resumed_id, first_address;
  {
    CoordinatorProcess c(state_, 2);
    ASSERT_TRUE(c.started());
    grpc::Status submitted;
    v1::Job job = SubmitJob(c, yaml, &submitted);
    ASSERT_TRUE(submitted.ok()) << submitted.error_message();
    resumed_id = job.id();
    // The job's checkpoints: <output>/checkpoints/<id>-<its uid>/step-N.
    auto first_checkpoint_written = [&] {
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(job.output_dir() + "/checkpoints", ec)) {
        if (e.path().filename().string().rfind(job.id() + "-", 0) == 0 &&
            fs::exists(e.path() / "step-40/manifest.json")) {
          return true;
        }
      }
      return false;
    };
    ASSERT_TRUE(WaitUntil(first_checkpoint_written, 120)) << "no checkpoint";
    ASSERT_NE(c.GetJob(resumed_id).state(), v1::JOB_STATE_SUCCEEDED) << "finished before the kill";
    first_address = c.address();
    c.Stop(SIGKILL);
  }
  EXPECT_TRUE(WaitUntil([&] { return WorkerPids(first_address, resumed_id).empty(); }, 10)) << "workers outlived the coordinator";
  CoordinatorProcess c(state_, 2);
  ASSERT_TRUE(c.started());
  v1::Job resumed = c.WaitForState(resumed_id, {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, 300);
  ASSERT_EQ(resumed.state(), v1::JOB_STATE_SUCCEEDED) << resumed.state_message();
  CommandResult logs = c.Ctl("logs " + resumed_id + " --rank 0");
  EXPECT_THAT(logs.output, HasSubstr("resumed from")) << logs.output;
  v1::Job fresh = SubmitJob(c, yaml);
  fresh = c.WaitForState(fresh.id(), {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, 300);
  ASSERT_EQ(fresh.state(), v1::JOB_STATE_SUCCEEDED) << fresh.state_message();
  const auto a = ReadAdapter(resumed.adapter_path()), b = ReadAdapter(fresh.adapter_path());
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a, b) << "the resumed run's adapter differs from the uninterrupted run's";
}

// `qloractl submit --resume-from JOB` continues a cancelled job from its newest checkpoint: the
// final adapter is bit-identical to an uninterrupted run's (adapters, AdamW state, step and data
// position restored). Another adapter shape is refused naming the key; another learning rate is
// accepted, the coordinator saying from which step it applies.
TEST_F(ServiceTest, CancelledJobContinuedWithResumeFromEqualsUninterruptedRun) {
  std::string yaml =
      TinyJobYaml({.gradient_accumulation_steps = 1, .train_steps = 240, .steps_per_checkpoint = 40});
  const std::string adapter = "adapter: {type: lora}";
  yaml.replace(yaml.find(adapter), adapter.size(), "adapter: {type: lora, dropout: 0.1}");
  CoordinatorProcess c(state_, 2);
  ASSERT_TRUE(c.started());
  v1::Job first = SubmitJob(c, yaml);
  auto checkpoint_written = [&] {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(first.output_dir() + "/checkpoints", ec)) {
      if (fs::exists(e.path() / "step-40/manifest.json")) return true;
    }
    return false;
  };
  ASSERT_TRUE(WaitUntil(checkpoint_written, 120)) << "no checkpoint";
  CommandResult cancel = c.Ctl("cancel " + first.id());
  ASSERT_EQ(cancel.exit_code, 0) << cancel.output;
  ASSERT_EQ(c.GetJob(first.id()).state(), v1::JOB_STATE_CANCELLED);

  CommandResult refused = c.Ctl("submit --resume-from " + first.id() + " adapter.r=16");
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_THAT(refused.output, HasSubstr("its checkpoint was trained with adapter.r 8 and this job has 16"));
  CommandResult changed = c.Ctl("submit --resume-from " + first.id() + " trainer.learning_rate=0.0005");
  ASSERT_EQ(changed.exit_code, 0) << changed.output;
  EXPECT_THAT(changed.output, HasSubstr("continues " + first.id() + " from step "));
  EXPECT_THAT(changed.output, HasSubstr(": trainer.learning_rate 0.001 -> 0.0005"));
  const std::string changed_id = changed.output.substr(0, changed.output.find('\n'));
  ASSERT_EQ(c.Ctl("cancel " + changed_id).exit_code, 0);

  CommandResult resumed_submit = c.Ctl("submit --resume-from " + first.id());
  ASSERT_EQ(resumed_submit.exit_code, 0) << resumed_submit.output;
  EXPECT_THAT(resumed_submit.output, HasSubstr("same job file"));
  const std::string resumed_id = resumed_submit.output.substr(0, resumed_submit.output.find('\n'));
  v1::Job resumed = c.WaitForState(resumed_id, {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, 300);
  ASSERT_EQ(resumed.state(), v1::JOB_STATE_SUCCEEDED) << resumed.state_message();
  EXPECT_THAT(c.Ctl("logs " + resumed_id + " --rank 0").output, HasSubstr("resumed from"));
  EXPECT_EQ(resumed.summary().global_step(), 240);
  EXPECT_LE(resumed.summary().steps(), 200) << "the continued run started over";
  v1::Job fresh = SubmitJob(c, yaml);
  fresh = c.WaitForState(fresh.id(), {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, 300);
  ASSERT_EQ(fresh.state(), v1::JOB_STATE_SUCCEEDED) << fresh.state_message();
  const auto a = ReadAdapter(resumed.adapter_path()), b = ReadAdapter(fresh.adapter_path());
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a, b) << "the continued run's adapter differs from the uninterrupted run's";
}

// Elastic: a 4-worker job with min_workers 2 whose coordinator comes back with 3 worker slots
// (one lost for good) goes on with 3: the checkpoint re-partitioned over 3 ranks, the global batch
// kept (gradient_accumulation_steps 3 -> 4), the steps and the loss curve continuing from the
// checkpoint (no reset), and the events saying so.
TEST_F(ServiceTest, ElasticJobGoesOnWithTheWorkersThatRemain) {
  // Long enough that a fast machine (32 cores) is still training when the coordinator is killed
  // right after the first checkpoint.
  std::string yaml =
      TinyJobYaml({.gradient_accumulation_steps = 3, .train_steps = 120, .steps_per_checkpoint = 10});
  const std::string backend = "  trainer:\n";
  yaml.replace(yaml.find(backend), backend.size(), "  trainer:\n    num_workers: 4\n    min_workers: 2\n");
  std::string id;
  double loss_before = 0;
  {
    CoordinatorProcess c(state_, 4);
    ASSERT_TRUE(c.started());
    grpc::Status submitted;
    v1::Job job = SubmitJob(c, yaml, &submitted);
    ASSERT_TRUE(submitted.ok()) << submitted.error_message();
    id = job.id();
    ASSERT_TRUE(WaitUntil([&] { return CheckpointWritten(job.output_dir(), 10); }, 180)) << "no checkpoint";
    v1::Job running = c.GetJob(id);
    ASSERT_NE(running.state(), v1::JOB_STATE_SUCCEEDED) << "finished before the kill";
    ASSERT_GT(running.progress_size(), 0);
    loss_before = running.progress(0).loss();
    c.Stop(SIGKILL);
  }
  CoordinatorProcess c(state_, 3);  // one worker slot fewer, for good
  ASSERT_TRUE(c.started());
  v1::Job done = c.WaitForState(id, {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, 300);
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.state_message();
  ASSERT_EQ(done.progress_size(), 3);
  for (const v1::Progress& p : done.progress()) {
    EXPECT_EQ(p.strategy().world_size(), 3) << "rank " << p.rank();
    EXPECT_EQ(p.step(), 120);
  }
  const std::string events = StoredEvents(state_, id);
  EXPECT_THAT(events, HasSubstr("ELASTIC_RESIZE: continuing on 3 of 4 workers (min_workers 2): "
                                "gradient_accumulation_steps 3 -> 4 keeps the global batch of 12 sequences"))
      << events;
  CommandResult logs = c.Ctl("logs " + id + " --rank 0");
  EXPECT_THAT(logs.output, HasSubstr("resumed from")) << logs.output;
  // The first step after the resume continues the curve: step 11 or later (the checkpoint was
  // at 10 or later), with a loss near the one before the kill (a reset would start at ~ln(vocab)).
  const size_t resized = events.find("ELASTIC_RESIZE");
  ASSERT_NE(resized, std::string::npos);
  const size_t progress = events.find("PROGRESS: ", resized);
  ASSERT_NE(progress, std::string::npos) << events;
  const size_t at = events.find(" @", progress);
  int64_t step = 0;
  double loss = 0;
  ASSERT_EQ(sscanf(events.c_str() + at, " @%ld %lf", &step, &loss), 2) << events.substr(progress, 80);
  EXPECT_GT(step, 10);
  EXPECT_LT(std::abs(loss - loss_before), 0.5 * loss_before) << "loss " << loss << " after the resume, "
                                                               << loss_before << " before the kill";
}

// Paths written in the job file are relative to where the user runs qloractl, not to the
// coordinator's working directory.
TEST_F(ServiceTest, RelativePathsInTheJobFileAreTheUsers) {
  CoordinatorProcess c(state_, 2);
  ASSERT_TRUE(c.started());
  const std::string user = MakeTempDir("qlora-user-");  // the user's folder, not the state folder
  fs::copy_file(SourceDir() + "/examples/data/validation.jsonl", user + "/data.jsonl");
  WriteFile(user + "/job.yaml", ShortJob() + "dataset: data.jsonl\noutput_dir: runs/first\n");
  CommandResult submit = RunCommand(absl::StrCat("cd ", user, " && ", BinaryDir(), "/cli/qloractl --address ",
                                                 c.address(), " submit job.yaml --follow"));
  ASSERT_EQ(submit.exit_code, 0) << submit.output;
  EXPECT_TRUE(fs::exists(user + "/runs/first/adapter/adapter_model.safetensors")) << submit.output;
  // The same folder again is another job's: refused at submit, the first job's files untouched.
  CommandResult again = RunCommand(absl::StrCat("cd ", user, " && ", BinaryDir(), "/cli/qloractl --address ",
                                                c.address(), " submit job.yaml"));
  EXPECT_NE(again.exit_code, 0) << again.output;
  EXPECT_THAT(again.output, HasSubstr("output_dir"));
  EXPECT_TRUE(fs::exists(user + "/runs/first/adapter/adapter_model.safetensors"));
  fs::remove_all(user);
}

TEST_F(ServiceTest, SecondJobWaitsQueuedWithReasonThenRuns) {
  CoordinatorProcess c(state_, 2);
  ASSERT_TRUE(c.started());
  v1::Job first = SubmitJob(c, LongJob());
  ASSERT_FALSE(first.id().empty());
  c.WaitForState(first.id(), {v1::JOB_STATE_RUNNING}, 120);
  v1::Job second = SubmitJob(c, ShortJob());
  ASSERT_FALSE(second.id().empty());
  second = c.WaitForState(second.id(), {v1::JOB_STATE_QUEUED}, 10);
  EXPECT_EQ(second.state(), v1::JOB_STATE_QUEUED);
  EXPECT_TRUE(WaitUntil([&] { return c.GetJob(second.id()).state_reason_code() == "WAITING_FOR_WORKERS"; }, 10));
  EXPECT_THAT(c.GetJob(second.id()).state_message(), HasSubstr(first.id()));
  CommandResult cancel = c.Ctl("cancel " + first.id());
  ASSERT_EQ(cancel.exit_code, 0) << cancel.output;
  second = c.WaitForState(second.id(), {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, 300);
  EXPECT_EQ(second.state(), v1::JOB_STATE_SUCCEEDED) << second.state_message();
}

TEST_F(ServiceTest, CancelStopsEveryWorker) {
  CoordinatorProcess c(state_, 2);
  ASSERT_TRUE(c.started());
  v1::Job job = SubmitJob(c, LongJob());
  job = c.WaitForState(job.id(), {v1::JOB_STATE_RUNNING}, 120);
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.state_message();
  ASSERT_TRUE(WaitUntil([&] { return WorkerPids(c.address(), job.id()).size() == 2; }, 10));
  const auto start = std::chrono::steady_clock::now();
  CommandResult cancel = c.Ctl("cancel " + job.id());
  ASSERT_EQ(cancel.exit_code, 0) << cancel.output;
  EXPECT_EQ(c.GetJob(job.id()).state(), v1::JOB_STATE_CANCELLED);
  EXPECT_TRUE(WaitUntil([&] { return WorkerPids(c.address(), job.id()).empty(); }, 10)) << "workers left after cancel";
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(c.Ctl("cancel " + job.id()).exit_code, 3) << "cancelling an ended job is refused";
}

// Watch and log streams each hold a server thread: past --max-streams a new one is refused with
// RESOURCE_EXHAUSTED, and a closed one frees its place.
TEST_F(ServiceTest, OpenStreamsAreCapped) {
  CoordinatorProcess c(state_, 1, "--max-streams 2");
  ASSERT_TRUE(c.started());
  v1::Job job = SubmitJob(c, LongJob());
  ASSERT_FALSE(job.id().empty());
  struct Stream {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReader<v1::WatchJobResponse>> reader;
  };
  auto open = [&](Stream& s) {
    v1::WatchJobRequest req;
    req.set_id(job.id());
    s.reader = c.jobs()->WatchJob(&s.ctx, req);
    v1::WatchJobResponse first;
    return s.reader->Read(&first);  // the first message is the current state
  };
  Stream a, b, refused;
  ASSERT_TRUE(open(a));
  ASSERT_TRUE(open(b));
  EXPECT_FALSE(open(refused));
  const grpc::Status status = refused.reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("limit is 2"));
  a.ctx.TryCancel();
  (void)a.reader->Finish();
  bool reopened = false;  // the server notices the cancel within its 0.5 s wait
  for (int i = 0; i < 50 && !reopened; ++i) {
    Stream again;
    reopened = open(again);
    if (reopened) again.ctx.TryCancel();
    (void)again.reader->Finish();
    if (!reopened) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(reopened) << "a closed stream did not free its place";
  b.ctx.TryCancel();
  (void)b.reader->Finish();
  ASSERT_EQ(c.Ctl("cancel " + job.id()).exit_code, 0);
}

// Without TLS or authentication, listening beyond loopback needs the operator's --insecure.
// One user cannot hold every watch and log stream (each holds a server thread) without the
// operator asking for it: by default a user's 33rd open stream is refused, naming the per-user
// limit, while the coordinator's total of 256 is far away (issue 58).
TEST_F(ServiceTest, OneUserCannotHoldEveryStreamByDefault) {
  CoordinatorProcess c(state_, 1);
  ASSERT_TRUE(c.started());
  v1::Job job = SubmitJob(c, LongJob());
  ASSERT_FALSE(job.id().empty());
  struct Stream {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReader<v1::WatchJobResponse>> reader;
  };
  std::vector<std::unique_ptr<Stream>> open;
  grpc::Status refused;
  for (int i = 0; i < 40; ++i) {
    auto s = std::make_unique<Stream>();
    v1::WatchJobRequest req;
    req.set_id(job.id());
    s->reader = c.jobs()->WatchJob(&s->ctx, req);
    v1::WatchJobResponse first;
    if (!s->reader->Read(&first)) {
      refused = s->reader->Finish();
      break;
    }
    open.push_back(std::move(s));
  }
  EXPECT_EQ(open.size(), 32u);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr("the limit per user (--max-streams-per-user)"));
  for (auto& s : open) {
    s->ctx.TryCancel();
    (void)s->reader->Finish();
  }
  ASSERT_EQ(c.Ctl("cancel " + job.id()).exit_code, 0);
}

TEST_F(ServiceTest, NonLoopbackAddressNeedsInsecure) {
  const CommandResult refused = RunCommand(absl::StrCat(
      "timeout 20 ", BinaryDir(), "/coordinator/qlora-coordinator --address 0.0.0.0:0 --state-dir ",
      state_, "/exposed --cpu-workers 1"));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_THAT(refused.output, HasSubstr("--insecure"));
  CoordinatorProcess c(state_, 1, "--address 0.0.0.0:0 --insecure");
  ASSERT_TRUE(c.started());
  EXPECT_EQ(c.Ctl("list").exit_code, 0);
}

// `qloractl list` with thousands of jobs and with job files of 1 MB each: pages come without the
// job files, so no response nears gRPC's 4 MB message limit.
TEST_F(ServiceTest, ListWorksWithTwoThousandJobsAndMegabyteJobFiles) {
  CoordinatorProcess c(state_, 1);
  ASSERT_TRUE(c.started());
  ASSERT_FALSE(SubmitJob(c, LongJob()).id().empty());  // holds the only worker
  const std::string padding = "# " + std::string(1000000, 'x') + "\n";
  for (int i = 0; i < 5; ++i) {
    grpc::Status s;
    ASSERT_FALSE(SubmitJob(c, padding + ShortJob(), &s).id().empty()) << s.error_message();
  }
  for (int i = 6; i < 2000; ++i) {
    grpc::Status s;
    ASSERT_FALSE(SubmitJob(c, ShortJob(), &s).id().empty()) << i << ": " << s.error_message();
  }
  const CommandResult list = c.Ctl("list");
  ASSERT_EQ(list.exit_code, 0) << list.output.substr(0, 2000);
  EXPECT_EQ(std::count(list.output.begin(), list.output.end(), '\n'), 2001) << "a header and 2000 rows";
  EXPECT_THAT(list.output, HasSubstr("job-002000"));
  // One page of the API: the default size, no job files unless asked.
  grpc::ClientContext ctx;
  v1::ListJobsRequest req;
  v1::ListJobsResponse resp;
  ASSERT_TRUE(c.jobs()->ListJobs(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.jobs_size(), 100);
  EXPECT_EQ(resp.next_page_token(), "job-000100");
  EXPECT_TRUE(resp.jobs(1).job_yaml().empty());
}

// A local user who reads a worker's command line (ps, /proc/PID/cmdline: world-readable) finds no
// startup token there; and even the token itself (in the worker's environment, readable by its
// owner alone) is useless once the worker has registered with it.
TEST_F(ServiceTest, AStolenStartupTokenIsUseless) {
  CoordinatorProcess c(state_, 2);
  ASSERT_TRUE(c.started());
  v1::Job job = SubmitJob(c, LongJob());
  job = c.WaitForState(job.id(), {v1::JOB_STATE_RUNNING}, 120);
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.state_message();
  std::vector<pid_t> pids;
  ASSERT_TRUE(WaitUntil([&] { return (pids = WorkerPids(c.address(), job.id())).size() == 2; }, 10));
  auto worker = v1::WorkerService::NewStub(c.channel());
  for (pid_t pid : pids) {
    const std::string proc = "/proc/" + std::to_string(pid);
    const std::string cmdline = ReadFile(proc + "/cmdline");
    const std::string environ = ReadFile(proc + "/environ");
    const std::string key = "QLORA_WORKER_TOKEN=";
    const size_t at = environ.find(key);
    ASSERT_NE(at, std::string::npos) << "the token is handed over in the environment";
    const std::string token = environ.substr(at + key.size(), environ.find('\0', at) - at - key.size());
    ASSERT_GE(token.size(), 16u);
    EXPECT_EQ(cmdline.find(token), std::string::npos) << "the token is in argv";
    struct stat st {};
    ASSERT_EQ(::stat((proc + "/environ").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0077, 0u) << "environ must be readable by its owner alone";
    const size_t rank_at = cmdline.find(std::string("--rank\0"));
    ASSERT_NE(rank_at, std::string::npos);
    const int rank = std::atoi(cmdline.c_str() + rank_at + 7);
    // Replaying it: a second Register is refused, and so is a token for another rank.
    for (int claimed : {rank, 1 - rank}) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      v1::RegisterRequest req;
      req.set_job_id(job.id());
      req.set_startup_token(token);
      req.set_rank(claimed);
      v1::RegisterResponse resp;
      const grpc::Status s = worker->Register(&ctx, req, &resp);
      EXPECT_FALSE(s.ok()) << "rank " << claimed << ": a replayed token registered";
      EXPECT_TRUE(s.error_code() == grpc::StatusCode::PERMISSION_DENIED ||
                  s.error_code() == grpc::StatusCode::INVALID_ARGUMENT)
          << s.error_code() << " " << s.error_message();
    }
  }
  EXPECT_EQ(c.GetJob(job.id()).state(), v1::JOB_STATE_RUNNING) << "the job goes on";
  ASSERT_EQ(c.Ctl("cancel " + job.id()).exit_code, 0);
}

// Sends `signal` to rank 1 of `job` (found by its command line); false when it was not found.
bool SignalRank1(CoordinatorProcess& c, const std::string& job_id, int signal) {
  std::vector<pid_t> pids;
  if (!WaitUntil([&] { return (pids = WorkerPids(c.address(), job_id)).size() >= 2; }, 10)) return false;
  for (pid_t p : pids) {
    std::string cmd = ReadFile("/proc/" + std::to_string(p) + "/cmdline");
    if (cmd.find(std::string("--rank") + '\0' + "1" + '\0') != std::string::npos) return kill(p, signal) == 0;
  }
  return false;
}

// The reason codes of every event of a finished job, oldest first.
std::vector<std::string> EventReasons(CoordinatorProcess& c, const std::string& id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::WatchJobRequest req;
  req.set_id(id);
  req.set_after_sequence(1);  // replays the history instead of starting from the current state
  auto reader = c.jobs()->WatchJob(&ctx, req);
  std::vector<std::string> reasons;
  v1::WatchJobResponse msg;
  while (reader->Read(&msg)) {
    if (!msg.event().reason_code().empty()) reasons.push_back(msg.event().reason_code());
  }
  reader->Finish();
  return reasons;
}

struct FaultCase {
  int workers;
  // SIGKILL: a crash; SIGSTOP: a hang, found by the heartbeat deadline; 0: rank 1 crashes just
  // before writing its part of the step-80 checkpoint (fault_injection.h), after rank 0 wrote
  // its part, so the step-40 checkpoint is the one resumed.
  int signal;
};

class ServiceRestartTest : public ServiceTest, public ::testing::WithParamInterface<FaultCase> {};

// A rank crashes (SIGKILL) or hangs (SIGSTOP) mid-run: the coordinator notices (its exit, or the
// heartbeat deadline), stops the others, starts a new generation after the backoff, every rank
// resumes from the last checkpoint, and the job ends with an adapter bit-identical to an
// uninterrupted run's. The restart and its cause are on the job and in its events.
TEST_P(ServiceRestartTest, FailedRankRestartsFromTheCheckpointAndEndsBitIdentical) {
  const FaultCase fault = GetParam();
  if (fault.signal == 0) {  // the coordinator's workers inherit its environment
    setenv("QLORA_TEST_CRASH_BEFORE_SAVE", (state_ + "/crash-marker").insert(0, "80:1:").c_str(), 1);
  }
  CoordinatorProcess c(state_, fault.workers, "--restart-backoff-s 0.5 --heartbeat-timeout-s 8");
  unsetenv("QLORA_TEST_CRASH_BEFORE_SAVE");
  ASSERT_TRUE(c.started());
  std::string yaml = TinyJobYaml(  // every one of the coordinator's workers
      {.gradient_accumulation_steps = 1, .train_steps = 100, .steps_per_checkpoint = 40});
  const std::string adapter = "adapter: {type: lora}";
  yaml.replace(yaml.find(adapter), adapter.size(), "adapter: {type: lora, dropout: 0.1}");
  grpc::Status submitted;
  v1::Job job = SubmitJob(c, yaml, &submitted);
  ASSERT_TRUE(submitted.ok()) << submitted.error_message();
  if (fault.signal != 0) {
    ASSERT_TRUE(WaitUntil([&] {
      const v1::Job now = c.GetJob(job.id());
      return now.progress_size() > 0 && now.progress(0).step() >= 45;
    }, 180)) << "no progress past the first checkpoint";
    ASSERT_TRUE(SignalRank1(c, job.id(), fault.signal));
  }
  job = c.WaitForState(job.id(), {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, 300);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.state_message();
  EXPECT_EQ(job.restarts(), 1);
  ASSERT_EQ(job.restart_causes_size(), 1);
  EXPECT_THAT(job.restart_causes(0), HasSubstr("rank 1"));
  EXPECT_THAT(EventReasons(c, job.id()), ::testing::Contains("RESTARTING"));
  const CommandResult logs = c.Ctl("logs " + job.id() + " --rank 0");
  EXPECT_THAT(logs.output, HasSubstr("resumed from")) << logs.output;
  if (fault.signal == 0) {
    EXPECT_THAT(job.restart_causes(0), HasSubstr("exit status 86"));
    EXPECT_THAT(logs.output, HasSubstr("step-40: ")) << "the half-written step-80 checkpoint was resumed";
  }
  const CommandResult got = c.Ctl("get " + job.id());
  EXPECT_THAT(got.output, HasSubstr("restarts:    1")) << got.output;

  v1::Job fresh = SubmitJob(c, yaml);
  fresh = c.WaitForState(fresh.id(), {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, 300);
  ASSERT_EQ(fresh.state(), v1::JOB_STATE_SUCCEEDED) << fresh.state_message();
  const auto restarted = ReadAdapter(job.adapter_path()), uninterrupted = ReadAdapter(fresh.adapter_path());
  ASSERT_FALSE(restarted.empty());
  EXPECT_EQ(restarted, uninterrupted) << "the restarted run's adapter differs from the uninterrupted run's";
}

INSTANTIATE_TEST_SUITE_P(Faults, ServiceRestartTest,
                         ::testing::Values(FaultCase{2, SIGKILL}, FaultCase{4, SIGKILL}, FaultCase{2, SIGSTOP},
                                           FaultCase{2, 0}),
                         [](const ::testing::TestParamInfo<FaultCase>& info) {
                           return absl::StrCat(info.param.workers, "Workers",
                                               info.param.signal == SIGKILL   ? "Killed"
                                               : info.param.signal == SIGSTOP ? "Hung"
                                                                              : "CrashedMidCheckpoint");
                         });

TEST_F(ServiceTest, KilledWorkerFailsJobNamingRankAndSignal) {
  CoordinatorProcess c(state_, 2, "--max-restarts 0");
  ASSERT_TRUE(c.started());
  v1::Job job = SubmitJob(c, LongJob());
  job = c.WaitForState(job.id(), {v1::JOB_STATE_RUNNING}, 120);
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  std::vector<pid_t> pids;
  ASSERT_TRUE(WaitUntil([&] { return (pids = WorkerPids(c.address(), job.id())).size() == 2; }, 10));
  // Kill rank 1: find it by its command line.
  pid_t victim = -1;
  for (pid_t p : pids) {
    std::string cmd = ReadFile("/proc/" + std::to_string(p) + "/cmdline");
    if (cmd.find(std::string("--rank") + '\0' + "1") != std::string::npos) victim = p;
  }
  ASSERT_GT(victim, 0);
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  job = c.WaitForState(job.id(), {v1::JOB_STATE_FAILED}, 30);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(job.state_reason_code(), "WORKER_EXITED");
  EXPECT_THAT(job.state_message(), HasSubstr("rank 1"));
  EXPECT_THAT(job.state_message(), HasSubstr("signal 9"));
  EXPECT_TRUE(WaitUntil([&] { return WorkerPids(c.address(), job.id()).empty(); }, 10)) << "workers left after a failure";
}

TEST_F(ServiceTest, RestartedCoordinatorListsSameJobsStatesAndHistory) {
  std::string before_list, before_history;
  std::string done_id, cancelled_id;
  {
    CoordinatorProcess c(state_, 2);
    ASSERT_TRUE(c.started());
    v1::Job done = SubmitJob(c, ShortJob());
    done = c.WaitForState(done.id(), {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, 300);
    ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.state_message();
    v1::Job cancelled = SubmitJob(c, LongJob());
    c.Ctl("cancel " + cancelled.id());
    done_id = done.id();
    cancelled_id = cancelled.id();
    before_list = c.Ctl("list").output;
    before_history = c.Ctl("watch " + done_id + " -o json").output;
    c.Stop(SIGKILL);  // no goodbye: only what is on disk survives
  }
  CoordinatorProcess c(state_, 2);
  ASSERT_TRUE(c.started());
  EXPECT_EQ(c.Ctl("list").output, before_list);
  EXPECT_EQ(c.GetJob(done_id).state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(c.GetJob(cancelled_id).state(), v1::JOB_STATE_CANCELLED);
  // The whole event history of the finished job, replayed from sequence 1, is the same.
  grpc::ClientContext ctx;
  v1::WatchJobRequest req;
  req.set_id(done_id);
  req.set_after_sequence(-1);
  auto reader = c.jobs()->WatchJob(&ctx, req);
  v1::WatchJobResponse msg;
  int events = 0;
  int64_t last = 0;
  while (reader->Read(&msg)) {
    EXPECT_GT(msg.event().sequence(), last);
    last = msg.event().sequence();
    ++events;
  }
  EXPECT_GT(events, 4);
  EXPECT_EQ(last, c.GetJob(done_id).last_sequence());
}

// An error about a hostile input reaches the client as itself: a job file with a 100,000-
// character key gave an error message past the client's metadata limit, so the client saw a
// transport error instead of INVALID_ARGUMENT (issue 58). The message is cut, saying so.
TEST_F(ServiceTest, AnErrorAboutAHugeInputReachesTheClientCut) {
  CoordinatorProcess c(state_, 1);
  ASSERT_TRUE(c.started());
  grpc::Status status;
  const v1::Job job = SubmitJob(c, ShortJob() + "? trainer_" + std::string(100000, 'k') + "\n: 1\n",
                                &status);
  EXPECT_TRUE(job.id().empty());
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message().size();
  EXPECT_THAT(status.error_message(), ::testing::StartsWith("job.yaml:14: trainer_kkkk"));
  EXPECT_THAT(status.error_message(), HasSubstr("more bytes of the message left out"));
  EXPECT_LT(status.error_message().size(), 2200u);
}

TEST_F(ServiceTest, BadJobFilesAreRefusedAndNothingIsStored) {
  // base_model names used by the fixtures resolve in this fake Hugging Face cache, so that
  // each file fails for the reason it was written for.
  const std::string hub = state_ + "/hub";
  for (const char* repo : {"models--org--model", "models--meta-llama--Llama-2-7b-hf"}) {
    fs::create_directories(hub + "/" + repo + "/snapshots/abc");
    std::ofstream(hub + "/" + repo + "/refs/main") << "abc";
    std::ofstream(hub + "/" + repo + "/snapshots/abc/config.json") << "{}";
  }
  fs::create_directories(hub + "/models--org--model/refs");
  std::ofstream(hub + "/models--org--model/refs/main") << "abc";
  setenv("HF_HUB_CACHE", hub.c_str(), 1);
  CoordinatorProcess c(state_ + "/coord", 2);
  ASSERT_TRUE(c.started());
  int files = 0;
  const std::string dir = SourceDir() + "/tests/assets/jobs/bad";
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string text = ReadFile(entry.path());
    std::string first_expect;
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("# expect: ", 0) == 0) {
        first_expect = line.substr(10);
        break;
      }
    }
    grpc::ClientContext ctx;
    v1::SubmitJobRequest req;
    req.set_job_yaml(text);
    req.set_source_name(entry.path().filename().string());
    req.set_dataset(TrainData());
    v1::SubmitJobResponse resp;
    grpc::Status s = c.jobs()->SubmitJob(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << entry.path() << ": " << s.error_message();
    if (!first_expect.empty()) EXPECT_THAT(s.error_message(), HasSubstr(first_expect)) << entry.path();
    CommandResult v = RunCommand(absl::StrCat("HF_HUB_CACHE=", hub, " ", BinaryDir(), "/cli/qloractl validate ",
                                              entry.path().string(), " --dataset ", TrainData()));
    EXPECT_NE(v.exit_code, 0) << entry.path();
    EXPECT_FALSE(v.output.empty()) << entry.path();
    ++files;
  }
  // A huge file too.
  {
    grpc::ClientContext ctx;
    v1::SubmitJobRequest req;
    req.set_job_yaml(std::string(2 << 20, '#'));  // over the 1 MiB job-file limit, under gRPC's 4 MiB
    v1::SubmitJobResponse resp;
    EXPECT_EQ(c.jobs()->SubmitJob(&ctx, req, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  unsetenv("HF_HUB_CACHE");
  EXPECT_GE(files, 25);
  grpc::ClientContext ctx;
  v1::ListJobsResponse list;
  ASSERT_TRUE(c.jobs()->ListJobs(&ctx, v1::ListJobsRequest(), &list).ok());
  EXPECT_EQ(list.jobs_size(), 0) << "a refused job was stored";
}

TEST_F(ServiceTest, MissingDatasetIsNotFoundAndUnknownJobIsNotFound) {
  CoordinatorProcess c(state_, 2);
  ASSERT_TRUE(c.started());
  grpc::ClientContext ctx;
  v1::SubmitJobRequest req;
  req.set_job_yaml(ShortJob());
  req.set_dataset(state_ + "/no-such-file.jsonl");
  v1::SubmitJobResponse resp;
  grpc::Status s = c.jobs()->SubmitJob(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("no-such-file.jsonl"));
  EXPECT_EQ(c.Ctl("get job-999999").exit_code, 4);
}

// A column the job names that its records lack is refused at submit (and by validate --remote),
// naming the file, the record's line and the nearest column, before any worker starts; nothing
// is stored.
TEST_F(ServiceTest, AMisspelledColumnIsRefusedAtSubmitNamingTheRecord) {
  CoordinatorProcess c(state_, 2);
  ASSERT_TRUE(c.started());
  std::string yaml = OriginalJobYaml();
  const std::string feature = "name: instruction";
  yaml.replace(yaml.find(feature), feature.size(), "name: instrucion");
  const std::string file = state_ + "/typo.yaml";
  std::ofstream(file) << yaml;
  const std::string data = " --dataset " + SourceDir() + "/examples/data/train.jsonl";
  for (const std::string& command : {"submit " + file + data, "validate --remote " + file + data}) {
    CommandResult refused = c.Ctl(command);
    EXPECT_EQ(refused.exit_code, 3) << refused.output;
    EXPECT_THAT(refused.output, HasSubstr(":1: missing column 'instrucion'; did you mean 'instruction'?"))
        << refused.output;
  }
  EXPECT_THAT(c.Ctl("list").output, Not(HasSubstr("job-000001")));
  // The good file: the coordinator resolves it, and with the files here the sample is shown.
  const std::string good = state_ + "/good.yaml";
  std::ofstream(good) << OriginalJobYaml();
  CommandResult valid = c.Ctl("validate --remote " + good + data);
  EXPECT_EQ(valid.exit_code, 0) << valid.output;
  EXPECT_THAT(valid.output, HasSubstr("# sample: 200 record(s) read")) << valid.output;
  EXPECT_THAT(valid.output, HasSubstr("trained, shown between [[ and ]]")) << valid.output;
}

TEST_F(ServiceTest, HealthServingWhileUpAndNotServingDuringShutdown) {
  CoordinatorProcess c(state_, 1, "--shutdown-grace-ms 3000");
  ASSERT_TRUE(c.started());
  auto check = [&] { return HealthOf(c); };
  EXPECT_EQ(check(), grpc::health::v1::HealthCheckResponse::SERVING);
  kill(c.pid(), SIGTERM);
  EXPECT_TRUE(WaitUntil([&] { return check() == grpc::health::v1::HealthCheckResponse::NOT_SERVING; }, 2.5));
}

// Two coordinators on one state folder would number jobs from one store and lose records: the
// second refuses to start, naming the folder and the pid that holds it; the first goes on.
TEST_F(ServiceTest, SecondCoordinatorOnTheSameStateFolderExitsNamingTheHolder) {
  CoordinatorProcess first(state_, 1);
  ASSERT_TRUE(first.started());
  const auto begin = std::chrono::steady_clock::now();
  CommandResult second = RunCommand(absl::StrCat(
      "timeout 20 ", BinaryDir(), "/coordinator/qlora-coordinator --address 127.0.0.1:0 --state-dir ",
      state_, " --cpu-workers 1"));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  EXPECT_NE(second.exit_code, 0) << second.output;
  EXPECT_NE(second.exit_code, 124) << "the second coordinator was still running after 20 s";
  EXPECT_LT(seconds, 5);
  EXPECT_THAT(second.output, HasSubstr(absl::StrCat("pid ", first.pid())));
  EXPECT_THAT(second.output, HasSubstr(state_));

  EXPECT_EQ(HealthOf(first), grpc::health::v1::HealthCheckResponse::SERVING);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ListJobsResponse list;
  EXPECT_TRUE(first.jobs()->ListJobs(&ctx, v1::ListJobsRequest(), &list).ok());
  EXPECT_EQ(first.Ctl("get job-000001").exit_code, 4);  // it answers; no job was made
}

// A FIFO as dataset froze the whole coordinator: the scheduler blocked in open() while holding
// the job manager's lock, every RPC timed out and health still said SERVING. It is refused at
// submit, at once, and the coordinator keeps answering.
TEST_F(ServiceTest, FifoAsDatasetIsRefusedAtOnceAndTheCoordinatorKeepsAnswering) {
  CoordinatorProcess c(state_, 1);
  ASSERT_TRUE(c.started());
  const std::string fifo = state_ + "/pipe.jsonl";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  auto within = [](double seconds) {
    return std::chrono::system_clock::now() + std::chrono::milliseconds(static_cast<int>(seconds * 1000));
  };
  grpc::ClientContext submit_ctx;
  submit_ctx.set_deadline(within(1));
  v1::SubmitJobRequest req;
  req.set_job_yaml(ShortJob());
  req.set_dataset(fifo);
  v1::SubmitJobResponse resp;
  grpc::Status s = c.jobs()->SubmitJob(&submit_ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("dataset: '" + fifo + "' is a FIFO (named pipe), not a regular file"));

  for (int i = 0; i < 3; ++i) {  // the monitor's passes come and go; every call stays fast
    grpc::ClientContext list_ctx;
    list_ctx.set_deadline(within(1));
    v1::ListJobsResponse list;
    grpc::Status listed = c.jobs()->ListJobs(&list_ctx, v1::ListJobsRequest(), &list);
    EXPECT_TRUE(listed.ok()) << listed.error_message();
    EXPECT_EQ(list.jobs_size(), 0);
    grpc::ClientContext get_ctx;
    get_ctx.set_deadline(within(1));
    v1::GetJobRequest get;
    get.set_id("job-000001");
    v1::Job job;
    EXPECT_EQ(c.jobs()->GetJob(&get_ctx, get, &job).error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(HealthOf(c, 1), grpc::health::v1::HealthCheckResponse::SERVING);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // A coordinator stuck in open() on the FIFO could not stop: a writer would release it.
  const int writer = open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
  if (writer >= 0) close(writer);
}


// The state folder is private (issue 58: it was 0755, its files 0644, so any local user read
// every user's job files, logs and adapters): the folder, the store, a job's log and its adapter
// belong to the coordinator's user alone, and another local user (uid 65534, when the test runs
// as root) can open none of them.
TEST_F(ServiceTest, StateIsPrivateToTheCoordinatorsUser) {
  const std::string state = state_ + "/private";
  CoordinatorProcess c(state, 2);
  ASSERT_TRUE(c.started());
  const v1::Job submitted = SubmitJob(c, ShortJob());
  const v1::Job done =
      c.WaitForState(submitted.id(), {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED}, 300);
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.state_message();
  // (The harness makes the state folder itself, for its port file; everything below is the
  // coordinator's and its workers'.)
  const std::string job_dir = state + "/jobs/" + done.id();
  const std::vector<std::string> paths = {
      state + "/jobs", job_dir, state + "/jobs.sqlite", job_dir + "/logs/rank-0.log",
      done.adapter_path(), done.adapter_path() + "/adapter_model.safetensors"};
  for (const std::string& path : paths) {
    struct stat st {};
    ASSERT_EQ(stat(path.c_str(), &st), 0) << path;
    EXPECT_EQ(st.st_mode & 077, 0u) << path << " has mode " << std::oct << (st.st_mode & 0777);
  }
  if (geteuid() != 0) return;  // the second user's attempt needs root to become one
  for (const std::string& path : paths) {
    const pid_t child = fork();
    if (child == 0) {  // only async-signal-safe calls: the parent has threads
      if (setgid(65534) != 0 || setuid(65534) != 0) _exit(2);
      const int fd = open(path.c_str(), O_RDONLY);
      _exit(fd >= 0 ? 1 : errno == EACCES ? 0 : 3);
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "uid 65534 opened " << path << " (exit " << WEXITSTATUS(status) << ")";
  }
}

// A state folder that others can read (made by an older version, or by hand) is named at start
// in a warning with the command that makes it private; a mask that lets every user in is refused.
TEST_F(ServiceTest, AStateFolderOthersCanReadIsNamedInAWarning) {
  const std::string state = state_ + "/shared";
  ASSERT_EQ(mkdir(state.c_str(), 0755), 0);
  ASSERT_EQ(chmod(state.c_str(), 0755), 0);
  const std::string coordinator = BinaryDir() + "/coordinator/qlora-coordinator";
  CommandResult warned = RunCommand(absl::StrCat("timeout 3 ", coordinator,
                                                 " --address 127.0.0.1:0 --cpu-workers 1 --state-dir ",
                                                 state));
  EXPECT_THAT(warned.output, HasSubstr("WARNING: the state folder " + state + " has mode 0755"));
  EXPECT_THAT(warned.output, HasSubstr("chmod -R go-rwx " + state));
  CommandResult refused = RunCommand(absl::StrCat(coordinator, " --address 127.0.0.1:0 ",
                                                  "--cpu-workers 1 --state-umask 022 --state-dir ",
                                                  state));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_THAT(refused.output, HasSubstr("lets every local user reach the state folder"));
}

}  // namespace
}  // namespace qlora::testing
