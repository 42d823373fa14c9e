// The trainer's phases one by one: the JobConfig -> options mapping, the step planner over
// epochs (with replay for resume), checkpoint discovery, and a world-1 Trainer driven phase by
// phase, whose resumed run must end bit-identical to an uninterrupted one.
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/config/job_config_parser.h"
#include "common/dataset/shard_planner.h"
#include "common/posix_files.h"
#include "tests/engine/test_util.h"
#include "tests/engine/torch_test_util.h"
#include "tests/zero/gloo_world.h"
#include "worker/comm/in_memory_store.h"
#include "worker/engine/tiny_model.h"
#include "worker/memory/base_weight_plan.h"
#include "tests/run/tiny_model_dir.h"
#include "common/checkpoint_dirs.h"
#include "worker/run/run_options.h"
#include "worker/run/step_batches.h"
#include "worker/run/step_profiler.h"
#include "worker/run/trainer.h"
#include "worker/run/training_observer.h"

namespace qlora::worker {
namespace {

TEST(TrainerOptions, JobConfigBecomesEngineStrategyAndScheduleOptions) {
  JobConfig c;
  c.quantization.quant_type = QuantType::kFP4;
  c.quantization.compute_dtype = ComputeDtype::kFloat16;
  c.quantization.blocksize = 128;
  c.lora.r = 16;
  c.lora.alpha = 32;
  c.trainer.seed = 9;
  c.trainer.beta2 = 0.95;
  c.trainer.weight_decay = 0.1;
  c.trainer.max_grad_norm = 0.7;
  c.trainer.lr_scheduler = LrScheduler::kLinear;
  c.trainer.warmup_fraction = 0.1;
  c.backend.strategy.reduce_bucket_size = 1234;
  c.backend.strategy.offload_optimizer = true;
  c.backend.strategy.offload_optimizer_pin_memory = false;
  const engine::LoadOptions load = LoadOptionsFor(c, at::Device(at::kCPU));
  EXPECT_EQ(load.quant_type, kernels::QuantType::kFP4);
  EXPECT_EQ(load.blocksize, 128);
  EXPECT_EQ(load.compute_dtype, at::kFloat);  // fp16 on a CPU runs in fp32
  EXPECT_EQ(ComputeScalarType(ComputeDtype::kFloat16, at::Device(at::kCUDA, 0)), at::kHalf);
  EXPECT_EQ(ComputeScalarType(ComputeDtype::kBFloat16, at::Device(at::kCPU)), at::kBFloat16);
  // peft finds the base from any folder: the hub id where it came from the hub cache, else the
  // resolved absolute folder, never a path relative to where the job was submitted.
  JobConfig named = c;
  named.base_model = "models/llama";
  named.base_model_path = "/data/models/llama";
  EXPECT_EQ(AdapterBaseModelName(named), "/data/models/llama");
  named.base_model = "meta-llama/Llama-2-7b-hf";
  named.base_model_path = "/home/u/.cache/huggingface/hub/models--meta-llama--Llama-2-7b-hf/snapshots/01c7f73d";
  EXPECT_EQ(AdapterBaseModelName(named), "meta-llama/Llama-2-7b-hf");
  const engine::LoraOptions lora = LoraOptionsFor(c);
  EXPECT_EQ(lora.r, 16);
  EXPECT_EQ(lora.alpha, 32);
  EXPECT_EQ(lora.seed, 9u);
  const strategy::StrategyOptions s = StrategyOptionsFor(c);
  EXPECT_EQ(s.adamw.beta2, 0.95);
  EXPECT_EQ(s.adamw.weight_decay, 0.1);
  EXPECT_EQ(s.max_grad_norm, 0.7);
  EXPECT_EQ(s.bucket_elements, 1234);
  EXPECT_TRUE(s.adamw_moments.in_host);
  EXPECT_FALSE(s.adamw_moments.pinned);
  EXPECT_FALSE(StrategyOptionsFor(JobConfig{}).adamw_moments.in_host);
  const optim::LrScheduleOptions schedule = LrScheduleFor(c, 25);
  EXPECT_EQ(schedule.kind, LrScheduler::kLinear);
  EXPECT_EQ(schedule.warmup_steps, 3);  // ceil(0.1 x 25)
  EXPECT_EQ(schedule.total_steps, 25);
}

// Micro-batches numbered in order; epoch e has counts[e] of them; ids hold (epoch, index).
class CountingSource final : public MicroBatchSource {
 public:
  explicit CountingSource(std::vector<int64_t> counts) : counts_(std::move(counts)) {}
  absl::Status Restart(int epoch) override {
    epoch_ = epoch;
    next_ = 0;
    return absl::OkStatus();
  }
  absl::StatusOr<std::optional<DeviceBatch>> Next() override {
    if (next_ == counts_[epoch_]) return std::optional<DeviceBatch>();
    DeviceBatch b;
    b.input_ids = at::tensor({static_cast<int64_t>(epoch_), next_++}).reshape({1, 2});
    return std::optional<DeviceBatch>(std::move(b));
  }
  absl::StatusOr<data::EpochCount> CountMicroBatches(int epoch) override {
    data::EpochCount count;
    count.micro_batches = counts_[epoch];
    return count;
  }

 private:
  std::vector<int64_t> counts_;
  int epoch_ = 0;
  int64_t next_ = 0;
};

std::vector<std::pair<int64_t, int64_t>> Ids(const std::vector<DeviceBatch>& batches) {
  std::vector<std::pair<int64_t, int64_t>> ids;
  for (const DeviceBatch& b : batches) ids.emplace_back(b.input_ids[0][0].item<int64_t>(), b.input_ids[0][1].item<int64_t>());
  return ids;
}

TEST(TrainerStepBatches, EpochsOfWholeStepsAndAnExactReplay) {
  auto results = testing::RunGlooWorld(1, [](int, comm::Communicator& comm) -> absl::Status {
    CountingSource source({5, 4, 6});  // accumulation 2: 2, 2 and 3 steps; the 5th of epoch 0 is left
    auto steps = StepBatches::Start(&source, &comm, at::Device(at::kCPU), 2, 1);
    if (!steps.ok()) return steps.status();
    EXPECT_EQ(steps->steps_per_first_epoch(), 2);
    std::vector<std::vector<std::pair<int64_t, int64_t>>> seen;
    for (int i = 0; i < 7; ++i) {
      auto batches = steps->Next();
      if (!batches.ok()) return batches.status();
      seen.push_back(Ids(*batches));
    }
    using P = std::vector<std::pair<int64_t, int64_t>>;
    EXPECT_EQ(seen[0], (P{{0, 0}, {0, 1}}));
    EXPECT_EQ(seen[1], (P{{0, 2}, {0, 3}}));
    EXPECT_EQ(seen[2], (P{{1, 0}, {1, 1}}));  // epoch 1 starts; micro-batch (0, 4) was left
    EXPECT_EQ(seen[4], (P{{2, 0}, {2, 1}}));
    EXPECT_EQ(steps->epoch(), 2);
    // A resumed run skips 5 steps and then sees what the uninterrupted run saw at step 6.
    CountingSource again({5, 4, 6});
    auto replay = StepBatches::Start(&again, &comm, at::Device(at::kCPU), 2, 1);
    if (!replay.ok()) return replay.status();
    EXPECT_TRUE(replay->Skip(5).ok());
    auto sixth = replay->Next();
    if (!sixth.ok()) return sixth.status();
    EXPECT_EQ(Ids(*sixth), seen[5]);
    return absl::OkStatus();
  });
  EXPECT_TRUE(results[0].ok()) << results[0];
}

TEST(TrainerStepBatches, TooLittleDataForOneStepIsAClearError) {
  auto results = testing::RunGlooWorld(1, [](int, comm::Communicator& comm) -> absl::Status {
    CountingSource source({1});
    return StepBatches::Start(&source, &comm, at::Device(at::kCPU), 4, 8).status();
  });
  EXPECT_EQ(results[0].code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(results[0].message().find("gradient_accumulation_steps"), std::string::npos) << results[0];
}

TEST(TrainerCheckpointDirs, TheNewestCompleteCheckpointIsResumed) {
  testing::TempDir tmp;
  const std::string dir = CheckpointsDir(tmp.path(), "job-000007", "");
  EXPECT_EQ(dir, tmp.path() + "/checkpoints/job-000007");
  EXPECT_EQ(LatestCheckpoint(dir), "");  // no folder yet
  for (int step : {4, 12, 20}) ASSERT_TRUE(MakeDirs(CheckpointDir(dir, step)).ok());
  ASSERT_TRUE(MakeDirs(dir + "/step-30x").ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/step-30x/manifest.json", "{}").ok());
  ASSERT_TRUE(WriteFileAtomically(CheckpointDir(dir, 4) + "/manifest.json", "{}").ok());
  ASSERT_TRUE(WriteFileAtomically(CheckpointDir(dir, 12) + "/manifest.json", "{}").ok());
  // step-20 has no manifest (a save that did not finish): step-12 is the newest complete one.
  EXPECT_EQ(LatestCheckpoint(dir), CheckpointDir(dir, 12));
}

TEST(TrainerCheckpointDirs, PruningKeepsTheNewestCompleteOnesAndDropsStaleHalves) {
  testing::TempDir tmp;
  const std::string dir = CheckpointsDir(tmp.path(), "job-000001", "u");
  for (int step : {10, 20, 30, 40, 50}) ASSERT_TRUE(MakeDirs(CheckpointDir(dir, step)).ok());
  for (int step : {10, 30, 40}) {
    ASSERT_TRUE(WriteFileAtomically(CheckpointDir(dir, step) + "/manifest.json", "{}").ok());
  }
  ASSERT_TRUE(WriteFileAtomically(CheckpointDir(dir, 20) + "/rank-0.safetensors", "x").ok());
  // 20: a half save older than the newest complete one (40); 50: a save in progress.
  ASSERT_TRUE(PruneCheckpoints(dir, 2).ok());
  EXPECT_FALSE(PathExists(CheckpointDir(dir, 10)));
  EXPECT_FALSE(PathExists(CheckpointDir(dir, 20)));
  EXPECT_TRUE(PathExists(CheckpointDir(dir, 30)));
  EXPECT_TRUE(PathExists(CheckpointDir(dir, 40)));
  EXPECT_TRUE(PathExists(CheckpointDir(dir, 50)));
  EXPECT_EQ(LatestCheckpoint(dir), CheckpointDir(dir, 40));
  ASSERT_TRUE(PruneCheckpoints(dir, 0).ok());  // 0 keeps every complete one
  EXPECT_TRUE(PathExists(CheckpointDir(dir, 30)));
}

TEST(TrainerCheckpointDirs, AnotherJobWithTheSameIdNeverFindsTheCheckpoints) {
  testing::TempDir tmp;
  const std::string mine = CheckpointsDir(tmp.path(), "job-000001", "0123456789abcdef0123456789abcdef");
  EXPECT_EQ(mine, tmp.path() + "/checkpoints/job-000001-0123456789abcdef0123456789abcdef");
  ASSERT_TRUE(MakeDirs(CheckpointDir(mine, 250)).ok());
  ASSERT_TRUE(WriteFileAtomically(CheckpointDir(mine, 250) + "/manifest.json", "{}").ok());
  // A job numbered job-000001 again (its store was lost) has another uid: nothing to resume.
  EXPECT_EQ(LatestCheckpoint(CheckpointsDir(tmp.path(), "job-000001", "fedcba9876543210fedcba9876543210")), "");
  EXPECT_EQ(LatestCheckpoint(CheckpointsDir(tmp.path(), "job-000001", "")), "");
  EXPECT_EQ(LatestCheckpoint(mine), CheckpointDir(mine, 250));
}

// A world-1 run of the tiny model, driven phase by phase.
class TrainerPhases : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::Status made = testing::MakeTinyModelWithExampleTokenizer(tmp_ / "model");
    ASSERT_TRUE(made.ok()) << made;
    const std::string source = testing::SourceDir();
    const std::string yaml = "base_model: " + tmp_ / "model" +
        "\ninput_features: [{name: instruction}]\noutput_features: [{name: output}]\n"
        "adapter: {type: lora, r: 4, dropout: 0.1}\nquantization: null\n"
        "trainer: {batch_size: 2, gradient_accumulation_steps: 2, train_steps: 6, "
        "steps_per_checkpoint: 3, learning_rate: 0.01}\n"
        "dataset: " + source + "/examples/data/validation.jsonl\ndata: {max_sequence_length: 48}\n";
    auto config = ParseJobConfig(yaml, {});
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    data::ShardPlanOptions plan;
    plan.chunk_bytes = 1024;  // several chunks: a shuffled order to replay
    auto shards = data::PlanShards({config_.data.train_path}, 1, plan);
    ASSERT_TRUE(shards.ok());
    shards_ = (*shards)[0];
  }

  TrainingContext Context(const std::string& output_dir) {
    TrainingContext c;
    c.config = config_;
    c.assignment.job_id = "job-phases";
    c.assignment.device = DeviceKind::kCpu;
    c.assignment.train_shards = shards_;
    c.assignment.output_dir = output_dir;
    c.store = &store_;
    return c;
  }

  testing::TempDir tmp_;
  JobConfig config_;
  std::vector<data::ShardSpec> shards_;
  comm::InMemoryRendezvousStore store_;
};

TEST_F(TrainerPhases, StepsReportLossAndStrategyThenAResumedRunEndsBitIdentical) {
  // Uninterrupted: phase by phase.
  TrainingContext context = Context(tmp_ / "whole");
  context.assignment.generation = 1;
  auto trainer = Trainer::Create(context);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  EXPECT_EQ((*trainer)->total_steps(), 6);
  EXPECT_EQ((*trainer)->strategy().Describe().stage, 2);  // the parser's default
  auto start = (*trainer)->Resume();
  ASSERT_TRUE(start.ok());
  EXPECT_EQ(*start, 0);
  std::vector<ProgressSnapshot> reports;
  context.report_progress = [&](const ProgressSnapshot& p) { reports.push_back(p); };
  for (int64_t step = 0; step < 6; ++step) {
    auto result = (*trainer)->Step(step);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->step, step + 1);
    EXPECT_TRUE(std::isfinite(result->loss) && result->loss > 0);
    EXPECT_GT(result->global_loss_units, 0);
    ASSERT_TRUE((*trainer)->After(*result).ok());
  }
  ASSERT_EQ(reports.size(), 6u);
  EXPECT_EQ(reports.back().strategy.zero_stage, 2);
  EXPECT_EQ(reports.back().strategy.world_size, 1);
  EXPECT_GT(reports.back().strategy.trainable_elements, 0);
  auto whole = (*trainer)->Finish();
  ASSERT_TRUE(whole.ok()) << whole.status();
  // The checkpoint at step 3 was written (step 6 is the end: no checkpoint there).
  EXPECT_EQ(LatestCheckpoint(CheckpointsDir(tmp_ / "whole", "job-phases", "")),
            CheckpointDir(CheckpointsDir(tmp_ / "whole", "job-phases", ""), 3));

  // Resumed: a fresh trainer on the same output folder starts at step 3 and ends the same.
  TrainingContext again = Context(tmp_ / "whole");
  again.assignment.generation = 2;
  auto resumed = Trainer::Create(again);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  auto from = (*resumed)->Resume();
  ASSERT_TRUE(from.ok()) << from.status();
  EXPECT_EQ(*from, 3);
  const auto first = testing::LoadTensors(tmp_ / "whole/adapter/adapter_model.safetensors");
  for (int64_t step = *from; step < 6; ++step) {
    auto result = (*resumed)->Step(step);
    ASSERT_TRUE(result.ok()) << result.status();
    ASSERT_TRUE((*resumed)->After(*result).ok());
  }
  ASSERT_TRUE((*resumed)->Finish().ok());
  const auto second = testing::LoadTensors(tmp_ / "whole/adapter/adapter_model.safetensors");
  ASSERT_EQ(first.size(), second.size());
  ASSERT_FALSE(first.empty());
  for (const auto& [name, tensor] : first) {
    EXPECT_TRUE(at::equal(tensor, second.at(name))) << name;
  }
}

// Records when each step's work starts being queued (its first micro-batch) and when each step
// is reported (After's progress report).
class QueueOrder final : public TrainingObserver {
 public:
  void OnMicroBatch(int64_t step, int index, const DeviceBatch&) override {
    if (index == 0) events.push_back(absl::StrCat("queue ", step + 1));
  }
  std::vector<std::string> events;
};

// Run() reads and reports a step once the next one is queued, except where After needs the
// model as that step left it (the checkpoint at 3 and 6), at the last step, and in the first two
// steps (the memory plans); and it reports, checkpoints and ends exactly as the phases driven one
// by one do (the same losses and learning rates, the same data position, the same adapter bits).
TEST_F(TrainerPhases, RunQueuesTheNextStepBeforeReportingAndEndsAsStepByStep) {
  config_.trainer.train_steps = 8;
  std::vector<ProgressSnapshot> reports[2];
  for (const bool whole_run : {true, false}) {
    SCOPED_TRACE(whole_run ? "Run()" : "phase by phase");
    TrainingContext context = Context(tmp_ / (whole_run ? "run" : "phases"));
    QueueOrder order;
    context.observer = &order;
    context.report_progress = [&](const ProgressSnapshot& p) {
      reports[whole_run].push_back(p);
      order.events.push_back(absl::StrCat("report ", p.step));
    };
    auto trainer = Trainer::Create(context);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    if (whole_run) {
      ASSERT_TRUE((*trainer)->Run().ok());
      EXPECT_THAT(order.events,
                  ::testing::ElementsAre("queue 1", "report 1", "queue 2", "report 2", "queue 3",
                                         "report 3", "queue 4", "queue 5", "report 4", "queue 6",
                                         "report 5", "report 6", "queue 7", "queue 8", "report 7",
                                         "report 8"));
    } else {
      ASSERT_TRUE((*trainer)->Resume().ok());
      for (int64_t step = 0; step < 8; ++step) {
        auto result = (*trainer)->Step(step);
        ASSERT_TRUE(result.ok()) << result.status();
        ASSERT_TRUE((*trainer)->After(*result).ok());
      }
      ASSERT_TRUE((*trainer)->Finish().ok());
    }
    const std::string checkpoints = CheckpointsDir(context.assignment.output_dir, "job-phases", "");
    EXPECT_EQ(LatestCheckpoint(checkpoints), CheckpointDir(checkpoints, 6));
  }
  ASSERT_EQ(reports[0].size(), 8u);
  ASSERT_EQ(reports[1].size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    SCOPED_TRACE(absl::StrCat("report ", i + 1));
    EXPECT_EQ(reports[1][i].step, reports[0][i].step);
    EXPECT_EQ(reports[1][i].loss, reports[0][i].loss);
    EXPECT_EQ(reports[1][i].learning_rate, reports[0][i].learning_rate);
    EXPECT_EQ(reports[1][i].epoch, reports[0][i].epoch);
    EXPECT_EQ(reports[1][i].epoch_records.trained, reports[0][i].epoch_records.trained);
    EXPECT_EQ(reports[1][i].total_records.trained, reports[0][i].total_records.trained);
  }
  const auto run = testing::LoadTensors(tmp_ / "run/adapter/adapter_model.safetensors");
  const auto phases = testing::LoadTensors(tmp_ / "phases/adapter/adapter_model.safetensors");
  ASSERT_EQ(run.size(), phases.size());
  ASSERT_FALSE(run.empty());
  for (const auto& [name, tensor] : run) EXPECT_TRUE(at::equal(tensor, phases.at(name))) << name;
}

// trainer.dequantized_weight_layers: a count holds that many layers of an NF4 model from the
// first step, the progress reports say so, and the losses are those of the same run without
// (bit for bit: the held weights are the bits a dequantization gives). A dense model has nothing
// to hold: 0 reported.
TEST_F(TrainerPhases, DequantizedWeightLayersAreReportedAndLeaveTheLossesAsTheyAre) {
  std::vector<double> losses[2];
  for (int held : {0, 1}) {
    SCOPED_TRACE(absl::StrCat(held, " held"));
    TrainingContext context = Context(tmp_ / absl::StrCat("held-", held));
    context.config.quantization.enabled = true;
    context.config.trainer.dequantized_weight_layers = held;
    context.config.trainer.train_steps = 2;
    context.config.trainer.steps_per_checkpoint = 0;
    std::vector<ProgressSnapshot> reports;
    context.report_progress = [&](const ProgressSnapshot& p) { reports.push_back(p); };
    auto trainer = Trainer::Create(context);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    EXPECT_EQ((*trainer)->checkpointing().dequantized_layers, held);
    ASSERT_TRUE((*trainer)->Run().ok());
    ASSERT_EQ(reports.size(), 2u);
    for (const ProgressSnapshot& p : reports) {
      EXPECT_EQ(p.checkpointing.dequantized_layers, held);
      losses[held].push_back(p.loss);
    }
  }
  EXPECT_EQ(losses[0], losses[1]);
  TrainingContext dense = Context(tmp_ / "held-dense");  // quantization: null
  dense.config.trainer.dequantized_weight_layers = 2;
  auto trainer = Trainer::Create(dense);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  EXPECT_EQ((*trainer)->checkpointing().dequantized_layers, 0);
}

// Stage 3 (at world 1) and offload_param: {device: cpu} put the 4-bit base weights in a store
// (partitioned, or in host memory) and leave the losses and the adapter bit for bit as they
// were, the merged model too.
TEST_F(TrainerPhases, BaseWeightsInAStoreLeaveLossesAndAdapterAsTheyAre) {
  struct Case {
    std::string name;
    int stage;
    bool offload;
  };
  std::vector<std::vector<double>> losses;
  std::vector<std::map<std::string, at::Tensor>> adapters, merged;
  for (const Case& c : {Case{"whole", 2, false}, Case{"stage3", 3, false},
                        Case{"offload", 2, true}, Case{"stage3-offload", 3, true}}) {
    SCOPED_TRACE(c.name);
    TrainingContext context = Context(tmp_ / c.name);
    context.config.quantization.enabled = true;
    context.config.backend.strategy.zero_stage = c.stage;  // as if written
    context.config.backend.strategy.zero_stage_auto = false;
    context.config.backend.strategy.offload_param = c.offload;
    context.config.lora.merge_adapter_into_base_model = true;
    context.config.trainer.train_steps = 2;
    context.config.trainer.steps_per_checkpoint = 0;
    std::vector<double> reported;
    StrategySnapshot last;
    context.report_progress = [&](const ProgressSnapshot& p) {
      reported.push_back(p.loss);
      last = p.strategy;
    };
    auto trainer = Trainer::Create(context);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    EXPECT_EQ((*trainer)->strategy().Describe().partitions_base_weights, c.stage == 3);
    ASSERT_TRUE((*trainer)->Run().ok());
    ASSERT_EQ(reported.size(), 2u);
    EXPECT_EQ(last.partitioned_base_weights, c.stage == 3);
    EXPECT_EQ(last.base_weights_in_host_memory, c.offload);
    EXPECT_EQ(last.base_weight_gathered_bytes, 0);  // one rank: nothing to gather
    losses.push_back(reported);
    adapters.push_back(testing::LoadTensors(tmp_ / c.name + "/adapter/adapter_model.safetensors"));
    merged.push_back(testing::LoadTensors(tmp_ / c.name + "/merged/model.safetensors"));
  }
  for (size_t k = 1; k < losses.size(); ++k) {
    EXPECT_EQ(losses[k], losses[0]) << k;
    ASSERT_EQ(adapters[k].size(), adapters[0].size());
    for (const auto& [name, tensor] : adapters[0]) {
      EXPECT_TRUE(at::equal(tensor, adapters[k].at(name))) << k << " " << name;
    }
    ASSERT_EQ(merged[k].size(), merged[0].size());
    for (const auto& [name, tensor] : merged[0]) {
      EXPECT_TRUE(at::equal(tensor, merged[k].at(name))) << k << " " << name;
    }
  }
}

// adapter.pretrained_adapter_weights: a job's adapters start from another job's adapter, bit for
// bit; an adapter whose settings are not the job's is refused naming both.
TEST_F(TrainerPhases, AdaptersStartFromAPretrainedAdapter) {
  TrainingContext first = Context(tmp_ / "first");
  first.config.trainer.train_steps = 2;
  auto trained = Trainer::Create(first);
  ASSERT_TRUE(trained.ok()) << trained.status();
  ASSERT_TRUE((*trained)->Run().ok());
  const std::string adapter = tmp_ / "first/adapter";
  const std::map<std::string, at::Tensor> saved =
      testing::LoadTensors(adapter + "/adapter_model.safetensors");

  struct Capture : TrainingObserver {
    std::map<std::string, at::Tensor> lora;
    void OnLoraReady(const engine::LlamaForCausalLM& model) override {
      for (const auto& [name, tensor] : model.TrainableParameters()) lora[name] = tensor.detach().clone();
    }
  } capture;
  TrainingContext next = Context(tmp_ / "next");
  next.config.lora.pretrained_adapter_path = adapter;
  next.config.trainer.train_steps = 1;
  next.observer = &capture;
  auto continued = Trainer::Create(next);
  ASSERT_TRUE(continued.ok()) << continued.status();
  ASSERT_EQ(capture.lora.size(), saved.size());
  for (const auto& [name, tensor] : saved) {
    ASSERT_TRUE(capture.lora.count(name)) << name;
    EXPECT_TRUE(at::equal(capture.lora.at(name), tensor.to(at::kFloat))) << name;
  }
  ASSERT_TRUE((*continued)->Run().ok());

  TrainingContext other = Context(tmp_ / "other");
  other.config.lora.pretrained_adapter_path = adapter;
  other.config.lora.r = first.config.lora.r * 2;
  auto refused = Trainer::Create(other);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::HasSubstr(absl::StrCat("has r ", first.config.lora.r)));
}

// SFT, then DPO from its adapter (the reference is that adapter), checkpointed at step 3 and
// resumed there by a fresh trainer: the resumed run ends bit-identical to the uninterrupted one
// (the reference is the adapter as loaded, not as the checkpoint left it).
TEST_F(TrainerPhases, DpoFromAnAdapterResumesBitIdentical) {
  TrainingContext sft = Context(tmp_ / "sft");
  sft.config.trainer.train_steps = 2;
  auto trained = Trainer::Create(sft);
  ASSERT_TRUE(trained.ok()) << trained.status();
  ASSERT_TRUE((*trained)->Run().ok());

  auto dpo_context = [&](int generation) {
    TrainingContext c = Context(tmp_ / "dpo");
    c.assignment.generation = generation;
    c.config.trainer.type = TrainerType::kDpo;
    c.config.trainer.beta = 0.5;
    c.config.lora.pretrained_adapter_path = tmp_ / "sft/adapter";
    c.config.input_features = {{"prompt", "text"}};
    c.config.output_features = {{"chosen", "text"}, {"rejected", "text"}};
    c.config.data.train_path = testing::SourceDir() + "/examples/data/preference_sample.jsonl";
    c.assignment.train_shards = {{c.config.data.train_path, 0, 0, -1}};
    c.assignment.train_shards[0].end = static_cast<int64_t>(std::filesystem::file_size(c.config.data.train_path));
    return c;
  };
  TrainingContext whole_context = dpo_context(1);
  std::vector<ProgressSnapshot> reports;
  whole_context.report_progress = [&](const ProgressSnapshot& p) { reports.push_back(p); };
  auto whole = Trainer::Create(whole_context);
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_TRUE((*whole)->Run().ok());
  ASSERT_EQ(reports.size(), 6u);
  // The policy starts as its reference: every pair's loss is ln 2 until the adapter moves.
  EXPECT_NEAR(reports[0].loss, std::log(2.0), 1e-6);
  EXPECT_EQ(reports[0].metrics.size(), 8u);
  const auto first = testing::LoadTensors(tmp_ / "dpo/adapter/adapter_model.safetensors");

  TrainingContext again = dpo_context(2);
  auto resumed = Trainer::Create(again);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  auto from = (*resumed)->Resume();
  ASSERT_TRUE(from.ok()) << from.status();
  EXPECT_EQ(*from, 3);
  for (int64_t step = *from; step < 6; ++step) {
    auto result = (*resumed)->Step(step);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_NEAR(result->loss, reports[step].loss, 0) << step;
    ASSERT_TRUE((*resumed)->After(*result).ok());
  }
  ASSERT_TRUE((*resumed)->Finish().ok());
  const auto second = testing::LoadTensors(tmp_ / "dpo/adapter/adapter_model.safetensors");
  ASSERT_EQ(first.size(), second.size());
  for (const auto& [name, tensor] : first) EXPECT_TRUE(at::equal(tensor, second.at(name))) << name;
}

// A stage left to the service (no stage written): the rank plans where the base weights go for
// the budget before loading. A budget between what streaming and what whole weights need gets
// stage 3 with the weights in host memory, and its progress says so; the run trains as stage 2
// would, bit for bit (tests/zero/base_weights_test.cc proves the equality; here, the loss).
TEST_F(TrainerPhases, AStageLeftToTheServiceStreamsWhatDoesNotFit) {
  std::vector<double> losses;
  for (const bool tight : {false, true}) {
    TrainingContext context = Context(tmp_ / (tight ? "planned-tight" : "planned-roomy"));
    context.config.backend.strategy.zero_stage_auto = true;
    context.config.trainer.train_steps = 2;
    // Six 4-bit layers: streaming keeps two whole where the device would hold six.
    context.config.quantization.enabled = true;
    context.config.base_model_path = tmp_ / (tight ? "six-tight" : "six-roomy");
    ASSERT_TRUE(testing::MakeTinyModelWithExampleTokenizer(context.config.base_model_path, 6).ok());
    absl::StatusOr<engine::LlamaConfig> shape = engine::LoadLlamaConfig(context.config.base_model_path);
    ASSERT_TRUE(shape.ok()) << shape.status();
    memory::BaseWeightPlanRequest r;
    r.activations = memory::ActivationRequestFor(context.config, *shape, /*cuda=*/false);
    r.quantization = context.config.quantization;
    const int64_t whole = memory::PlannedPeakWith(r, memory::BaseWeightPlacement::kOnDevice);
    const int64_t streamed = memory::PlannedPeakWith(r, memory::BaseWeightPlacement::kStreamed);
    ASSERT_LT(streamed, whole);
    const double usable = tight ? (whole + streamed) / 2.0 : 2.0 * whole;
    context.config.trainer.max_memory_gib = usable / (1 - 0.08) / (1 << 30);
    std::vector<ProgressSnapshot> reports;
    context.report_progress = [&](const ProgressSnapshot& p) { reports.push_back(p); };
    auto trainer = Trainer::Create(context);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    const strategy::StrategyDescription d = (*trainer)->strategy().Describe();
    EXPECT_EQ(d.stage, tight ? 3 : 2);
    EXPECT_EQ(d.partitions_base_weights, tight);
    ASSERT_TRUE((*trainer)->Run().ok());
    ASSERT_FALSE(reports.empty());
    EXPECT_EQ(reports.back().strategy.zero_stage, tight ? 3 : 2);
    EXPECT_EQ(reports.back().strategy.base_weights_in_host_memory, tight);
    losses.push_back(reports.back().loss);
  }
  EXPECT_EQ(losses[0], losses[1]);
}

// trainer.enable_gradient_checkpointing: auto plans the split for max_memory_gib once the model
// and the strategy are built, and reports it with every progress report; a budget below what
// every layer checkpointed needs fails the start naming both numbers; auto without a budget on
// a CPU checkpoints every layer; true and false are all and none.
TEST_F(TrainerPhases, AutoCheckpointingPlansForTheBudgetAndReportsItsChoice) {
  const int64_t layers = engine::TinyLlamaConfig().num_hidden_layers;
  struct Case {
    CheckpointingMode mode;
    double gib;
    int64_t checkpointed;
  };
  for (const Case& k : {Case{CheckpointingMode::kAuto, 1.0, 0}, Case{CheckpointingMode::kAuto, 0, layers},
                        Case{CheckpointingMode::kAll, 0, layers}, Case{CheckpointingMode::kNone, 0, 0}}) {
    SCOPED_TRACE(absl::StrCat(EnumName(k.mode), " ", k.gib));
    TrainingContext context = Context(tmp_ / absl::StrCat("ckpt-", EnumName(k.mode), k.gib));
    context.config.trainer.gradient_checkpointing = k.mode;
    context.config.trainer.max_memory_gib = k.gib;
    context.config.trainer.train_steps = 1;
    std::vector<ProgressSnapshot> reports;
    context.report_progress = [&](const ProgressSnapshot& p) { reports.push_back(p); };
    auto trainer = Trainer::Create(context);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    const CheckpointingReport chosen = (*trainer)->checkpointing();
    EXPECT_EQ(chosen.checkpointed_layers, k.checkpointed);
    EXPECT_EQ(chosen.layers, layers);
    EXPECT_EQ(chosen.budget_bytes, static_cast<int64_t>(k.gib * (1 << 30)));
    EXPECT_EQ(chosen.planned_peak_bytes > 0, k.gib > 0);
    if (k.gib > 0) EXPECT_LT(chosen.planned_peak_bytes, chosen.budget_bytes);
    ASSERT_TRUE((*trainer)->Run().ok());
    ASSERT_EQ(reports.size(), 1u);
    EXPECT_EQ(reports[0].checkpointing.checkpointed_layers, k.checkpointed);
    EXPECT_EQ(reports[0].checkpointing.budget_bytes, chosen.budget_bytes);
  }
  TrainingContext tight = Context(tmp_ / "ckpt-tight");
  tight.config.trainer.gradient_checkpointing = CheckpointingMode::kAuto;
  tight.config.trainer.max_memory_gib = 1e-5;  // 10.5 KiB
  auto refused = Trainer::Create(tight);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::HasSubstr("trainer.max_memory_gib: a budget of 0.0 MiB is below what this "
                                   "step needs with (nearly) every decoder layer checkpointed: a planned peak of "));
}

// trainer.checkpoint_every_minutes: once the time has passed (here at once: 1e-6 minutes), the
// next optimizer step is checkpointed, whatever steps_per_checkpoint says; 0 turns it off.
TEST_F(TrainerPhases, TimeBasedCheckpointsComeAtTheNextStepOnceTheIntervalHasPassed) {
  for (double minutes : {1e-6, 0.0}) {
    SCOPED_TRACE(minutes);
    const std::string out = tmp_ / (minutes > 0 ? "timed" : "untimed");
    TrainingContext context = Context(out);
    context.config.trainer.steps_per_checkpoint = 0;
    context.config.trainer.checkpoint_every_minutes = minutes;
    context.config.trainer.keep_checkpoints = 0;  // keep every one, to count them
    auto trainer = Trainer::Create(context);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    ASSERT_TRUE((*trainer)->Run().ok());
    const std::string dir = CheckpointsDir(out, "job-phases", "");
    for (int step = 1; step < 6; ++step) {
      EXPECT_EQ(PathExists(CheckpointDir(dir, step) + "/manifest.json"), minutes > 0) << "step " << step;
    }
    EXPECT_FALSE(PathExists(CheckpointDir(dir, 6))) << "the last step ends the run: no checkpoint";
  }
}

// The opt-in profiler (QLORA_PROFILE_STEPS): a Chrome trace of exactly the asked steps, with the
// trainer's named phases and the ops inside them, which bench/attribute_profile.py reads.
TEST_F(TrainerPhases, StepProfilerTracesTheAskedStepsWithTheirNamedPhases) {
  TrainingContext context = Context(tmp_ / "profiled");
  const std::string path = tmp_ / "trace.json";
  StepProfiler profiler(/*rank=*/0, /*first_step=*/2, /*steps=*/2, path);
  context.observer = &profiler;
  auto trainer = Trainer::Create(context);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  ASSERT_TRUE((*trainer)->Run().ok());
  ASSERT_TRUE(profiler.Stop().ok());
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << "no trace at " << path;
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::map<std::string, int> scopes;
  std::vector<std::tuple<int64_t, double, double>> lora_ranges;  // thread, start, end
  int ops = 0;
  for (const auto& e : trace.at("traceEvents")) {
    const std::string name = e.value("name", "");
    if (name.rfind("qlora::", 0) == 0) ++scopes[name];
    if (name == "qlora::lora") {
      lora_ranges.emplace_back(e.value("tid", int64_t{0}), e.value("ts", 0.0),
                               e.value("ts", 0.0) + e.value("dur", 0.0));
    }
    if (name == "aten::mm" || name == "aten::addmm") {
      ++ops;
      EXPECT_TRUE(e.contains("args") && e["args"].contains("Input Dims")) << "shapes are recorded";
    }
  }
  EXPECT_EQ(scopes["qlora::step"], 2);  // steps 2 and 3, not the others
  EXPECT_EQ(scopes["qlora::optimizer"], 2);
  EXPECT_EQ(scopes["qlora::forward"], 4);  // two micro-batches a step
  EXPECT_EQ(scopes["qlora::loss"], 4);
  EXPECT_EQ(scopes["qlora::backward"], 4);
  EXPECT_EQ(scopes["qlora::grads"], 4);
  EXPECT_GT(ops, 0);
  // The adapters' rank-r GEMMs (r = 4: a dimension of their inputs) run inside the engine's
  // qlora::lora ranges, by which the attribution tells them from the base GEMMs on a GPU (there
  // they are cuBLASLt calls inside the LoRA nodes, whose ops show the layer's shapes).
  EXPECT_GT(lora_ranges.size(), 0u);
  int rank_r_gemms = 0;
  for (const auto& e : trace.at("traceEvents")) {
    const std::string name = e.value("name", "");
    if ((name != "aten::mm" && name != "aten::addmm") || !e.contains("args") ||
        !e["args"].contains("Input Dims")) {
      continue;
    }
    bool rank_r = false;
    for (const auto& dims : e["args"]["Input Dims"]) {
      for (const auto& d : dims) rank_r = rank_r || d.get<int64_t>() == 4;
    }
    if (!rank_r) continue;
    ++rank_r_gemms;
    const int64_t tid = e.value("tid", int64_t{0});
    const double ts = e.value("ts", 0.0);
    const bool inside = std::any_of(lora_ranges.begin(), lora_ranges.end(), [&](const auto& r) {
      return std::get<0>(r) == tid && std::get<1>(r) <= ts && ts <= std::get<2>(r);
    });
    EXPECT_TRUE(inside) << name << " at " << ts << " with dims " << e["args"]["Input Dims"].dump();
  }
  EXPECT_GT(rank_r_gemms, 0);
  // A copy of this real CPU trace, when asked for.
  if (const char* copy = std::getenv("QLORA_TEST_KEEP_TRACE")) {
    std::ofstream(copy) << trace.dump();
  }
  // bench/attribute_profile.py reads it: its rows cover the profiled steps, GEMMs among them.
  const std::string figures = tmp_ / "attribution.json";
  const std::string command = "python3 " + testing::SourceDir() + "/bench/attribute_profile.py " + path +
                              " --lora-r 4 --json " + figures + " > /dev/null";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  std::ifstream figures_in(figures);
  const nlohmann::json attribution = nlohmann::json::parse(figures_in);
  EXPECT_EQ(attribution.at("steps").get<int>(), 2);
  double total = 0;
  for (const auto& [category, us] : attribution.at("categories").items()) total += us.get<double>();
  EXPECT_NEAR(total, attribution.at("window_us").get<double>(), 1e-6 * total);
  EXPECT_GT(attribution["categories"]["base_gemm"].get<double>(), 0);
  EXPECT_GT(attribution["categories"]["lora_gemm"].get<double>(), 0);
  EXPECT_GT(attribution["categories"]["loss"].get<double>(), 0);
  EXPECT_GT(attribution["phases"]["forward"].get<double>(), 0);
  EXPECT_GT(attribution["phases"]["recompute"].get<double>(), 0);  // the checkpoint node's forward
}

TEST(StepProfilerEnvironment, AsksForNothingOneRankOrEveryRank) {
  unsetenv("QLORA_PROFILE_STEPS");
  unsetenv("QLORA_PROFILE_OUT");
  auto none = StepProfiler::FromEnvironment(0);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
  setenv("QLORA_PROFILE_STEPS", "5:2", 1);
  EXPECT_FALSE(StepProfiler::FromEnvironment(0).ok());  // without QLORA_PROFILE_OUT
  setenv("QLORA_PROFILE_OUT", "/tmp/trace.json", 1);
  auto rank0 = StepProfiler::FromEnvironment(0);
  ASSERT_TRUE(rank0.ok() && *rank0 != nullptr);
  EXPECT_EQ((*rank0)->path(), "/tmp/trace.json");
  auto rank1 = StepProfiler::FromEnvironment(1);
  ASSERT_TRUE(rank1.ok());
  EXPECT_EQ(*rank1, nullptr);  // only rank 0 without {rank}
  setenv("QLORA_PROFILE_OUT", "/tmp/trace-{rank}.json", 1);
  auto each = StepProfiler::FromEnvironment(1);
  ASSERT_TRUE(each.ok() && *each != nullptr);
  EXPECT_EQ((*each)->path(), "/tmp/trace-1.json");
  for (const char* bad : {"5", "a:2", "5:0", "-1:2", "5:2:1"}) {
    setenv("QLORA_PROFILE_STEPS", bad, 1);
    EXPECT_FALSE(StepProfiler::FromEnvironment(0).ok()) << bad;
  }
  unsetenv("QLORA_PROFILE_STEPS");
  unsetenv("QLORA_PROFILE_OUT");
}

}  // namespace
}  // namespace qlora::worker
