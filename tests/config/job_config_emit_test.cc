// EmitResolvedJobYaml: the resolved YAML parses back to an equal JobConfig (every good fixture
// and configs with non-default values everywhere), and it states the stage and why.
#include "common/config/job_config_emit.h"

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/config/config_test_util.h"

namespace qlora {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// Parses the emission of `c` back and expects the same config.
void ExpectRoundTrip(const JobConfig& c) {
  const std::string yaml = EmitResolvedJobYaml(c);
  ParseOptions options;
  options.check_paths = false;
  absl::StatusOr<JobConfig> again = ParseJobConfig(yaml, options);
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << yaml;
  EXPECT_TRUE(*again == c) << "re-parsed config differs; emitted:\n"
                           << yaml << "\nre-emitted:\n"
                           << EmitResolvedJobYaml(*again);
  // The emission is canonical: emitting the re-parsed config gives the same text.
  EXPECT_EQ(EmitResolvedJobYaml(*again), yaml);
}

std::vector<std::string> GoodFixtureNames() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const fs::directory_entry& e :
       fs::directory_iterator(testing::JobFixturesDir() + "/good", ec)) {
    if (e.path().extension() == ".yaml") names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

class ConfigGoodFileTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ConfigGoodFileTest, ParsesAndRoundTrips) {
  const std::string name = GetParam();
  absl::StatusOr<JobConfig> c = testing::ParseNoPaths(
      testing::ReadFile(testing::JobFixturesDir() + "/good/" + name), name);
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectRoundTrip(*c);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ConfigGoodFileTest, ::testing::ValuesIn(GoodFixtureNames()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string id = info.param.substr(0, info.param.size() - 5);
                           std::replace(id.begin(), id.end(), '-', '_');
                           return id;
                         });

TEST(ConfigEmitTest, GoodFixturesExist) { EXPECT_GE(GoodFixtureNames().size(), 3u); }

TEST(ConfigEmitTest, StatesTheStageAndItsReason) {
  absl::StatusOr<JobConfig> c = testing::ParseNoPaths("base_model: m\nadapter: {type: lora}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  const std::string yaml = EmitResolvedJobYaml(*c);
  EXPECT_THAT(yaml, HasSubstr("stage: auto"));
  EXPECT_THAT(yaml, HasSubstr("zero_stage_reason: \"not set in the job file"));
  // The workers read the resolved file: it must stay theirs to plan.
  absl::StatusOr<JobConfig> again = testing::ParseNoPaths(yaml);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->backend.strategy.zero_stage_auto);
  EXPECT_EQ(again->backend.strategy.zero_stage_reason, c->backend.strategy.zero_stage_reason);
}

TEST(ConfigEmitTest, NonDefaultValuesEverywhereRoundTrip) {
  JobConfig c;
  c.name = "null";  // a string that YAML would read as null if unquoted
  c.base_model = "/models/tiny llama";
  c.base_model_path = "/models/tiny llama";
  c.input_features = {{"question", "text"}, {"context", "text"}};
  c.output_features = {{"answer", "text"}};
  c.lora.r = 64;
  c.lora.alpha = 0.1 + 0.2;  // not exactly representable as a short decimal
  c.lora.dropout = 0;
  c.lora.target_modules = {"gate_proj", "up_proj"};
  c.lora.use_rslora = true;
  c.lora.merge_adapter_into_base_model = true;
  c.quantization.quant_type = QuantType::kFP4;
  c.quantization.double_quant = false;
  c.quantization.compute_dtype = ComputeDtype::kFloat32;
  c.quantization.blocksize = 4096;
  c.backend.type = BackendType::kRay;
  c.backend.use_gpu = false;
  c.backend.num_workers = 3;
  c.backend.strategy.zero_stage = 1;
  c.backend.strategy.zero_stage_reason = "set in the job file";
  c.backend.strategy.reduce_bucket_size = 123456789;
  c.backend.strategy.allgather_bucket_size = 2;
  c.backend.strategy.overlap_comm = false;
  c.backend.strategy.contiguous_gradients = false;
  c.trainer.batch_size = 3;
  c.trainer.gradient_accumulation_steps = 5;
  c.trainer.eval_batch_size = 7;
  c.trainer.learning_rate = 1.0 / 3.0;
  c.trainer.epochs = 0;
  c.trainer.train_steps = 1000;
  c.trainer.optimizer = OptimizerType::kAdam;
  c.trainer.weight_decay = 1e-300;
  c.trainer.beta1 = 0.0;
  c.trainer.beta2 = 0.9999999999999999;
  c.trainer.eps = 1e-12;
  c.trainer.lr_scheduler = LrScheduler::kConstant;
  c.trainer.warmup_fraction = 1.0;
  c.trainer.max_grad_norm = 0;
  c.trainer.steps_per_checkpoint = 10;
  c.trainer.eval_steps = 20;
  c.trainer.gradient_checkpointing = CheckpointingMode::kAuto;
  c.trainer.max_memory_gib = 23.75;
  c.trainer.seed = 18446744073709551615u;
  c.data.train_path = "/data/train: \"quoted\".jsonl";
  c.data.validation_path = "";
  c.data.validation_fraction = 0.25;
  c.data.format = DatasetFormat::kCsv;
  c.data.prompt_template = "Q: {question}\n\tC: {context}\nA: ";
  c.data.max_sequence_length = 131072;
  c.data.packing = true;
  c.data.malformed_records = MalformedRecords::kSkip;
  c.data.test_fraction = 0.125;
  c.generation.temperature = 0.0;
  c.generation.top_p = 1.0 / 3.0;
  c.generation.max_new_tokens = 1;
  c.generation.do_sample = false;
  c.output_dir = "~/out";
  c.gguf_type = "q8_0";
  c.trainer.eval_samples = 3;
  c.trainer.eval_prompts = {"Name a colour.", "{\"instruction\": \"Say: \\\"hi\\\"\"}"};
  c.trainer.report_to_mlflow = true;
  c.lora.merge_adapter_into_base_model = true;  // a GGUF is made from the merged model
  ExpectRoundTrip(c);
}

// `qloractl validate` prints this: the Ludwig keys show as the service keys they became, each
// marked with its Ludwig name, and generation is kept.
TEST(ConfigEmitTest, LudwigSectionsShowAsTheKeysTheyBecame) {
  absl::StatusOr<JobConfig> c = testing::ParseNoPaths(
      "base_model: m\nadapter: {type: lora}\nprompt: {template: \"Q: {instruction}\"}\n"
      "preprocessing: {split: {probabilities: [0.9, 0.05, 0.05]}, global_max_sequence_length: 64}\n"
      "generation: {temperature: 0.25, max_new_tokens: 32}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  const std::string yaml = EmitResolvedJobYaml(*c);
  EXPECT_THAT(yaml, HasSubstr("prompt_template: \"Q: {instruction}\"  # Ludwig: prompt.template"));
  EXPECT_THAT(yaml, HasSubstr("max_sequence_length: 64  # Ludwig: preprocessing.global_max_sequence_length"));
  EXPECT_THAT(yaml, HasSubstr("validation_fraction: 0.05  # Ludwig: preprocessing.split.probabilities[1]"));
  EXPECT_THAT(yaml, HasSubstr("test_fraction: 0.05  # Ludwig: preprocessing.split.probabilities[2]"));
  EXPECT_THAT(yaml, HasSubstr("temperature: 0.25"));
  EXPECT_THAT(yaml, HasSubstr("max_new_tokens: 32"));
  EXPECT_THAT(yaml, ::testing::Not(HasSubstr("top_k")));  // unset stays unset
  ExpectRoundTrip(*c);
  EXPECT_THAT(EmitResolvedJobYaml(JobConfig{}), ::testing::Not(HasSubstr("generation")));
}

TEST(ConfigEmitTest, GradientCheckpointingModesRoundTrip) {
  for (const char* trainer : {"{enable_gradient_checkpointing: false}", "{}",
                              "{enable_gradient_checkpointing: auto}",
                              "{enable_gradient_checkpointing: auto, max_memory_gib: 24}",
                              "{offload_activation_layers: 6}",
                              "{offload_activation_layers: auto}",
                              "{offload_activation_layers: auto, max_host_memory_gib: 96}",
                              "{dequantized_weight_layers: 5}",
                              "{enable_gradient_checkpointing: false, "
                              "dequantized_weight_layers: auto, max_memory_gib: 36}"}) {
    absl::StatusOr<JobConfig> c = testing::ParseNoPaths(
        absl::StrCat("base_model: m\nadapter: {type: lora}\ntrainer: ", trainer, "\n"));
    ASSERT_TRUE(c.ok()) << c.status();
    ExpectRoundTrip(*c);
  }
  JobConfig c;
  EXPECT_THAT(EmitResolvedJobYaml(c), HasSubstr("enable_gradient_checkpointing: true"));
  EXPECT_THAT(EmitResolvedJobYaml(c), ::testing::Not(HasSubstr("max_memory_gib")));
  c.trainer.gradient_checkpointing = CheckpointingMode::kAuto;
  c.trainer.max_memory_gib = 24;
  EXPECT_THAT(EmitResolvedJobYaml(c), HasSubstr("enable_gradient_checkpointing: auto"));
  EXPECT_THAT(EmitResolvedJobYaml(c), HasSubstr("max_memory_gib: 24"));
  EXPECT_THAT(EmitResolvedJobYaml(c), ::testing::Not(HasSubstr("offload_activation_layers")));
  c.trainer.offload_activation_auto = true;
  EXPECT_THAT(EmitResolvedJobYaml(c), HasSubstr("offload_activation_layers: auto"));
  EXPECT_THAT(EmitResolvedJobYaml(c), ::testing::Not(HasSubstr("max_host_memory_gib")));
  c.trainer.max_host_memory_gib = 96;
  EXPECT_THAT(EmitResolvedJobYaml(c), HasSubstr("max_host_memory_gib: 96"));
}

TEST(ConfigEmitTest, DdpAndNoQuantizationRoundTrip) {
  absl::StatusOr<JobConfig> c = testing::ParseNoPaths(
      "base_model: m\nadapter: {type: lora}\nquantization: null\n"
      "backend: {trainer: {strategy: ddp}}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectRoundTrip(*c);
  EXPECT_THAT(EmitResolvedJobYaml(*c), HasSubstr("quantization: ~"));
}

TEST(ConfigEmit, DeepSpeedKeysWithoutEffectAreMarkedSo) {
  const std::string yaml = EmitResolvedJobYaml(JobConfig{});
  for (const char* key : {"allgather_bucket_size", "overlap_comm", "contiguous_gradients"}) {
    const size_t at = yaml.find(key);
    ASSERT_NE(at, std::string::npos) << key;
    const std::string line = yaml.substr(at, yaml.find('\n', at) - at);
    EXPECT_NE(line.find("# accepted for DeepSpeed compatibility; no effect here"), std::string::npos)
        << line;
  }
  EXPECT_EQ(yaml.find("reduce_bucket_size: 500000000  #"), std::string::npos)
      << "reduce_bucket_size is used (the strategy's bucket size)";
}

}  // namespace
}  // namespace qlora
