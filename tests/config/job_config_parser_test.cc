// ParseJobConfig on valid job files: the original Ludwig file verbatim, every default, every
// form of the strategy, the shapes of optimizer/scheduler/target_modules, the dataset options.
#include "common/config/job_config_parser.h"

#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/config/job_config_emit.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/config/config_test_util.h"

namespace qlora {
namespace {

using ::qlora::testing::kLudwigOriginal;
using ::qlora::testing::ParseNoPaths;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A minimal valid file; tests append a section to it.
constexpr char kMinimal[] = "base_model: org/model\nadapter: {type: lora}\n";

JobConfig ParseOk(const std::string& yaml) {
  absl::StatusOr<JobConfig> config = ParseNoPaths(yaml);
  EXPECT_TRUE(config.ok()) << config.status() << "\n--- input ---\n" << yaml;
  return config.ok() ? *config : JobConfig{};
}

TEST(ConfigParserTest, LudwigOriginalVerbatimParsesWithStage2FromTheFile) {
  const JobConfig c = ParseOk(kLudwigOriginal);
  EXPECT_EQ(c.model_type, "llm");
  EXPECT_EQ(c.base_model, "meta-llama/Llama-2-7b-hf");
  EXPECT_EQ(c.base_model_path, "meta-llama/Llama-2-7b-hf");  // check_paths=false: as written
  ASSERT_EQ(c.input_features.size(), 1u);
  EXPECT_EQ(c.input_features[0].name, "instruction");
  ASSERT_EQ(c.output_features.size(), 1u);
  EXPECT_EQ(c.output_features[0].name, "output");
  EXPECT_EQ(c.adapter_type, "lora");
  EXPECT_TRUE(c.quantization.enabled);
  EXPECT_EQ(c.quantization.bits, 4);
  EXPECT_EQ(c.backend.type, BackendType::kRay);
  EXPECT_TRUE(c.backend.use_gpu);
  EXPECT_EQ(c.backend.strategy.type, StrategyType::kDeepSpeed);
  EXPECT_EQ(c.backend.strategy.zero_stage, 2);
  EXPECT_EQ(c.backend.strategy.zero_stage_reason, "set in the job file");
  EXPECT_EQ(c.trainer.type, TrainerType::kFinetune);
  EXPECT_EQ(c.trainer.batch_size, 1);
  EXPECT_EQ(c.trainer.gradient_accumulation_steps, 4);
  EXPECT_EQ(c.data.train_path, "train.jsonl");  // from the override
}

TEST(ConfigParserTest, LudwigOriginalFixtureIsTheSameFile) {
  EXPECT_EQ(testing::ReadFile(testing::JobFixturesDir() + "/good/ludwig_original.yaml"),
            kLudwigOriginal);
}

TEST(ConfigParserTest, JobNamesArePrintable) {
  const std::string base = "base_model: /m\nadapter: {type: lora}\n";
  EXPECT_TRUE(ParseNoPaths(base + "name: \"r\u00e9sum\u00e9 run 7\"\n").ok());
  for (const std::string& bad :
       {std::string("name: \"job\\e[2Kforged\"\n"), std::string("name: \"a\\tb\"\n"),
        std::string("name: \"csi\\u009b\"\n"), "name: " + std::string(129, 'x') + "\n"}) {
    absl::StatusOr<JobConfig> c = ParseNoPaths(base + bad);
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(c.status().message()), HasSubstr("name:")) << c.status();
  }
  ParseOptions options;
  options.check_paths = false;
  options.dataset_override = "train.jsonl";
  options.name_override = "from\x1b[31mthe CLI";
  EXPECT_FALSE(ParseJobConfig(base, options).ok()) << "the --name override is checked too";
}

// Names show in listings as written: bidirectional formatting characters (which would show a
// name reversed, or reorder the columns after it) and line separators are refused like control
// characters; other non-ASCII text is fine.
TEST(ConfigParserTest, JobNamesWithBidiOrLineSeparatorsAreRefused) {
  const std::string base = "base_model: /m\nadapter: {type: lora}\n";
  EXPECT_TRUE(ParseNoPaths(base + "name: \"\u05e9\u05dc\u05d5\u05dd run\"\n").ok());
  for (const char* bad : {"\u202e", "\u202a", "\u2066", "\u2069", "\u200f", "\u061c",
                          "\u2028", "\u2029"}) {
    absl::StatusOr<JobConfig> c = ParseNoPaths(base + "name: \"cat" + bad + "gpj.exe\"\n");
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(c.status().message()),
                HasSubstr("name: bidirectional or line-layout control character at byte 3"));
  }
}

// An error quotes a bad value's start, not all of it: a 100,000-character value made an error
// message larger than a gRPC client accepts (issue 58).
TEST(ConfigParserTest, AnErrorQuotesOnlyTheStartOfALongValue) {
  const std::string base = "base_model: /m\nadapter: {type: lora}\n";
  absl::StatusOr<JobConfig> c =
      ParseNoPaths(base + "trainer: {batch_size: \"" + std::string(100000, '7') + "x\"}\n");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("trainer.batch_size"));
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("... (100001 bytes)"));
  EXPECT_LT(c.status().message().size(), 400u);
}

// Found by tests/fuzz/job_config_fuzzer: yaml-cpp passed invalid UTF-8 through and its emitter
// wrote U+FFFD instead, so the stored resolved copy differed from the validated file.
TEST(ConfigParserTest, JobFilesNamesAndPathsMustBeUtf8) {
  const std::string base = "base_model: /m\nadapter: {type: lora}\n";
  EXPECT_TRUE(ParseNoPaths(base + "input_features: [{name: \"\xc3\xa9\xe6\x97\xa5\xf0\x9f\x99\x82\"}]\n").ok());
  for (const std::string& bad : {std::string("\xff"), std::string("\xc0\xaf"),
                                 std::string("\xed\xa0\x80"), std::string("\xf4\x90\x80\x80"),
                                 std::string("\xe6\x97")}) {
    absl::StatusOr<JobConfig> c = ParseNoPaths(base + "input_features: [{name: x" + bad + "}]\n");
    ASSERT_FALSE(c.ok()) << absl::CHexEscape(bad);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(c.status().message()), HasSubstr("job.yaml:3: not valid UTF-8"));
  }
  ParseOptions options;
  options.check_paths = false;
  options.dataset_override = "train.jsonl";
  options.name_override = "run\xff";
  EXPECT_THAT(std::string(ParseJobConfig(base, options).status().message()),
              HasSubstr("name: not valid UTF-8"));
  options.name_override = "";
  options.dataset_override = "/data/tr\xe4in.jsonl";  // Latin-1, not UTF-8
  EXPECT_THAT(std::string(ParseJobConfig(base, options).status().message()),
              HasSubstr("--dataset is not a valid UTF-8 path"));
  options.dataset_override = "train.jsonl";
  options.base_dir = "/home/\xe4";
  EXPECT_FALSE(ParseJobConfig(base, options).ok());
}

// Found by tests/fuzz/job_config_fuzzer: on these, yaml-cpp's LoadAll never returned and grew
// without bound (a coordinator could be taken down by one SubmitJob).
TEST(ConfigParserTest, StreamsThatStallTheYamlParserAreRefused) {
  for (const std::string& bad : {std::string(","), std::string(", a"),
                                 std::string("# c\x00\x00m:$ll:\n,   s: d\n", 21),
                                 std::string("base_model: m\n--- ,\n")}) {
    absl::StatusOr<JobConfig> c = ParseNoPaths(bad);
    ASSERT_FALSE(c.ok()) << absl::CHexEscape(bad);
    EXPECT_THAT(std::string(c.status().message()), HasSubstr("not valid YAML")) << c.status();
  }
}

TEST(ConfigParserTest, DefaultsAreResolved) {
  const JobConfig c = ParseOk("base_model: org/model\nadapter: {type: lora}\n");
  EXPECT_EQ(c.name, "");
  EXPECT_EQ(c.model_type, "llm");
  EXPECT_EQ(c.input_features.size(), 1u);
  EXPECT_EQ(c.input_features[0].name, "instruction");
  EXPECT_EQ(c.output_features[0].name, "output");
  EXPECT_EQ(c.lora.r, 8);
  EXPECT_EQ(c.lora.alpha, 16.0);
  EXPECT_EQ(c.lora.dropout, 0.05);
  EXPECT_THAT(c.lora.target_modules, ElementsAre("q_proj", "v_proj"));
  EXPECT_FALSE(c.lora.use_rslora);
  EXPECT_FALSE(c.lora.merge_adapter_into_base_model);
  EXPECT_TRUE(c.quantization.enabled);  // absent quantization: 4-bit (a QLoRA service)
  EXPECT_EQ(c.quantization.bits, 4);
  EXPECT_EQ(c.quantization.quant_type, QuantType::kNF4);
  EXPECT_TRUE(c.quantization.double_quant);
  EXPECT_EQ(c.quantization.compute_dtype, ComputeDtype::kBFloat16);
  EXPECT_EQ(c.quantization.blocksize, 64);
  EXPECT_EQ(c.backend.type, BackendType::kLocal);
  EXPECT_EQ(c.backend.num_workers, 0);
  EXPECT_EQ(c.backend.strategy.type, StrategyType::kDeepSpeed);
  EXPECT_EQ(c.backend.strategy.zero_stage, 2);
  EXPECT_THAT(c.backend.strategy.zero_stage_reason, HasSubstr("not set in the job file"));
  EXPECT_EQ(c.trainer.batch_size, 1);
  EXPECT_EQ(c.trainer.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.trainer.learning_rate, 2e-4);
  EXPECT_EQ(c.trainer.epochs, 3);
  EXPECT_EQ(c.trainer.optimizer, OptimizerType::kAdamW);
  EXPECT_EQ(c.trainer.lr_scheduler, LrScheduler::kCosine);
  EXPECT_EQ(c.trainer.warmup_fraction, 0.03);
  EXPECT_EQ(c.trainer.max_grad_norm, 0.3);
  EXPECT_EQ(c.trainer.gradient_checkpointing, CheckpointingMode::kAll);
  EXPECT_EQ(c.trainer.max_memory_gib, 0);  // unset: the worker's free GPU memory
  EXPECT_EQ(c.trainer.seed, 42u);
  EXPECT_EQ(c.data.format, DatasetFormat::kAuto);
  EXPECT_EQ(c.data.max_sequence_length, 512);
  EXPECT_EQ(c.data.malformed_records, MalformedRecords::kFail);
  EXPECT_EQ(c.output_dir, "");
}

// The default stage's reason must explain the choice, as the issue asks.
TEST(ConfigParserTest, DefaultStageReasonExplainsTheOriginalDefault) {
  const std::string reason = ParseOk(kMinimal).backend.strategy.zero_stage_reason;
  EXPECT_THAT(reason, HasSubstr("stage 2"));
  EXPECT_THAT(reason, HasSubstr("defaulted to stage 3"));
  EXPECT_THAT(reason, HasSubstr("unquantized"));
  EXPECT_THAT(reason, HasSubstr("4-bit"));
}

struct StrategyCase {
  std::string backend_yaml;  // the backend section, or "" for none
  std::string type;
  int stage;
  std::string reason_part;
};

class ConfigStrategyFormsTest : public ::testing::TestWithParam<StrategyCase> {};

TEST_P(ConfigStrategyFormsTest, ResolvesTypeStageAndReason) {
  const StrategyCase& p = GetParam();
  const JobConfig c = ParseOk(absl::StrCat(kMinimal, p.backend_yaml));
  EXPECT_EQ(EnumName(c.backend.strategy.type), p.type);
  EXPECT_EQ(c.backend.strategy.zero_stage, p.stage);
  EXPECT_THAT(c.backend.strategy.zero_stage_reason, HasSubstr(p.reason_part));
  // A stage neither written nor fixed by strategy ddp is the workers' to plan.
  const bool planned = p.type == "deepspeed" && p.reason_part != "set in the job file";
  EXPECT_EQ(c.backend.strategy.zero_stage_auto, planned) << p.backend_yaml;
}

TEST(ConfigParserTest, StreamedBaseWeightsWrittenFixTheStage) {
  const JobConfig c = ParseOk(absl::StrCat(kMinimal, "backend: {trainer: {strategy: {zero_optimization: "
                                                     "{offload_param: {device: cpu}}}}}\n"));
  EXPECT_EQ(c.backend.strategy.zero_stage, 2);
  EXPECT_FALSE(c.backend.strategy.zero_stage_auto);
  EXPECT_THAT(c.backend.strategy.zero_stage_reason, HasSubstr("offload_param's device cpu"));
}

INSTANTIATE_TEST_SUITE_P(
    AllForms, ConfigStrategyFormsTest,
    ::testing::Values(
        StrategyCase{"", "deepspeed", 2, "not set in the job file"},
        StrategyCase{"backend: {type: ray}\n", "deepspeed", 2, "not set in the job file"},
        StrategyCase{"backend: {trainer: {strategy: deepspeed}}\n", "deepspeed", 2,
                     "not set in the job file"},
        StrategyCase{"backend: {trainer: {strategy: ddp}}\n", "ddp", 0, "ZeRO stage 0"},
        StrategyCase{"backend: {trainer: {strategy: {type: ddp}}}\n", "ddp", 0, "stage 0"},
        StrategyCase{"backend: {trainer: {strategy: {type: deepspeed}}}\n", "deepspeed", 2,
                     "not set in the job file"},
        StrategyCase{"backend: {trainer: {strategy: {zero_optimization: {overlap_comm: false}}}}\n",
                     "deepspeed", 2, "not set in the job file"},
        StrategyCase{"backend: {trainer: {strategy: {type: deepspeed, zero_optimization: "
                     "{stage: auto}}}}\n",
                     "deepspeed", 2, "'auto' in the job file"},
        StrategyCase{"backend: {trainer: {strategy: {type: deepspeed, zero_optimization: "
                     "{stage: 0}}}}\n",
                     "deepspeed", 0, "set in the job file"},
        StrategyCase{"backend: {trainer: {strategy: {type: deepspeed, zero_optimization: "
                     "{stage: 1}}}}\n",
                     "deepspeed", 1, "set in the job file"},
        StrategyCase{"backend: {trainer: {strategy: {type: deepspeed, zero_optimization: "
                     "{stage: 2}}}}\n",
                     "deepspeed", 2, "set in the job file"},
        StrategyCase{"quantization: null\n", "deepspeed", 2, "write stage: 3"},
        StrategyCase{"backend: {trainer: {strategy: {type: deepspeed, zero_optimization: "
                     "{stage: 3}}}}\n",
                     "deepspeed", 3, "set in the job file"}));

TEST(ConfigParserTest, ZeroOptimizationKnobs) {
  const JobConfig c = ParseOk(absl::StrCat(kMinimal, R"(backend:
  trainer:
    num_workers: 4
    use_gpu: false
    strategy:
      type: deepspeed
      zero_optimization:
        stage: 1
        reduce_bucket_size: 2e8
        allgather_bucket_size: 100000000
        overlap_comm: false
        contiguous_gradients: false
      bf16: {enabled: true}
      fp16: {enabled: auto}
)"));
  const StrategyConfig& s = c.backend.strategy;
  EXPECT_EQ(c.backend.num_workers, 4);
  EXPECT_FALSE(c.backend.use_gpu);
  EXPECT_EQ(s.zero_stage, 1);
  EXPECT_EQ(s.reduce_bucket_size, 200000000);
  EXPECT_EQ(s.allgather_bucket_size, 100000000);
  EXPECT_FALSE(s.overlap_comm);
  EXPECT_FALSE(s.contiguous_gradients);
}

// Stage 3 with DeepSpeed's parameter offload and the stage-3 tuning keys users paste: offload is
// read, the tuning keys are kept as written and the resolved file shows each with why it has
// no effect.
TEST(ConfigParserTest, StageThreeWithOffloadParamAndTuningKeys) {
  const JobConfig c = ParseOk(absl::StrCat(kMinimal, R"(backend:
  trainer:
    strategy:
      zero_optimization:
        stage: 3
        offload_param: {device: cpu, pin_memory: false}
        stage3_max_live_parameters: 1e9
        stage3_gather_16bit_weights_on_model_save: true
)"));
  const StrategyConfig& s = c.backend.strategy;
  EXPECT_EQ(s.zero_stage, 3);
  EXPECT_TRUE(s.offload_param);
  EXPECT_FALSE(s.offload_param_pin_memory);
  ASSERT_EQ(s.stage3_knobs.size(), 2u);
  EXPECT_EQ(s.stage3_knobs[0].first, "stage3_max_live_parameters");
  EXPECT_EQ(s.stage3_knobs[0].second, "1e9");
  const std::string resolved = EmitResolvedJobYaml(c);
  EXPECT_THAT(resolved, HasSubstr("offload_param: {device: cpu, pin_memory: false}"));
  EXPECT_THAT(resolved, HasSubstr("stage3_max_live_parameters: 1e9  # accepted; no effect here: "
                                  "at most two gathered layers are kept"));
  EXPECT_FALSE(ParseOk(kMinimal).backend.strategy.offload_param);
  EXPECT_THAT(EmitResolvedJobYaml(ParseOk(kMinimal)),
              HasSubstr("offload_param: {device: none, pin_memory: true}"));
}

// DeepSpeed's optimizer offload: the AdamW moments wait in host memory; read, shown resolved, off
// unless written, and its DeepSpeed-only keys accepted.
TEST(ConfigParserTest, OffloadOptimizerToTheHost) {
  const JobConfig c = ParseOk(absl::StrCat(kMinimal, R"(backend:
  trainer:
    strategy:
      zero_optimization:
        stage: 2
        offload_optimizer: {device: cpu, pin_memory: false, buffer_count: 4, fast_init: false}
)"));
  EXPECT_TRUE(c.backend.strategy.offload_optimizer);
  EXPECT_FALSE(c.backend.strategy.offload_optimizer_pin_memory);
  EXPECT_THAT(EmitResolvedJobYaml(c),
              HasSubstr("offload_optimizer: {device: cpu, pin_memory: false}"));
  EXPECT_EQ(ParseOk(EmitResolvedJobYaml(c)), c);
  const JobConfig none = ParseOk(absl::StrCat(kMinimal, R"(backend:
  trainer:
    strategy: {zero_optimization: {offload_optimizer: {device: none}}}
)"));
  EXPECT_FALSE(none.backend.strategy.offload_optimizer);
  EXPECT_FALSE(ParseOk(kMinimal).backend.strategy.offload_optimizer);
  EXPECT_THAT(EmitResolvedJobYaml(ParseOk(kMinimal)),
              HasSubstr("offload_optimizer: {device: none, pin_memory: true}"));
  EXPECT_THAT(ParseNoPaths(absl::StrCat(kMinimal, R"(backend:
  trainer:
    strategy: {zero_optimization: {offload_optimizer: {device: gpu}}}
)")).status().message(),
              HasSubstr("must be cpu or none, got \"gpu\""));
}

TEST(ConfigParserTest, AdapterFields) {
  const JobConfig c = ParseOk(R"(base_model: org/model
adapter:
  type: lora
  r: 16
  alpha: 32
  dropout: 0.1
  target_modules: [q_proj, k_proj, v_proj, o_proj]
  use_rslora: true
  bias_type: none
  postprocessor: {merge_adapter_into_base_model: true, progressbar: true}
)");
  EXPECT_EQ(c.lora.r, 16);
  EXPECT_EQ(c.lora.alpha, 32.0);
  EXPECT_EQ(c.lora.dropout, 0.1);
  EXPECT_THAT(c.lora.target_modules, ElementsAre("q_proj", "k_proj", "v_proj", "o_proj"));
  EXPECT_TRUE(c.lora.use_rslora);
  // Allowed with 4-bit: the merge goes into a dequantized bf16 copy.
  EXPECT_TRUE(c.quantization.enabled);
  EXPECT_TRUE(c.lora.merge_adapter_into_base_model);
}

TEST(ConfigParserTest, AllLinearExpandsToTheSevenLlamaLayers) {
  const auto expected = ElementsAre("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                    "up_proj", "down_proj");
  EXPECT_THAT(ParseOk("base_model: m\nadapter: {type: lora, target_modules: all-linear}\n")
                  .lora.target_modules,
              expected);
  EXPECT_THAT(ParseOk("base_model: m\nadapter: {type: lora, target_modules: [all-linear]}\n")
                  .lora.target_modules,
              expected);
}

TEST(ConfigParserTest, QuantizationFields) {
  const JobConfig c = ParseOk(absl::StrCat(
      "base_model: m\nadapter: {type: lora}\n",
      "quantization: {bits: 4, bnb_4bit_quant_type: fp4, bnb_4bit_use_double_quant: false, "
      "bnb_4bit_compute_dtype: float16, blocksize: 128}\n"));
  EXPECT_EQ(c.quantization.quant_type, QuantType::kFP4);
  EXPECT_FALSE(c.quantization.double_quant);
  EXPECT_EQ(c.quantization.compute_dtype, ComputeDtype::kFloat16);
  EXPECT_EQ(c.quantization.blocksize, 128);
}

TEST(ConfigParserTest, Float8BaseForwardIsOptInAndNeedsBfloat16) {
  EXPECT_FALSE(ParseOk(kMinimal).quantization.float8_base_forward);
  EXPECT_TRUE(ParseOk(absl::StrCat(kMinimal, "quantization: {bits: 4, float8_base_forward: true}\n"))
                  .quantization.float8_base_forward);
  absl::StatusOr<JobConfig> c = ParseNoPaths(absl::StrCat(
      kMinimal, "quantization: {bits: 4, bnb_4bit_compute_dtype: float16, "
                "float8_base_forward: true}\n"));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("quantization.float8_base_forward"));
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("bfloat16"));
}

TEST(ConfigParserTest, QuantizationNullTurnsItOff) {
  EXPECT_FALSE(ParseOk(absl::StrCat(kMinimal, "quantization: null\n")).quantization.enabled);
  EXPECT_FALSE(ParseOk(absl::StrCat(kMinimal, "quantization: ~\n")).quantization.enabled);
}

TEST(ConfigParserTest, TrainerFieldsAndOptimizerMapping) {
  const JobConfig c = ParseOk(absl::StrCat(kMinimal, R"(trainer:
  type: finetune
  batch_size: 2
  eval_batch_size: 4
  gradient_accumulation_steps: 8
  learning_rate: 1.0e-4
  epochs: 0
  train_steps: 100
  optimizer: {type: adam, weight_decay: 0.01, betas: [0.8, 0.95], eps: 1.0e-6}
  learning_rate_scheduler: {decay: linear, warmup_fraction: 0.1}
  gradient_clipping: {clipglobalnorm: 1.0}
  enable_gradient_checkpointing: false
  steps_per_checkpoint: 50
  eval_steps: 25
  seed: 7
)"));
  const TrainerConfig& t = c.trainer;
  EXPECT_EQ(t.batch_size, 2);
  EXPECT_EQ(t.eval_batch_size, 4);
  EXPECT_EQ(t.gradient_accumulation_steps, 8);
  EXPECT_EQ(t.learning_rate, 1e-4);
  EXPECT_EQ(t.epochs, 0);  // allowed because train_steps > 0
  EXPECT_EQ(t.train_steps, 100);
  EXPECT_EQ(t.optimizer, OptimizerType::kAdam);
  EXPECT_EQ(t.weight_decay, 0.01);
  EXPECT_EQ(t.beta1, 0.8);
  EXPECT_EQ(t.beta2, 0.95);
  EXPECT_EQ(t.eps, 1e-6);
  EXPECT_EQ(t.lr_scheduler, LrScheduler::kLinear);
  EXPECT_EQ(t.warmup_fraction, 0.1);
  EXPECT_EQ(t.max_grad_norm, 1.0);
  EXPECT_EQ(t.gradient_checkpointing, CheckpointingMode::kNone);
  EXPECT_EQ(t.steps_per_checkpoint, 50);
  EXPECT_EQ(t.eval_steps, 25);
  EXPECT_EQ(t.seed, 7u);
}

TEST(ConfigParserTest, PreferenceTypesReadTrlsKnobsAndColumns) {
  const JobConfig dpo = ParseOk(absl::StrCat(kMinimal, "trainer: {type: dpo, beta: 0.25, loss_type: ipo}\n"));
  EXPECT_EQ(dpo.trainer.type, TrainerType::kDpo);
  EXPECT_EQ(dpo.trainer.beta, 0.25);
  EXPECT_EQ(dpo.trainer.loss_type, PreferenceLoss::kIpo);
  ASSERT_EQ(dpo.input_features.size(), 1u);
  EXPECT_EQ(dpo.input_features[0].name, "prompt");  // TRL's columns by default
  ASSERT_EQ(dpo.output_features.size(), 2u);
  EXPECT_EQ(dpo.output_features[0].name, "chosen");
  EXPECT_EQ(dpo.output_features[1].name, "rejected");
  const JobConfig robust = ParseOk(absl::StrCat(kMinimal, "trainer: {type: dpo, loss_type: robust, label_smoothing: 0.1}\n"));
  EXPECT_EQ(robust.trainer.label_smoothing, 0.1);
  const JobConfig orpo = ParseOk(absl::StrCat(
      kMinimal, "input_features: [{name: q, type: text}]\noutput_features: [{name: good, type: text}, {name: bad, type: text}]\n"
                "trainer: {type: orpo, beta: 0.1}\n"));
  EXPECT_EQ(orpo.trainer.type, TrainerType::kOrpo);
  EXPECT_EQ(orpo.output_features[1].name, "bad");
}

TEST(ConfigParserTest, PreferenceKnobsWhereTheyHaveNoEffectAreRefused) {
  const std::pair<std::string, std::string> cases[] = {
      {"trainer: {beta: 0.1}\n", "applies to preference tuning only"},
      {"trainer: {type: orpo, loss_type: sigmoid}\n", "is DPO's"},
      {"trainer: {type: dpo, label_smoothing: 0.1}\n", "loss_type robust only"},
      {"trainer: {type: dpo, loss_type: robust, label_smoothing: 0.5}\n", "label_smoothing"},
      {"trainer: {type: dpo, loss_type: kto}\n", "loss_type"},
      {"trainer: {type: dpo, beta: 0}\n", "beta"},
      {"trainer: {type: dpo}\ndata: {packing: true}\n", "packing is for finetune"},
      {"trainer: {type: dpo}\noutput_features: [{name: chosen, type: text}]\n", "two output features"},
      {"trainer: {type: dpo}\ninput_features: [{name: x, type: text}]\noutput_features: [{name: x, type: text}, {name: y, type: text}]\n",
       "named twice"},
      {"trainer: {type: none}\n", "finetune, dpo or orpo"},
  };
  for (const auto& [yaml, want] : cases) {
    const absl::StatusOr<JobConfig> c = ParseNoPaths(absl::StrCat(kMinimal, yaml));
    ASSERT_FALSE(c.ok()) << yaml;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << yaml;
    EXPECT_THAT(c.status().message(), HasSubstr(want)) << yaml;
  }
}

TEST(ConfigParserTest, GradientCheckpointingTrueFalseAutoAndItsBudget) {
  auto mode = [](const std::string& trainer) {
    return ParseOk(absl::StrCat(kMinimal, "trainer: ", trainer, "\n")).trainer;
  };
  EXPECT_EQ(mode("{enable_gradient_checkpointing: true}").gradient_checkpointing,
            CheckpointingMode::kAll);
  EXPECT_EQ(mode("{enable_gradient_checkpointing: false}").gradient_checkpointing,
            CheckpointingMode::kNone);
  const TrainerConfig automatic = mode("{enable_gradient_checkpointing: auto}");
  EXPECT_EQ(automatic.gradient_checkpointing, CheckpointingMode::kAuto);
  EXPECT_EQ(automatic.max_memory_gib, 0);
  const TrainerConfig budget =
      mode("{enable_gradient_checkpointing: auto, max_memory_gib: 23.5}");
  EXPECT_EQ(budget.gradient_checkpointing, CheckpointingMode::kAuto);
  EXPECT_EQ(budget.max_memory_gib, 23.5);
  EXPECT_EQ(automatic.offload_activation_layers, 0);  // off unless asked for
  EXPECT_EQ(mode("{offload_activation_layers: 8}").offload_activation_layers, 8);
  EXPECT_FALSE(mode("{offload_activation_layers: 8}").offload_activation_auto);
  EXPECT_FALSE(automatic.offload_activation_auto);
  const TrainerConfig offload_auto = mode("{offload_activation_layers: auto}");
  EXPECT_TRUE(offload_auto.offload_activation_auto);
  EXPECT_EQ(offload_auto.offload_activation_layers, 0);
  EXPECT_EQ(offload_auto.max_host_memory_gib, 0);  // unset: half the host's available memory
  EXPECT_EQ(mode("{offload_activation_layers: auto, max_host_memory_gib: 96.5}").max_host_memory_gib,
            96.5);
  EXPECT_EQ(automatic.dequantized_weight_layers, 0);  // off unless asked for
  EXPECT_FALSE(automatic.dequantized_weights_auto);
  EXPECT_EQ(mode("{dequantized_weight_layers: 12}").dequantized_weight_layers, 12);
  // auto with a budget and no checkpointing: the budget is the held layers'.
  const TrainerConfig held =
      mode("{enable_gradient_checkpointing: false, dequantized_weight_layers: auto, "
           "max_memory_gib: 36}");
  EXPECT_TRUE(held.dequantized_weights_auto);
  EXPECT_EQ(held.max_memory_gib, 36);
  EXPECT_EQ(held.gradient_checkpointing, CheckpointingMode::kNone);
  // Checkpointing every layer with a budget: it sizes long rows' MLP tiles and bounds what
  // offload_activation_layers: auto moves (the rows of 16,384 tokens under 7.9 GiB).
  const TrainerConfig every =
      mode("{enable_gradient_checkpointing: true, offload_activation_layers: auto, "
           "max_memory_gib: 7.9}");
  EXPECT_EQ(every.gradient_checkpointing, CheckpointingMode::kAll);
  EXPECT_TRUE(every.offload_activation_auto);
  EXPECT_EQ(every.max_memory_gib, 7.9);
}

TEST(ConfigParserTest, GradientCheckpointingBadValuesNameTheField) {
  struct Case {
    const char* trainer;
    const char* message;
  };
  for (const Case& k : std::vector<Case>{
           {"{enable_gradient_checkpointing: sometimes}",
            "trainer.enable_gradient_checkpointing: must be true, false or auto, got 'sometimes'"},
           {"{enable_gradient_checkpointing: \"auto\"}",
            "trainer.enable_gradient_checkpointing: must be true, false or auto"},
           {"{enable_gradient_checkpointing: [auto]}",
            "trainer.enable_gradient_checkpointing: must be true, false or auto, got a list"},
           {"{enable_gradient_checkpointing: auto, max_memory_gib: 0}",
            "trainer.max_memory_gib: must be a number > 0 and <= 1000000, got 0"},
           {"{enable_gradient_checkpointing: auto, max_memory_gib: -4}",
            "trainer.max_memory_gib: must be a number > 0 and <= 1000000, got -4"},
           {"{enable_gradient_checkpointing: auto, max_memory_gib: lots}",
            "trainer.max_memory_gib: must be a number"},
           {"{enable_gradient_checkpointing: false, max_memory_gib: 24}",
            "trainer.max_memory_gib: applies only with enable_gradient_checkpointing: true or "
            "auto (it is false), dequantized_weight_layers: auto or a ZeRO stage left to the "
            "service (stage: auto); set one or remove max_memory_gib"},
           {"{enable_gradient_checkpointing: false, dequantized_weight_layers: 4, "
            "max_memory_gib: 24}",
            "(it is false), dequantized_weight_layers: auto"},
           {"{offload_activation_layers: auto, max_host_memory_gib: 0}",
            "trainer.max_host_memory_gib: must be a number > 0 and <= 1000000, got 0"},
           {"{offload_activation_layers: auto, max_host_memory_gib: plenty}",
            "trainer.max_host_memory_gib: must be a number"},
           {"{max_host_memory_gib: 96}",
            "trainer.max_host_memory_gib: applies only with offload_activation_layers: auto"},
           {"{offload_activation_layers: 8, max_host_memory_gib: 96}",
            "trainer.max_host_memory_gib: applies only with offload_activation_layers: auto"},
           {"{dequantized_weight_layers: -2}",
            "trainer.dequantized_weight_layers: must be a number of layers (an integer >= 0) or "
            "auto, got '-2'"},
           {"{dequantized_weight_layers: [auto]}",
            "trainer.dequantized_weight_layers: must be a number of layers (an integer >= 0) or "
            "auto, got a list"},
           {"{offload_activation_layers: -1}",
            "trainer.offload_activation_layers: must be a number of layers (an integer >= 0) or "
            "auto, got '-1'"},
           {"{offload_activation_layers: some}",
            "trainer.offload_activation_layers: must be a number of layers (an integer >= 0) or "
            "auto, got 'some'"},
           {"{offload_activation_layers: \"auto\"}", "trainer.offload_activation_layers"},
       }) {
    // A written stage: a stage left to the service plans by max_memory_gib too.
    absl::StatusOr<JobConfig> c = ParseNoPaths(
        absl::StrCat(kMinimal, "trainer: ", k.trainer,
                     "\nbackend: {trainer: {strategy: {zero_optimization: {stage: 2}}}}\n"));
    ASSERT_FALSE(c.ok()) << k.trainer;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << k.trainer;
    EXPECT_THAT(std::string(c.status().message()), HasSubstr(k.message)) << k.trainer;
  }
}

TEST(ConfigParserTest, OptimizerAsBareNameAndSchedulerNone) {
  const JobConfig c = ParseOk(absl::StrCat(
      kMinimal, "trainer: {optimizer: adam, learning_rate_scheduler: {decay: none}, "
                "gradient_clipping: {clipglobalnorm: null}}\n"));
  EXPECT_EQ(c.trainer.optimizer, OptimizerType::kAdam);
  EXPECT_EQ(c.trainer.lr_scheduler, LrScheduler::kConstant);
  EXPECT_EQ(c.trainer.max_grad_norm, 0.0);  // null: no clipping
}

TEST(ConfigParserTest, ServiceFields) {
  ParseOptions options;
  options.check_paths = false;
  absl::StatusOr<JobConfig> c = ParseJobConfig(absl::StrCat(kMinimal, R"(name: my-run
dataset: data/train.jsonl
validation_dataset: data/val.jsonl
output_dir: /runs/my-run
data:
  format: jsonl
  prompt_template: "### Instruction:\n{instruction}\n### Response:\n"
  max_sequence_length: 1024
  packing: true
  malformed_records: skip
)"),
                                               options);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->name, "my-run");
  EXPECT_EQ(c->data.train_path, "data/train.jsonl");
  EXPECT_EQ(c->data.validation_path, "data/val.jsonl");
  EXPECT_EQ(c->output_dir, "/runs/my-run");
  EXPECT_EQ(c->data.format, DatasetFormat::kJsonl);
  EXPECT_EQ(c->data.prompt_template, "### Instruction:\n{instruction}\n### Response:\n");
  EXPECT_EQ(c->data.max_sequence_length, 1024);
  EXPECT_TRUE(c->data.packing);
  EXPECT_EQ(c->data.malformed_records, MalformedRecords::kSkip);
}

TEST(ConfigParserTest, OverridesReplaceTheFilesDatasets) {
  ParseOptions options;
  options.check_paths = false;
  options.dataset_override = "cli-train.jsonl";
  options.validation_dataset_override = "cli-val.jsonl";
  absl::StatusOr<JobConfig> c = ParseJobConfig(
      absl::StrCat(kMinimal, "dataset: file.jsonl\nvalidation_dataset: file-val.jsonl\n"),
      options);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->data.train_path, "cli-train.jsonl");
  EXPECT_EQ(c->data.validation_path, "cli-val.jsonl");
}

TEST(ConfigParserTest, MissingDatasetNamesTheFieldAndTheFlag) {
  ParseOptions options;
  options.check_paths = false;
  absl::StatusOr<JobConfig> c = ParseJobConfig(kLudwigOriginal, options);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("dataset"));
  EXPECT_THAT(c.status().message(), HasSubstr("--dataset"));
}

TEST(ConfigParserTest, FileLargerThanMaxBytesIsRefusedBeforeParsing) {
  std::string huge = kMinimal;
  while (huge.size() <= (1u << 20)) huge += "# padding padding padding padding padding padding\n";
  absl::StatusOr<JobConfig> c = ParseNoPaths(huge);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("job.yaml: the job file is"));
  EXPECT_THAT(c.status().message(), HasSubstr("1048576"));

  ParseOptions small;
  small.check_paths = false;
  small.dataset_override = "x";
  small.max_bytes = 16;
  EXPECT_EQ(ParseJobConfig(kMinimal, small).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ConfigParserTest, DeepNestingIsRefusedNotACrash) {
  const std::string deep = "trainer: " + std::string(100000, '[') + std::string(100000, ']');
  absl::StatusOr<JobConfig> c = ParseNoPaths(deep);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("job.yaml:1: not valid YAML: nested more than"));
}

TEST(ConfigParserTest, UnknownKeySuggestionsAtSeveralLevels) {
  struct Case {
    std::string yaml;
    std::string message;
  };
  for (const Case& k : {
           Case{"trainer:\n  batch_sise: 2\n",
                "job.yaml:4: trainer.batch_sise: unknown field; did you mean 'batch_size'?"},
           Case{"base_modle: x\n", "base_modle: unknown field; did you mean 'base_model'?"},
           Case{"trainer: {zero_optimization: {stage: 2}}\n",
                "did you mean 'backend.trainer.strategy.zero_optimization'?"},
           Case{"backend: {trainer: {strategy: {zero_optimisation: {stage: 2}}}}\n",
                "backend.trainer.strategy.zero_optimisation: unknown field; did you mean "
                "'zero_optimization'?"},
           // Other trainers' names get this file's place for the same setting.
           Case{"micro_batch_size: 4\n",
                "micro_batch_size: unknown field: 'micro_batch_size' is Axolotl's name; here it "
                "is 'trainer.batch_size'"},
           Case{"trainer: {lr: 0.0001}\n",
                "trainer.lr: unknown field: 'lr' is torchtune's name; here it is "
                "'trainer.learning_rate'"},
           Case{"num_epochs: 3\n", "here it is 'trainer.epochs'"},
           Case{"sequence_len: 2048\n", "here it is 'data.max_sequence_length'"},
           Case{"lora_r: 16\n", "here it is 'adapter.r'"},
           Case{"trainer: {weight_decay: 0.01}\n", "here it is 'trainer.optimizer.weight_decay'"},
       }) {
    absl::StatusOr<JobConfig> c = ParseNoPaths(absl::StrCat(kMinimal, k.yaml));
    ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << k.yaml;
    EXPECT_THAT(c.status().message(), HasSubstr(k.message));
  }
}


// Ludwig's LLM sections map onto this service's keys: prompt.template -> data.prompt_template,
// preprocessing.split.probabilities -> data.validation_fraction / data.test_fraction,
// preprocessing.global_max_sequence_length -> data.max_sequence_length; generation is kept.
TEST(ConfigParserTest, LudwigPromptPreprocessingAndGenerationMapOntoTheJob) {
  const JobConfig c = ParseOk(absl::StrCat(kMinimal, R"(prompt:
  template: "Q: {instruction}\nA: "
preprocessing:
  split: {type: random, probabilities: [0.9, 0.05, 0.05]}
  global_max_sequence_length: 1024
generation: {temperature: 0.1, max_new_tokens: 64, top_k: 0, do_sample: false}
)"));
  EXPECT_EQ(c.data.prompt_template, "Q: {instruction}\nA: ");
  EXPECT_DOUBLE_EQ(c.data.validation_fraction, 0.05);
  EXPECT_DOUBLE_EQ(c.data.test_fraction, 0.05);
  EXPECT_EQ(c.data.max_sequence_length, 1024);
  EXPECT_EQ(c.generation.temperature, 0.1);
  EXPECT_EQ(c.generation.max_new_tokens, 64);
  EXPECT_EQ(c.generation.top_k, 0);
  EXPECT_EQ(c.generation.do_sample, false);
  EXPECT_FALSE(c.generation.top_p.has_value());  // unset: the generator's default
  EXPECT_FALSE(c.generation.num_beams.has_value());
}

// Temperature 0 is greedy decoding (transformers ignores temperature without sampling); with
// do_sample it is refused at submit, where otherwise every generation of the job would fail.
TEST(ConfigParserTest, TemperatureZeroIsGreedyAndRefusedWithSampling) {
  const JobConfig greedy = ParseOk(absl::StrCat(kMinimal, "generation: {temperature: 0}\n"));
  EXPECT_EQ(greedy.generation.temperature, 0.0);
  absl::StatusOr<JobConfig> sampled =
      ParseNoPaths(absl::StrCat(kMinimal, "generation: {temperature: 0, do_sample: true}\n"));
  ASSERT_EQ(sampled.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(sampled.status().message(), HasSubstr("generation.temperature: is 0 with do_sample: true"));
  EXPECT_THAT(sampled.status().message(), HasSubstr("do_sample: false"));
  EXPECT_EQ(ParseNoPaths(absl::StrCat(kMinimal, "generation: {temperature: -0.5}\n")).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// output.gguf: true means f16; a type names the matrices' type; either implies the merged model
// the GGUF is made from. Anything else is refused naming the choices.
TEST(ConfigParserTest, OutputGgufNamesItsTypeAndImpliesTheMergedModel) {
  const JobConfig plain = ParseOk(kMinimal);
  EXPECT_EQ(plain.gguf_type, "");
  EXPECT_FALSE(plain.lora.merge_adapter_into_base_model);
  for (const auto& [written, type] : std::vector<std::pair<std::string, std::string>>{
           {"true", "f16"}, {"q8_0", "q8_0"}, {"bf16", "bf16"}, {"false", ""}}) {
    const JobConfig c = ParseOk(absl::StrCat(kMinimal, "output: {gguf: ", written, "}\n"));
    EXPECT_EQ(c.gguf_type, type) << written;
    EXPECT_EQ(c.lora.merge_adapter_into_base_model, !type.empty()) << written;
  }
  absl::StatusOr<JobConfig> bad = testing::ParseNoPaths(absl::StrCat(kMinimal, "output: {gguf: q4_k}\n"));
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("q8_0"));
  absl::StatusOr<JobConfig> unknown = testing::ParseNoPaths(absl::StrCat(kMinimal, "output: {ggfu: true}\n"));
  ASSERT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(), HasSubstr("gguf"));
}

TEST(ConfigParserTest, LudwigKeysThatAgreeWithTheServiceKeysAreAccepted) {
  const JobConfig c = ParseOk(absl::StrCat(kMinimal, R"(prompt: {template: "{instruction} ->"}
preprocessing:
  split: {probabilities: [0.8, 0.2, 0]}
  global_max_sequence_length: 256
data: {prompt_template: "{instruction} ->", max_sequence_length: 256, validation_fraction: 0.2}
)"));
  EXPECT_EQ(c.data.prompt_template, "{instruction} ->");
  EXPECT_EQ(c.data.max_sequence_length, 256);
  EXPECT_DOUBLE_EQ(c.data.validation_fraction, 0.2);
  EXPECT_DOUBLE_EQ(c.data.test_fraction, 0.0);
}

TEST(ConfigParserTest, LudwigRandomSplitWithoutProbabilitiesIsLudwigsDefault) {
  const JobConfig c = ParseOk(absl::StrCat(kMinimal, "preprocessing: {split: {type: random}}\n"));
  EXPECT_DOUBLE_EQ(c.data.validation_fraction, 0.1);
  EXPECT_DOUBLE_EQ(c.data.test_fraction, 0.2);
  // Without the sections nothing changes.
  const JobConfig plain = ParseOk(kMinimal);
  EXPECT_DOUBLE_EQ(plain.data.validation_fraction, 0.0);
  EXPECT_DOUBLE_EQ(plain.data.test_fraction, 0.0);
  EXPECT_EQ(plain.data.max_sequence_length, 512);
  EXPECT_TRUE(plain.generation == GenerationConfig{});
}

TEST(ConfigParserTest, ConflictingLudwigAndServiceKeysNameBoth) {
  absl::StatusOr<JobConfig> c = ParseNoPaths(absl::StrCat(
      kMinimal, "prompt: {template: \"a {instruction}\"}\ndata: {prompt_template: \"b {instruction}\"}\n"));
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("job.yaml:3: prompt.template: differs from data.prompt_template (line 4)"));
  c = ParseNoPaths(absl::StrCat(
      kMinimal, "preprocessing: {split: {probabilities: [0.7, 0.1, 0.2]}}\ndata: {test_fraction: 0.1}\n"));
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("preprocessing.split.probabilities: is a test share of 0.2 "
                                              "but data.test_fraction (line 4) is 0.1"));
}

}  // namespace
}  // namespace qlora
