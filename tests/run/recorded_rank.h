// One rank of a reference test's job, run as a child process: the real worker code
// (RunTrainingJob over Gloo, on the CPU, in float32 as the Python references compute) on DIR's
// job.yaml and data, recording what the reference must replay: rank 0's initial adapter
// (DIR/init-adapter) and every micro-batch this rank trained on
// (DIR/batches-rank<r>.safetensors: s<step>.m<i>.input_ids / .labels, and .lengths for
// preference pairs).
#pragma once

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/config/job_config_parser.h"
#include "common/dataset/shard_planner.h"
#include "common/posix_files.h"
#include "tests/engine/torch_test_util.h"
#include "tests/util/rank_processes.h"
#include "worker/engine/peft_io.h"
#include "worker/run/training_job.h"
#include "worker/run/training_observer.h"

namespace qlora::testing {

// What a child rank process is told by its parent test through the environment (the variables
// named here); nullopt when the child test runs on its own (it then skips).
struct ChildRank {
  int rank = 0;
  int world = 0;
  std::string dir;
};
inline std::optional<ChildRank> ChildRankFromEnv(const char* rank_env, const char* world_env, const char* dir_env) {
  const char* rank = std::getenv(rank_env);
  const char* world = std::getenv(world_env);
  const char* dir = std::getenv(dir_env);
  if (!rank || !world || !dir) return std::nullopt;
  return ChildRank{std::atoi(rank), std::atoi(world), dir};
}

class BatchRecorder final : public worker::TrainingObserver {
 public:
  BatchRecorder(std::string dir, int rank) : dir_(std::move(dir)), rank_(rank) {}
  void OnLoraReady(const engine::LlamaForCausalLM& model) override {
    if (rank_ == 0) status_ = engine::SaveAdapter(model, dir_ + "/init-adapter");
  }
  void OnMicroBatch(int64_t step, int index, const worker::DeviceBatch& batch) override {
    const std::string key = absl::StrCat("s", step, ".m", index);
    tensors_[key + ".input_ids"] = batch.input_ids.cpu().clone();
    tensors_[key + ".labels"] = batch.labels.cpu().clone();
    if (batch.lengths.defined()) tensors_[key + ".lengths"] = batch.lengths.cpu().clone();
  }
  absl::Status Save() {
    if (!status_.ok()) return status_;
    return SaveTensors(absl::StrCat(dir_, "/batches-rank", rank_, ".safetensors"), tensors_);
  }

 private:
  std::string dir_;
  int rank_;
  absl::Status status_;
  std::map<std::string, at::Tensor> tensors_;
};

// Runs rank `rank` of `world` on DIR/job.yaml (its shards planned in several chunks, as a large
// file would have them), calling `on_progress` with each step's report. Fails the test on error.
inline void RunRecordedRank(const std::string& dir, int rank, int world, const std::string& job_id,
                            const std::function<void(const ProgressSnapshot&)>& on_progress) {
  auto yaml = ::qlora::ReadFile(dir + "/job.yaml");
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  auto config = ParseJobConfig(*yaml, {});
  ASSERT_TRUE(config.ok()) << config.status();
  // Unquantized weights run in the compute dtype: fp32, as the references.
  config->quantization.compute_dtype = ComputeDtype::kFloat32;
  data::ShardPlanOptions plan;
  plan.chunk_bytes = 4096;
  auto shards = data::PlanShards({config->data.train_path}, world, plan);
  ASSERT_TRUE(shards.ok()) << shards.status();
  worker::TrainingContext context;
  context.config = *config;
  context.assignment.job_id = job_id;
  context.assignment.rank = rank;
  context.assignment.world_size = world;
  context.assignment.device = DeviceKind::kCpu;
  context.assignment.train_shards = (*shards)[rank];
  context.assignment.generation = 1;
  context.assignment.output_dir = dir + "/out";
  DirectoryStore store(dir + "/store");
  context.store = &store;
  BatchRecorder recorder(dir, rank);
  context.observer = &recorder;
  context.report_progress = on_progress;
  auto outcome = worker::RunTrainingJob(context);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  const absl::Status saved = recorder.Save();
  ASSERT_TRUE(saved.ok()) << saved;
}

// How far the job's final adapter (DIR/out/adapter) is from the reference's
// (DIR/reference-adapter.safetensors) and from where it started (DIR/init-adapter), over every
// tensor; fails the test when their tensors are not the same set.
struct AdapterDistances {
  double max_diff = 0;    // ours against the reference
  double max_update = 0;  // ours against the initial adapter
};
inline void CompareAdapters(const std::string& dir, AdapterDistances* out) {
  auto ours = LoadTensors(dir + "/out/adapter/adapter_model.safetensors");
  auto theirs = LoadTensors(dir + "/reference-adapter.safetensors");
  auto initial = LoadTensors(dir + "/init-adapter/adapter_model.safetensors");
  ASSERT_FALSE(ours.empty());
  ASSERT_EQ(ours.size(), theirs.size());
  for (const auto& [name, tensor] : ours) {
    ASSERT_TRUE(theirs.count(name)) << name << " is not in the reference adapter";
    ASSERT_TRUE(initial.count(name)) << name;
    out->max_diff = std::max(out->max_diff, MaxAbsDiff(tensor, theirs.at(name)));
    out->max_update = std::max(out->max_update, MaxAbsDiff(tensor, initial.at(name)));
  }
}

}  // namespace qlora::testing
