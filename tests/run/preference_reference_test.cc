// Preference tuning checked end to end against TRL. The real worker code (RunTrainingJob: the
// data path, the engine, the ZeRO strategy over Gloo, one process per rank) runs DPO and ORPO
// jobs on the tiny model on 1, 2 and 4 ranks with gradient accumulation and clipping;
// reference_preference.py trains the same initial adapter with TRL's own DPOTrainer /
// ORPOTrainer (+ peft, torch AdamW, fp32) on the same pairs in the same order (every rank's
// micro-batches of a step make TRL's accumulated batch), after checking that TRL tokenizes every
// pair to the ids our data path gave it. The per-step losses, TRL's metrics and the final adapter
// must agree to float32 round-off; a fresh adapter's first DPO step (sigmoid, robust) is ln 2.
//
// What this catches: a reference that is not the base (or not the adapter the job started
// from), log-probabilities over the wrong tokens (the prompt, padding, an unshifted label), a
// loss averaged over the wrong count across ranks or micro-batches, chosen and rejected rows
// swapped, metrics that are not TRL's.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
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
#include "tests/run/recorded_rank.h"
#include "tests/run/tiny_model_dir.h"
#include "tests/util/rank_processes.h"
#include "worker/engine/peft_io.h"
#include "worker/run/training_job.h"
#include "worker/run/training_observer.h"

namespace qlora {
namespace {

constexpr char kRankEnv[] = "PREFERENCE_REF_RANK";
constexpr char kDirEnv[] = "PREFERENCE_REF_DIR";
constexpr char kWorldEnv[] = "PREFERENCE_REF_WORLD";
constexpr int kAccumulation = 2;
constexpr int kPairs = 2;  // per micro-batch
constexpr int kSteps = 4;
constexpr int kMaxLength = 96;
constexpr double kLearningRate = 0.002;

struct Case {
  std::string name;
  std::string type;       // dpo or orpo
  std::string loss_type;  // dpo
  double label_smoothing = 0;
  int world = 1;
  int stage = 0;
  bool from_adapter = false;  // start from a trained adapter: TRL's reference is that adapter
};

// Adam's eps is 1e-5, not 1e-8: a fresh adapter's A gets gradients near zero while B is still
// tiny, Adam divides them by their own magnitude, and a small eps turns their round-off into
// update differences between two exact implementations (measured: ~lr x 2e-3 with eps 1e-8).
std::string JobYaml(const std::string& dir, const Case& c) {
  std::string preference = absl::StrCat("  type: ", c.type, "\n  beta: ", c.type == "dpo" ? "0.5" : "0.2", "\n");
  if (c.type == "dpo") absl::StrAppend(&preference, "  loss_type: ", c.loss_type, "\n");
  if (c.label_smoothing > 0) absl::StrAppend(&preference, "  label_smoothing: ", c.label_smoothing, "\n");
  const std::string adapter = c.from_adapter ? absl::StrCat(", pretrained_adapter_weights: ", dir, "/start-adapter") : "";
  return absl::StrCat(R"(
model_type: llm
base_model: )", dir, R"(/model
adapter: {type: lora, r: 4, alpha: 8, dropout: 0.0, target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj])", adapter, R"(}
quantization: null
backend:
  type: local
  trainer: {use_gpu: false, num_workers: )", c.world, R"(, strategy: {type: deepspeed, zero_optimization: {stage: )", c.stage, R"(}}}
trainer:
)", preference, R"(  batch_size: )", kPairs, R"(
  gradient_accumulation_steps: )", kAccumulation, R"(
  learning_rate: )", kLearningRate, R"(
  train_steps: )", kSteps, R"(
  optimizer: {type: adamw, weight_decay: 0.05, betas: [0.9, 0.99], eps: 1.0e-5}
  learning_rate_scheduler: {decay: cosine, warmup_fraction: 0.2}
  gradient_clipping: {clipglobalnorm: 1.0}
  enable_gradient_checkpointing: false
  seed: 11
dataset: )", dir, R"(/pairs.jsonl
data: {max_sequence_length: )", kMaxLength, R"(}
)");
}

// Pairs whose completions differ in length and content, some cut at max_sequence_length; each
// prompt names its record (the reference finds the records of a micro-batch by their ids).
std::string MakePairs() {
  std::mt19937 rng(7);
  const std::vector<std::string> words = {"alpha", "beta", "gamma", "delta", "one", "two", "x",
                                          "seven", "reverse", "the", "word", "number"};
  auto phrase = [&](int most) {
    std::vector<std::string> w;
    const int n = 1 + static_cast<int>(rng() % most);
    for (int k = 0; k < n; ++k) w.push_back(words[rng() % words.size()]);
    return absl::StrJoin(w, " ");
  };
  std::string out;
  for (int i = 0; i < 96; ++i) {
    const std::string chosen = phrase(i % 5 == 0 ? 40 : 6), rejected = phrase(i % 7 == 0 ? 40 : 8);
    out += absl::StrCat(R"({"prompt": "Pair )", i, " says ", phrase(3), R"(:", "chosen": " )", chosen,
                        R"(", "rejected": " )", rejected, "\"}\n");
  }
  return out;
}

// The example tokenizer asks for BOS in tokenizer_config.json only, which transformers 5 ignores
// without a post-processor; LLaMA's tokenizer.json carries one, as this gives it.
absl::Status AddBosPostProcessor(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  nlohmann::json tokenizer = nlohmann::json::parse(*text);
  const std::string bos = "<|begin_of_text|>";
  tokenizer["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", {{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"pair", {{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
      {"special_tokens", {{bos, {{"id", bos}, {"ids", {0}}, {"tokens", {bos}}}}}}};
  return WriteFileAtomically(path, tokenizer.dump());
}

TEST(PreferenceReferenceChild, Rank) {
  const std::optional<testing::ChildRank> child = testing::ChildRankFromEnv(kRankEnv, kWorldEnv, kDirEnv);
  if (!child) GTEST_SKIP() << "run by PreferenceReference only";
  const int rank = child->rank, world = child->world;
  const std::string& dir = child->dir;
  nlohmann::json steps = nlohmann::json::array();
  testing::RunRecordedRank(dir, rank, world, "job-preference", [&](const ProgressSnapshot& p) {
    nlohmann::json metrics = nlohmann::json::object();
    for (const auto& [name, value] : p.metrics) metrics[name] = value;
    steps.push_back({{"loss", p.loss}, {"metrics", metrics}, {"stage", p.strategy.zero_stage}});
  });
  if (HasFatalFailure()) return;
  std::ofstream(absl::StrCat(dir, "/progress-rank", rank, ".json")) << steps.dump();
}

class PreferenceReference : public ::testing::TestWithParam<Case> {};

TEST_P(PreferenceReference, LossesMetricsAndAdapterEqualTrl) {
  QLORA_PYTHON_OR_SKIP(python);
  const Case c = GetParam();
  testing::TempDir tmp;
  const std::string dir = tmp.path();
  ASSERT_TRUE(testing::MakeTinyModelWithExampleTokenizer(dir + "/model").ok());
  ASSERT_TRUE(AddBosPostProcessor(dir + "/model/tokenizer.json").ok());
  ASSERT_TRUE(MakeDirs(dir + "/store").ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/pairs.jsonl", MakePairs()).ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/job.yaml", JobYaml(dir, c)).ok());
  const std::string script = testing::SourceDir() + "/tests/run/reference_preference.py";
  if (c.from_adapter) {  // an adapter with B != 0, as a finished SFT job leaves it
    const std::string command = absl::StrCat("'", python, "' '", script, "' --make-adapter '", dir, "'");
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
  }

  const std::vector<std::string> problems = testing::RunRankProcesses(
      c.world, "PreferenceReferenceChild.Rank", kRankEnv,
      {{kDirEnv, dir}, {kWorldEnv, std::to_string(c.world)}, {"OMP_NUM_THREADS", "1"}}, absl::Seconds(240));
  ASSERT_TRUE(problems.empty()) << absl::StrJoin(problems, "; ");

  const nlohmann::json reference = {
      {"type", c.type}, {"beta", c.type == "dpo" ? 0.5 : 0.2}, {"loss_type", c.loss_type},
      {"label_smoothing", c.label_smoothing}, {"lr", kLearningRate}, {"beta1", 0.9}, {"beta2", 0.99},
      {"eps", 1e-5}, {"weight_decay", 0.05}, {"max_grad_norm", 1.0}, {"total_steps", kSteps},
      {"warmup_steps", 1}, {"world", c.world}, {"accumulation", kAccumulation}, {"pairs", kPairs},
      {"max_length", kMaxLength}};
  ASSERT_TRUE(WriteFileAtomically(dir + "/reference.json", reference.dump()).ok());
  const std::string command = absl::StrCat("'", python, "' '", script, "' '", dir, "'");
  ASSERT_EQ(std::system(command.c_str()), 0) << command;

  testing::AdapterDistances d;
  testing::CompareAdapters(dir, &d);
  if (HasFatalFailure()) return;
  const double max_diff = d.max_diff, max_update = d.max_update;
  printf("%s: adapters differ by at most %.3g; training moved them by up to %.3g\n", c.name.c_str(), max_diff,
         max_update);
  EXPECT_GT(max_update, 1e-3) << "training barely changed the adapter: the check would be weak";
  EXPECT_LE(max_diff, 2e-6);

  std::ifstream reference_file(dir + "/reference-steps.json");
  const nlohmann::json expected = nlohmann::json::parse(reference_file);
  ASSERT_EQ(expected.size(), static_cast<size_t>(kSteps));
  for (int rank = 0; rank < c.world; ++rank) {
    std::ifstream progress_file(absl::StrCat(dir, "/progress-rank", rank, ".json"));
    const nlohmann::json steps = nlohmann::json::parse(progress_file);
    ASSERT_EQ(steps.size(), expected.size()) << "rank " << rank;
    for (size_t s = 0; s < steps.size(); ++s) {
      const double loss = steps[s]["loss"].get<double>(), want = expected[s]["loss"].get<double>();
      EXPECT_NEAR(loss, want, 1e-5 * std::max(1.0, std::fabs(want))) << "rank " << rank << " step " << s + 1;
      EXPECT_EQ(steps[s]["stage"].get<int>(), c.stage);
      for (const auto& [name, value] : expected[s]["metrics"].items()) {
        ASSERT_TRUE(steps[s]["metrics"].contains(name)) << name << " missing at step " << s + 1;
        const double ours_value = steps[s]["metrics"][name].get<double>(), trl = value.get<double>();
        EXPECT_NEAR(ours_value, trl, 2e-5 * std::max(1.0, std::fabs(trl))) << name << " rank " << rank << " step " << s + 1;
      }
    }
    if (c.type == "dpo" && !c.from_adapter && (c.loss_type == "sigmoid" || c.loss_type == "robust")) {
      // The policy is its reference at the first step: every pair's loss is -log sigma(0).
      EXPECT_NEAR(steps[0]["loss"].get<double>(), std::log(2.0), 1e-6);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    TypesRanksAndStages, PreferenceReference,
    ::testing::Values(Case{"DpoSigmoid_1Rank", "dpo", "sigmoid", 0, 1, 0},
                      Case{"DpoSigmoid_2Ranks_Stage2", "dpo", "sigmoid", 0, 2, 2},
                      Case{"DpoSigmoid_4Ranks_Stage3", "dpo", "sigmoid", 0, 4, 3},
                      Case{"DpoIpo_2Ranks_Stage1", "dpo", "ipo", 0, 2, 1},
                      Case{"DpoHinge_1Rank", "dpo", "hinge", 0, 1, 0},
                      Case{"DpoRobust_4Ranks_Stage2", "dpo", "robust", 0.1, 4, 2},
                      Case{"DpoFromAdapter_2Ranks_Stage2", "dpo", "sigmoid", 0, 2, 2, true},
                      Case{"Orpo_1Rank", "orpo", "", 0, 1, 0},
                      Case{"Orpo_2Ranks_Stage3", "orpo", "", 0, 2, 3},
                      Case{"Orpo_4Ranks_Stage1", "orpo", "", 0, 4, 1}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace qlora
