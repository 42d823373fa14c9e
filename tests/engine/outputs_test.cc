// What the engine writes for serving, read by the real other side: a merged folder (sharded like
// save_pretrained, with generation_config.json and the tokenizer) that transformers loads and
// generates with, logits equal to the unsharded merge; and an adapter_config.json carrying
// every key peft's LoraConfig writes, with equal values.
#include <sys/stat.h>

#include <cstring>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include "gtest/gtest.h"
#include "common/posix_files.h"
#include "common/safetensors/checkpoint_files.h"
#include "tests/engine/lora_test_util.h"
#include "tests/engine/test_util.h"
#include "tests/engine/torch_test_util.h"
#include "tests/run/tiny_model_dir.h"
#include "worker/engine/hf_loader.h"
#include "worker/engine/peft_io.h"
#include "worker/engine/serving_files.h"
#include "worker/engine/tiny_model.h"

namespace qlora::engine {
namespace {

using ::qlora::testing::ListDir;
using ::qlora::testing::LoadTensors;
using ::qlora::testing::MaxAbsDiff;
using ::qlora::testing::RunScript;
using ::qlora::testing::SaveTensors;
using ::qlora::testing::TempDir;

// The tiny model with the example tokenizer and a chat template, loaded in float32 with LoRA on
// every linear layer and random lora_B (so that the merge changes the weights).
std::unique_ptr<LlamaForCausalLM> TinyWithLora(const std::string& dir) {
  EXPECT_TRUE(::qlora::testing::MakeTinyModelWithExampleTokenizer(dir).ok());
  EXPECT_TRUE(WriteFileAtomically(JoinPath(dir, "chat_template.jinja"),
                                  "{% for m in messages %}{{ m['content'] }}{% endfor %}").ok());
  LoadOptions load;
  load.quantize = false;
  load.compute_dtype = at::kFloat;
  auto model = LoadLlama(dir, load);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return nullptr;
  LoraOptions lora;
  lora.r = 4;
  lora.alpha = 8;
  lora.target_modules = {"all-linear"};
  EXPECT_TRUE((*model)->AddLora(lora).ok());
  RandomizeLoraB(**model, /*seed=*/3);
  return std::move(*model);
}

TEST(EngineOutputs, ShardedMergedFolderLoadsAndGeneratesInTransformers) {
  QLORA_PYTHON_OR_SKIP(python);
  TempDir dir;
  auto model = TinyWithLora(dir / "base");
  ASSERT_NE(model, nullptr);
  MergeOptions merge;
  merge.dtype = at::kFloat;
  merge.base_model_dir = dir / "base";
  ASSERT_TRUE(SaveMergedModel(*model, dir / "single", merge).ok());
  merge.max_shard_bytes = 100'000;  // the tiny model is ~0.6 MB in float32
  ASSERT_TRUE(SaveMergedModel(*model, dir / "sharded", merge).ok());

  EXPECT_TRUE(PathExists(dir / "single/model.safetensors"));
  EXPECT_FALSE(PathExists(dir / "single/model.safetensors.index.json"));
  int shards = 0;
  for (const std::string& name : ListDir(dir / "sharded")) shards += name.rfind("model-", 0) == 0;
  EXPECT_GT(shards, 2);
  EXPECT_FALSE(PathExists(dir / "sharded/model.safetensors"));
  for (const char* name : {"config.json", "generation_config.json", "model.safetensors.index.json",
                           "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}) {
    EXPECT_TRUE(PathExists(JoinPath(dir / "sharded", name))) << name;
  }
  // The same tensors, byte for byte, whichever way they were written.
  auto single = safetensors::CheckpointFiles::Open(dir / "single");
  auto sharded = safetensors::CheckpointFiles::Open(dir / "sharded");
  ASSERT_TRUE(single.ok() && sharded.ok());
  ASSERT_EQ(single->Names(), sharded->Names());
  for (const std::string& name : single->Names()) {
    auto a = single->Get(name);
    auto b = sharded->Get(name);
    ASSERT_TRUE(a.ok() && b.ok()) << name;
    ASSERT_EQ(a->nbytes, b->nbytes) << name;
    EXPECT_EQ(std::memcmp(a->data, b->data, a->nbytes), 0) << name;
  }

  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const at::Tensor ids = at::randint(model->config().vocab_size, {2, 10}, gen, at::kLong);
  ASSERT_TRUE(SaveTensors(dir / "inputs.safetensors", {{"input_ids", ids}}).ok());
  ASSERT_EQ(RunScript(python, "outputs_ref.py",
                      {"merged", dir / "sharded", dir / "single", dir / "inputs.safetensors", dir / "out.safetensors"}),
            0);
  const auto out = LoadTensors(dir / "out.safetensors");
  EXPECT_EQ(MaxAbsDiff(out.at("sharded"), out.at("single")), 0.0);
  at::Tensor ours;
  {
    at::NoGradGuard no_grad;
    ours = model->Logits(model->Forward(ids));
  }
  EXPECT_LT(MaxAbsDiff(ours, out.at("sharded")), 1e-4) << "the merge is not the adapted model";
}

TEST(EngineOutputs, GenerationConfigIsMadeFromTheConfigWhenTheBaseHasNone) {
  TempDir dir;
  LlamaConfig config = TinyLlamaConfig();
  config.bos_token_id = 7;
  config.eos_token_id = 9;
  ASSERT_TRUE(MakeDirs(dir / "out").ok());
  ASSERT_TRUE(WriteServingFiles("", dir / "out", config).ok());
  auto text = ReadFile(dir / "out/generation_config.json");
  ASSERT_TRUE(text.ok());
  EXPECT_NE(text->find("\"_from_model_config\": true"), std::string::npos) << *text;
  EXPECT_NE(text->find("\"bos_token_id\": 7"), std::string::npos) << *text;
  EXPECT_NE(text->find("\"eos_token_id\": 9"), std::string::npos) << *text;

  // The base model's own file wins.
  ASSERT_TRUE(MakeDirs(dir / "base").ok());
  ASSERT_TRUE(WriteFileAtomically(dir / "base/generation_config.json", "{\"eos_token_id\": [9, 10]}").ok());
  ASSERT_TRUE(WriteServingFiles(dir / "base", dir / "out", config).ok());
  EXPECT_EQ(*ReadFile(dir / "out/generation_config.json"), "{\"eos_token_id\": [9, 10]}");
}

TEST(EngineOutputs, ServingFilesRefuseWhatIsNotARegularFile) {
  TempDir dir;
  ASSERT_TRUE(MakeDirs(dir / "base").ok());
  ASSERT_TRUE(MakeDirs(dir / "out").ok());
  // A FIFO would block a plain copy forever.
  ASSERT_EQ(::mkfifo((dir / "base/tokenizer.json").c_str(), 0600), 0);
  const absl::Status status = WriteServingFiles(dir / "base", dir / "out", TinyLlamaConfig());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_FALSE(PathExists(dir / "out/tokenizer.json"));
}

TEST(EngineOutputs, AdapterConfigHasEveryKeyPeftWrites) {
  QLORA_PYTHON_OR_SKIP(python);
  TempDir dir;
  EXPECT_TRUE(MakeTinyModel(dir / "base", {}).ok());
  LoadOptions load;
  load.quantize = false;
  load.compute_dtype = at::kFloat;
  auto model = LoadLlama(dir / "base", load);
  ASSERT_TRUE(model.ok()) << model.status();
  LoraOptions lora;
  lora.r = 4;
  lora.alpha = 16;
  lora.dropout = 0.05;
  lora.use_rslora = true;
  lora.target_modules = {"q_proj", "v_proj"};
  ASSERT_TRUE((*model)->AddLora(lora).ok());
  ASSERT_TRUE(SaveAdapter(**model, dir / "adapter", {"org/base-model"}).ok());
  EXPECT_EQ(RunScript(python, "outputs_ref.py",
                      {"adapter_config", dir / "adapter", "4", "16", "0.05", "true", "q_proj,v_proj",
                       "org/base-model"}),
            0)
      << "adapter_config.json lacks keys peft writes, or their values differ";
}

}  // namespace
}  // namespace qlora::engine
