// The training loop checked numerically end to end. The real worker code (RunTrainingJob: the
// data path, the engine, the ZeRO strategy over Gloo, one process per rank) trains the tiny model
// on 1, 2 and 4 ranks with gradient accumulation, uneven token counts per rank and clipping; an
// independent reference (reference_training.py: transformers + peft + torch.optim.AdamW in fp32)
// trains the same initial adapter on the same micro-batches in the same order. The adapters and
// the per-step losses must agree to float32 round-off.
//
// What this catches that comparing stages with each other cannot: a loss normalised by one
// rank's tokens instead of the global batch's, a schedule or clipping that differs from HF's,
// micro-batches dropped or reordered, a wrong weight-decay or bias-correction.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config/job_config_parser.h"
#include "common/dataset/shard_planner.h"
#include "common/posix_files.h"
#include "tests/engine/test_util.h"
#include "tests/engine/torch_test_util.h"
#include "tests/util/rank_processes.h"
#include "worker/engine/peft_io.h"
#include "tests/run/recorded_rank.h"
#include "tests/run/tiny_model_dir.h"
#include "worker/run/training_job.h"
#include "worker/run/training_observer.h"

namespace qlora {
namespace {

constexpr char kRankEnv[] = "TRAINER_REF_RANK";
constexpr char kDirEnv[] = "TRAINER_REF_DIR";
constexpr char kWorldEnv[] = "TRAINER_REF_WORLD";
constexpr int kAccumulation = 2;
constexpr int kSteps = 5;

// A job whose hyperparameters exercise every part of the update: warm-up then cosine decay,
// weight decay, clipping that engages, gradient accumulation.
std::string JobYaml(const std::string& dir, int world, int stage) {
  return absl::StrCat(R"(
model_type: llm
base_model: )", dir, R"(/model
input_features: [{name: instruction, type: text}]
output_features: [{name: output, type: text}]
adapter: {type: lora, r: 4, alpha: 8, dropout: 0.0, target_modules: all-linear}
quantization: null
backend:
  type: local
  trainer: {use_gpu: false, num_workers: )", world, R"(, strategy: {type: deepspeed, zero_optimization: {stage: )", stage, R"(}}}
trainer:
  type: finetune
  batch_size: 2
  gradient_accumulation_steps: )", kAccumulation, R"(
  learning_rate: 0.002
  train_steps: )", kSteps, R"(
  optimizer: {type: adamw, weight_decay: 0.05, betas: [0.9, 0.99], eps: 1.0e-8}
  learning_rate_scheduler: {decay: cosine, warmup_fraction: 0.2}
  gradient_clipping: {clipglobalnorm: 0.05}
  enable_gradient_checkpointing: false
  seed: 11
dataset: )", dir, R"(/train.jsonl
data: {max_sequence_length: 96}
)");
}

// Records with outputs of very different lengths, so ranks and micro-batches carry different
// numbers of target tokens.
std::string MakeDataset() {
  std::mt19937 rng(5);
  const std::vector<std::string> words = {"alpha", "beta", "gamma", "delta", "one", "two", "x",
                                          "seven", "reverse", "the", "word", "number"};
  std::string out;
  for (int i = 0; i < 160; ++i) {
    const int n = 1 + static_cast<int>(rng() % (i % 3 == 0 ? 24 : 4));
    std::vector<std::string> w;
    for (int k = 0; k < n; ++k) w.push_back(words[rng() % words.size()]);
    out += absl::StrCat(R"({"instruction": "Repeat item )", i, R"(.", "output": ")",
                        absl::StrJoin(w, " "), "\"}\n");
  }
  return out;
}

// One rank: runs only when the parent test sets the environment.
TEST(TrainerReferenceChild, Rank) {
  const std::optional<testing::ChildRank> child = testing::ChildRankFromEnv(kRankEnv, kWorldEnv, kDirEnv);
  if (!child) GTEST_SKIP() << "run by TrainerReference only";
  const int rank = child->rank, world = child->world;
  const std::string& dir = child->dir;
  nlohmann::json losses = nlohmann::json::array(), stages = nlohmann::json::array();
  testing::RunRecordedRank(dir, rank, world, "job-reference", [&](const ProgressSnapshot& p) {
    losses.push_back(p.loss);
    stages.push_back(p.strategy.zero_stage);
  });
  if (HasFatalFailure()) return;
  std::ofstream(absl::StrCat(dir, "/progress-rank", rank, ".json"))
      << nlohmann::json{{"losses", losses}, {"stages", stages}}.dump();
}

struct Case {
  int world;
  int stage;
};

class TrainerReference : public ::testing::TestWithParam<Case> {};

TEST_P(TrainerReference, AdapterAndLossesEqualTransformersPeftAdamW) {
  QLORA_PYTHON_OR_SKIP(python);
  const Case c = GetParam();
  testing::TempDir tmp;
  const std::string dir = tmp.path();
  const absl::Status made = testing::MakeTinyModelWithExampleTokenizer(dir + "/model");
  ASSERT_TRUE(made.ok()) << made;
  ASSERT_TRUE(MakeDirs(dir + "/store").ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/train.jsonl", MakeDataset()).ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/job.yaml", JobYaml(dir, c.world, c.stage)).ok());

  const std::vector<std::string> problems = testing::RunRankProcesses(
      c.world, "TrainerReferenceChild.Rank", kRankEnv,
      // One thread per rank, as the coordinator gives CPU workers their share of the cores.
      {{kDirEnv, dir}, {kWorldEnv, std::to_string(c.world)}, {"OMP_NUM_THREADS", "1"}},
      absl::Seconds(240));
  ASSERT_TRUE(problems.empty()) << absl::StrJoin(problems, "; ");

  const nlohmann::json reference = {
      {"lr", 0.002}, {"beta1", 0.9}, {"beta2", 0.99}, {"eps", 1e-8}, {"weight_decay", 0.05},
      {"max_grad_norm", 0.05}, {"total_steps", kSteps}, {"warmup_steps", 1},  // ceil(0.2 x 5)
      {"schedule", "cosine"}, {"world", c.world}, {"accumulation", kAccumulation}};
  ASSERT_TRUE(WriteFileAtomically(dir + "/reference.json", reference.dump()).ok());
  const std::string script = testing::SourceDir() + "/tests/run/reference_training.py";
  const std::string command = absl::StrCat("'", python, "' '", script, "' '", dir, "'");
  ASSERT_EQ(std::system(command.c_str()), 0) << command;

  // Adapters: the same tensors, equal to float32 round-off, and far from where they started.
  testing::AdapterDistances d;
  testing::CompareAdapters(dir, &d);
  if (HasFatalFailure()) return;
  const double max_diff = d.max_diff, max_update = d.max_update;
  RecordProperty("max_abs_diff", std::to_string(max_diff));
  printf("world %d stage %d: adapters differ by at most %.3g; training moved them by up to %.3g\n",
         c.world, c.stage, max_diff, max_update);
  EXPECT_GT(max_update, 1e-3) << "training barely changed the adapter: the check would be weak";
  EXPECT_LE(max_diff, 2e-6);

  // Losses: what rank 0 reported each step against the reference's global-batch mean; and every
  // rank ran the stage the job asked for.
  std::ifstream reference_losses(dir + "/reference-losses.json");
  const std::vector<double> expected = nlohmann::json::parse(reference_losses).get<std::vector<double>>();
  for (int rank = 0; rank < c.world; ++rank) {
    std::ifstream progress_file(absl::StrCat(dir, "/progress-rank", rank, ".json"));
    const nlohmann::json progress = nlohmann::json::parse(progress_file);
    const std::vector<double> losses = progress["losses"].get<std::vector<double>>();
    ASSERT_EQ(losses.size(), expected.size()) << "rank " << rank;
    for (size_t s = 0; s < losses.size(); ++s) {
      EXPECT_NEAR(losses[s], expected[s], 1e-5 * expected[s]) << "rank " << rank << " step " << s + 1;
    }
    for (int stage : progress["stages"].get<std::vector<int>>()) EXPECT_EQ(stage, c.stage);
  }
}

INSTANTIATE_TEST_SUITE_P(RanksAndStages, TrainerReference,
                         ::testing::Values(Case{1, 0}, Case{2, 2}, Case{4, 1}, Case{4, 2},
                                           Case{2, 3}, Case{4, 3}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return absl::StrCat(info.param.world, "Ranks_Stage", info.param.stage);
                         });

}  // namespace
}  // namespace qlora
