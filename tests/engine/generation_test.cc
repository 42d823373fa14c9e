// Generation against transformers: a KV-cached decoder gives the hidden states of the whole
// sequence at once; greedy decoding on the NF4 base with its (unmerged) adapter gives the tokens
// transformers' generate gives on the merged checkpoint, repetition penalty, min_new_tokens and
// sliding windows included; the logits processors equal HF's; sampling is reproducible from a
// seed; weights in a host store generate what resident weights do.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include "gtest/gtest.h"
#include "tests/engine/lora_test_util.h"
#include "tests/engine/test_util.h"
#include "tests/engine/torch_test_util.h"
#include "worker/engine/base_weight_store.h"
#include "worker/engine/generation.h"
#include "worker/engine/hf_loader.h"
#include "worker/engine/peft_io.h"
#include "worker/engine/tiny_model.h"

namespace qlora::engine {
namespace {

using ::qlora::testing::LoadTensors;
using ::qlora::testing::MaxAbsDiff;
using ::qlora::testing::RunScript;
using ::qlora::testing::SaveTensors;
using ::qlora::testing::TempDir;

struct Case {
  std::string name;
  TinyModelOptions tiny;
};

// LLaMA with grouped-query heads, Mistral with a window of 8 (so generation runs past it) and
// Qwen2 with q/k/v biases and tied embeddings.
std::vector<Case> Cases() {
  std::vector<Case> cases;
  Case llama{"llama_gqa", {}};
  llama.tiny.init_std = 0.1;
  cases.push_back(llama);
  Case mistral{"mistral_window", {}};
  mistral.tiny.init_std = 0.1;
  EXPECT_TRUE(SetModelFamily("mistral", 8, &mistral.tiny.config).ok());
  cases.push_back(mistral);
  Case qwen{"qwen2_bias_tied", {}};
  qwen.tiny.init_std = 0.1;
  EXPECT_TRUE(SetModelFamily("qwen2", 0, &qwen.tiny.config).ok());
  qwen.tiny.config.tie_word_embeddings = true;
  cases.push_back(qwen);
  return cases;
}

// The tiny model as NF4 with float32 compute and adapters on every linear layer, B random.
std::unique_ptr<LlamaForCausalLM> Nf4WithAdapters(const std::string& dir, const TinyModelOptions& tiny,
                                                  std::shared_ptr<BaseWeightStore> store = nullptr) {
  EXPECT_TRUE(MakeTinyModel(dir, tiny).ok());
  LoadOptions load;
  load.quantize = true;
  load.compute_dtype = at::kFloat;
  load.base_weights = std::move(store);
  auto model = LoadLlama(dir, load);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return nullptr;
  LoraOptions lora;
  lora.r = 4;
  lora.alpha = 8;
  lora.target_modules = {"all-linear"};
  EXPECT_TRUE((*model)->AddLora(lora).ok());
  RandomizeLoraB(**model);
  return std::move(*model);
}

std::vector<int64_t> Prompt(const LlamaConfig& config, int64_t length, uint64_t seed = 3) {
  const at::Tensor ids = RandomIds(config, 1, length, seed).view({-1});
  return std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + length);
}

TEST(EngineGeneration, CachedStepsGiveTheHiddenStatesOfTheWholeSequence) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    TempDir dir;
    auto model = Nf4WithAdapters(dir / "model", c.tiny);
    ASSERT_NE(model, nullptr);
    const int64_t length = 21;  // past Mistral's window of 8
    const at::Tensor ids = RandomIds(model->config(), 1, length);
    at::NoGradGuard no_grad;
    const at::Tensor whole = model->Forward(ids);
    // A prefill of 5, chunks of 3 (new positions that see cached ones and each other), then
    // one position at a time.
    KvCache cache = model->NewKvCache(1, length);
    std::vector<at::Tensor> parts;
    int64_t at = 0;
    for (int64_t size : {5, 3, 3}) {
      parts.push_back(model->ForwardCached(ids.narrow(1, at, size), &cache));
      at += size;
    }
    for (; at < length; ++at) parts.push_back(model->ForwardCached(ids.narrow(1, at, 1), &cache));
    EXPECT_EQ(cache.length(), length);
    const double diff = MaxAbsDiff(at::cat(parts, 1), whole);
    std::cout << c.name << ": max |cached - whole| = " << diff << "\n";
    EXPECT_LT(diff, 1e-5);
    EXPECT_GT(whole.abs().max().item<double>(), 0.1);
  }
}

// transformers' generate on the merged float32 checkpoint of our NF4 + adapter model.
std::vector<int64_t> TransformersGenerate(const std::string& python, const std::string& dir,
                                          const std::string& merged,
                                          const std::vector<int64_t>& prompt,
                                          const std::string& options_json) {
  const at::Tensor ids = at::tensor(prompt, at::kLong).view({1, -1});
  EXPECT_TRUE(SaveTensors(dir + "/inputs.safetensors", {{"input_ids", ids}}).ok());
  EXPECT_EQ(RunScript(python, "llama_ref.py",
                      {"generate", merged, dir + "/inputs.safetensors", dir + "/ref.safetensors",
                       options_json}),
            0);
  const at::Tensor tokens = LoadTensors(dir + "/ref.safetensors").at("tokens").view({-1});
  return std::vector<int64_t>(tokens.data_ptr<int64_t>(), tokens.data_ptr<int64_t>() + tokens.numel());
}

TEST(EngineGeneration, GreedyDecodingEqualsTransformersGenerateOnTheMergedModel) {
  QLORA_PYTHON_OR_SKIP(python);
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    TempDir dir;
    auto model = Nf4WithAdapters(dir / "model", c.tiny);
    ASSERT_NE(model, nullptr);
    MergeOptions merge;
    merge.dtype = at::kFloat;
    ASSERT_TRUE(SaveMergedModel(*model, dir / "merged", merge).ok());
    const std::vector<int64_t> prompt = Prompt(model->config(), 6);
    struct Setting {
      std::string json;
      GenerationOptions options;
    };
    std::vector<Setting> settings(3);
    // A token that ends generation only if the model happens to choose it; the other settings
    // end on max_new_tokens, so that 24 tokens are compared.
    const int64_t eos = model->config().vocab_size - 1;
    settings[0].json = R"({"do_sample": false, "max_new_tokens": 24, "eos_token_id": )" +
                       std::to_string(eos) + "}";
    settings[0].options.max_new_tokens = 24;
    settings[0].options.eos_token_ids = {eos};
    settings[1].json = R"({"do_sample": false, "max_new_tokens": 24, "repetition_penalty": 1.5, "eos_token_id": )" +
                       std::to_string(eos) + "}";
    settings[1].options = settings[0].options;
    settings[1].options.sampling.repetition_penalty = 1.5;
    // The token greedy decoding chooses first becomes the end of sequence: min_new_tokens
    // keeps it out for 4 tokens (HF: its MinNewTokensLengthLogitsProcessor).
    const auto first = Generate(*model, prompt, settings[0].options);
    ASSERT_TRUE(first.ok()) << first.status();
    const int64_t chosen = first->tokens[0];
    settings[2].json = R"({"do_sample": false, "max_new_tokens": 24, "min_new_tokens": 4, "eos_token_id": )" +
                       std::to_string(chosen) + "}";
    settings[2].options.max_new_tokens = 24;
    settings[2].options.min_new_tokens = 4;
    settings[2].options.eos_token_ids = {chosen};
    for (const Setting& s : settings) {
      SCOPED_TRACE(s.json);
      std::vector<int64_t> streamed;
      const auto ours = Generate(*model, prompt, s.options, [&](int64_t t) {
        streamed.push_back(t);
        return true;
      });
      ASSERT_TRUE(ours.ok()) << ours.status();
      EXPECT_EQ(streamed, ours->tokens);
      const std::vector<int64_t> theirs = TransformersGenerate(python, dir.path(), dir / "merged", prompt, s.json);
      EXPECT_EQ(ours->tokens, theirs);
      EXPECT_GE(ours->tokens.size(), 4u);
    }
  }
}

TEST(EngineGeneration, ProcessedScoresEqualTransformersLogitsProcessors) {
  QLORA_PYTHON_OR_SKIP(python);
  TempDir dir;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const at::Tensor logits = at::randn({1, 500}, gen) * 3;
  const at::Tensor context = at::randint(500, {1, 40}, gen, at::kLong);  // with repeats
  ASSERT_TRUE(SaveTensors(dir / "inputs.safetensors", {{"logits", logits}, {"input_ids", context}}).ok());
  const std::vector<int64_t> context_ids(context.data_ptr<int64_t>(), context.data_ptr<int64_t>() + 40);
  struct Setting {
    std::string json;
    SamplingOptions options;
  };
  std::vector<Setting> settings(4);
  settings[0].json = R"({"repetition_penalty": 1.3})";
  settings[0].options.repetition_penalty = 1.3;
  settings[1].json = R"({"do_sample": true, "temperature": 0.7, "top_k": 50, "top_p": 0.9, "repetition_penalty": 1.1})";
  settings[1].options = {true, 0.7, 50, 0.9, 1.1};
  settings[2].json = R"({"do_sample": true, "top_k": 0, "top_p": 0.3})";
  settings[2].options = {true, 1.0, 0, 0.3, 1.0};
  settings[3].json = R"({"do_sample": true, "temperature": 1.7, "top_k": 7})";
  settings[3].options = {true, 1.7, 7, 1.0, 1.0};
  for (const Setting& s : settings) {
    SCOPED_TRACE(s.json);
    ASSERT_EQ(RunScript(python, "llama_ref.py",
                        {"scores", dir / "inputs.safetensors", dir / "ref.safetensors", s.json}),
              0);
    const at::Tensor theirs = LoadTensors(dir / "ref.safetensors").at("scores").view({-1});
    const at::Tensor ours = ProcessedScores(logits.view({-1}), context_ids, s.options, {});
    ASSERT_TRUE(at::equal(ours.isinf(), theirs.isinf())) << "the ruled-out tokens differ";
    const at::Tensor kept = theirs.isfinite();
    EXPECT_GT(kept.sum().item<int64_t>(), 0);
    EXPECT_LT(MaxAbsDiff(ours.masked_select(kept), theirs.masked_select(kept)), 1e-5);
  }
}

TEST(EngineGeneration, SamplingIsReproducibleFromASeed) {
  TempDir dir;
  auto model = Nf4WithAdapters(dir / "model", Cases()[0].tiny);
  ASSERT_NE(model, nullptr);
  const std::vector<int64_t> prompt = Prompt(model->config(), 5);
  auto sample = [&](uint64_t seed) {
    GenerationOptions options;
    options.max_new_tokens = 20;
    options.sampling = {true, 1.5, 0, 1.0, 1.0, seed};
    auto result = Generate(*model, prompt, options);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? result->tokens : std::vector<int64_t>{};
  };
  const std::vector<int64_t> a = sample(1);
  EXPECT_EQ(a.size(), 20u);
  EXPECT_EQ(sample(1), a);
  EXPECT_TRUE(sample(2) != a || sample(3) != a) << "three seeds drew the same 20 tokens";
  GenerationOptions greedy;
  greedy.max_new_tokens = 20;
  const auto argmax = Generate(*model, prompt, greedy);
  ASSERT_TRUE(argmax.ok());
  EXPECT_NE(argmax->tokens, a) << "temperature 1.5 drew the greedy sequence";
}

TEST(EngineGeneration, TheCallerEndsItAndBadRequestsAreRefused) {
  TempDir dir;
  auto model = Nf4WithAdapters(dir / "model", Cases()[0].tiny);
  ASSERT_NE(model, nullptr);
  const std::vector<int64_t> prompt = Prompt(model->config(), 5);
  GenerationOptions options;
  options.max_new_tokens = 50;
  int calls = 0;
  const auto stopped = Generate(*model, prompt, options, [&](int64_t) { return ++calls < 3; });
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ(stopped->tokens.size(), 3u);
  EXPECT_EQ(stopped->end, GenerationEnd::kStoppedByCaller);

  const int64_t context = model->config().max_position_embeddings;
  options.max_new_tokens = context;
  const auto full = Generate(*model, prompt, options);
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(static_cast<int64_t>(full->tokens.size()), context - 5);
  EXPECT_EQ(full->end, GenerationEnd::kContextFull);

  GenerationOptions bad;
  EXPECT_EQ(Generate(*model, {}, bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Generate(*model, {model->config().vocab_size}, bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad.sampling.top_p = 0;
  EXPECT_EQ(Generate(*model, prompt, bad).status().code(), absl::StatusCode::kInvalidArgument);

  // Temperature 0 is greedy decoding when not sampling (as transformers takes it), and refused
  // when sampling.
  GenerationOptions cold;
  cold.max_new_tokens = 8;
  const auto greedy = Generate(*model, prompt, cold);
  cold.sampling.temperature = 0;
  const auto zero = Generate(*model, prompt, cold);
  ASSERT_TRUE(greedy.ok() && zero.ok()) << zero.status();
  EXPECT_EQ(zero->tokens, greedy->tokens);
  cold.sampling.do_sample = true;
  EXPECT_EQ(Generate(*model, prompt, cold).status().code(), absl::StatusCode::kInvalidArgument);
  cold.sampling = {};
  cold.sampling.temperature = -1;
  EXPECT_EQ(Generate(*model, prompt, cold).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(EngineGeneration, WeightsInAHostStoreGenerateWhatResidentWeightsDo) {
  TempDir dir;
  auto resident = Nf4WithAdapters(dir / "model", Cases()[0].tiny);
  BaseWeightStoreOptions host;
  host.on_host = true;
  auto stored = Nf4WithAdapters(dir / "model2", Cases()[0].tiny, std::make_shared<BaseWeightStore>(host));
  ASSERT_NE(resident, nullptr);
  ASSERT_NE(stored, nullptr);
  ASSERT_NE(stored->base_weight_store(), nullptr);
  const std::vector<int64_t> prompt = Prompt(resident->config(), 5);
  GenerationOptions options;
  options.max_new_tokens = 16;
  const auto a = Generate(*resident, prompt, options);
  const auto b = Generate(*stored, prompt, options);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->tokens, b->tokens);
}

// On the GPU, the same NF4 model with its adapter (float32 compute) generates the tokens the CPU
// does: the cached decoder, the 4-bit kernels and the chooser agree across devices.
TEST(EngineGeneration, OnCudaGreedyAndSeededTokensEqualTheCpus) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  TempDir dir;
  auto cpu = Nf4WithAdapters(dir / "model", Cases()[0].tiny);
  ASSERT_NE(cpu, nullptr);
  ASSERT_TRUE(SaveAdapter(*cpu, dir / "adapter").ok());
  LoadOptions load;
  load.quantize = true;
  load.compute_dtype = at::kFloat;
  load.device = at::Device(at::kCUDA, 0);
  auto cuda = LoadLlama(dir / "model", load);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  ASSERT_TRUE(LoadAdapter(cuda->get(), dir / "adapter").ok());
  const std::vector<int64_t> prompt = Prompt(cpu->config(), 6);
  for (bool sample : {false, true}) {
    GenerationOptions options;
    options.max_new_tokens = 24;
    options.sampling = {sample, 0.8, 20, 0.95, 1.1, 3};
    const auto a = Generate(*cpu, prompt, options);
    const auto b = Generate(**cuda, prompt, options);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->tokens, b->tokens) << (sample ? "sampled" : "greedy");
  }
}

}  // namespace
}  // namespace qlora::engine
