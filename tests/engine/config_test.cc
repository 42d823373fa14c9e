// config.json parsing (both rope forms, llama3 scaling, GQA, head_dim, tying, bnb) and the
// tiny-model maker's output (names, shapes, shards).
#include "common/safetensors/checkpoint_files.h"
#include "gtest/gtest.h"
#include "tests/engine/test_util.h"
#include "common/model/llama_config.h"
#include "worker/engine/tiny_model.h"

namespace qlora::engine {
namespace {

using ::qlora::testing::TempDir;

TEST(EngineConfig, ParsesLlama2StyleConfigWithDefaults) {
  auto c = ParseLlamaConfig(R"({
    "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 11008,
    "max_position_embeddings": 4096, "model_type": "llama", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 32, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05, "rope_scaling": null, "tie_word_embeddings": false,
    "torch_dtype": "float16", "vocab_size": 32000})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->rope.type, RopeType::kDefault);
  EXPECT_EQ(c->rope.theta, 10000.0);
  EXPECT_EQ(c->torch_dtype, "float16");
  EXPECT_FALSE(c->bnb.has_value());
}

TEST(EngineConfig, ParsesLlama31RopeScalingAndGqa) {
  auto c = ParseLlamaConfig(R"({"hidden_size": 4096, "num_attention_heads": 32,
    "num_key_value_heads": 8, "rope_theta": 500000.0, "eos_token_id": [128001, 128008],
    "bos_token_id": 128000, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
    "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_key_value_heads, 8);
  EXPECT_EQ(c->eos_token_id, 128001);
  EXPECT_EQ(c->rope.type, RopeType::kLlama3);
  EXPECT_EQ(c->rope.theta, 500000.0);
  EXPECT_EQ(c->rope.factor, 8.0);
  EXPECT_EQ(c->rope.original_max_position_embeddings, 8192);
}

TEST(EngineConfig, ParsesTransformers5RopeParameters) {
  auto c = ParseLlamaConfig(R"({"hidden_size": 64, "num_attention_heads": 4, "head_dim": 32,
    "tie_word_embeddings": true, "dtype": "bfloat16",
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 123.0, "factor": 2.0,
    "low_freq_factor": 1.0, "high_freq_factor": 2.0, "original_max_position_embeddings": 64}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->torch_dtype, "bfloat16");
  EXPECT_EQ(c->rope.theta, 123.0);
  EXPECT_EQ(c->rope.high_freq_factor, 2.0);
  auto plain = ParseLlamaConfig(R"({"rope_parameters": {"rope_type": "default", "rope_theta": 7.0}})");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->rope.type, RopeType::kDefault);
  EXPECT_EQ(plain->rope.theta, 7.0);
}

TEST(EngineConfig, ParsesBitsandbytesQuantizationConfig) {
  auto c = ParseLlamaConfig(R"({"quantization_config": {"quant_method": "bitsandbytes",
    "load_in_4bit": true, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": true,
    "bnb_4bit_compute_dtype": "bfloat16", "bnb_4bit_quant_storage": "uint8"}})");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->bnb.has_value());
  EXPECT_EQ(c->bnb->quant_type, "nf4");
  EXPECT_TRUE(c->bnb->double_quant);
}

TEST(EngineConfig, RejectsBadAndUnsupportedConfigs) {
  struct Case {
    const char* json;
    absl::StatusCode code;
    const char* mentions;
  };
  const Case cases[] = {
      {"[1]", absl::StatusCode::kInvalidArgument, "JSON object"},
      {R"({"hidden_size": -4})", absl::StatusCode::kInvalidArgument, "hidden_size"},
      {R"({"num_attention_heads": 6, "num_key_value_heads": 4})",
       absl::StatusCode::kInvalidArgument, "num_key_value_heads"},
      {R"({"model_type": "gpt2"})", absl::StatusCode::kUnimplemented, "llama, mistral, qwen2"},
      {R"({"model_type": 7})", absl::StatusCode::kInvalidArgument, "model_type"},
      {R"({"mlp_bias": true})", absl::StatusCode::kUnimplemented, "mlp_bias"},
      {R"({"model_type": "mistral", "sliding_window": 0})", absl::StatusCode::kInvalidArgument,
       "sliding_window"},
      {R"({"model_type": "qwen2", "num_hidden_layers": 2, "layer_types": ["full_attention"]})",
       absl::StatusCode::kInvalidArgument, "layer_types"},
      {R"({"rope_scaling": {"rope_type": "yarn", "factor": 4}})", absl::StatusCode::kUnimplemented,
       "yarn"},
      {R"({"rope_scaling": {"rope_type": "llama3"}})", absl::StatusCode::kInvalidArgument, "factor"},
      {R"({"quantization_config": {"quant_method": "gptq"}})", absl::StatusCode::kUnimplemented,
       "gptq"},
  };
  for (const Case& c : cases) {
    auto parsed = ParseLlamaConfig(c.json);
    ASSERT_FALSE(parsed.ok()) << c.json;
    EXPECT_EQ(parsed.status().code(), c.code) << parsed.status();
    EXPECT_NE(parsed.status().message().find(c.mentions), std::string::npos) << parsed.status();
  }
}

TEST(EngineConfig, JsonRoundTripsInBothRopeForms) {
  LlamaConfig c = TinyLlamaConfig();
  c.rope = {RopeType::kLlama3, 5e5, 8.0, 1.0, 4.0, 16};
  c.tie_word_embeddings = true;
  for (RopeJsonForm form : {RopeJsonForm::kRopeScaling, RopeJsonForm::kRopeParameters}) {
    auto back = ParseLlamaConfig(LlamaConfigToJson(c, form));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->rope.type, RopeType::kLlama3);
    EXPECT_EQ(back->rope.theta, 5e5);
    EXPECT_EQ(back->rope.original_max_position_embeddings, 16);
    EXPECT_EQ(back->head_dim, c.head_dim);
    EXPECT_TRUE(back->tie_word_embeddings);
  }
}

// What each family reads from config.json as transformers' config classes do.
TEST(EngineConfig, FamiliesReadTheirOwnFields) {
  auto llama = ParseLlamaConfig(R"({"attention_bias": true})");
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_TRUE(llama->ProjectionHasBias("q_proj") && llama->ProjectionHasBias("o_proj"));
  EXPECT_FALSE(llama->ProjectionHasBias("gate_proj"));

  auto mistral = ParseLlamaConfig(
      R"({"model_type": "mistral", "num_hidden_layers": 3, "sliding_window": 4096, "head_dim": null})");
  ASSERT_TRUE(mistral.ok()) << mistral.status();
  EXPECT_EQ(mistral->sliding_window, 4096);
  EXPECT_TRUE(mistral->SlidingLayer(0) && mistral->SlidingLayer(2));
  EXPECT_FALSE(mistral->ProjectionHasBias("q_proj"));
  auto mistral_full = ParseLlamaConfig(R"({"model_type": "mistral", "sliding_window": null})");
  ASSERT_TRUE(mistral_full.ok());
  EXPECT_FALSE(mistral_full->SlidingLayer(0));

  // Qwen2: the window needs use_sliding_window; it then covers layers >= max_window_layers.
  auto qwen = ParseLlamaConfig(R"({"model_type": "qwen2", "num_hidden_layers": 4,
      "sliding_window": 32768, "max_window_layers": 28, "tie_word_embeddings": true})");
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_TRUE(qwen->ProjectionHasBias("k_proj"));
  EXPECT_FALSE(qwen->ProjectionHasBias("o_proj"));
  EXPECT_EQ(qwen->sliding_window, 0);
  EXPECT_TRUE(qwen->tie_word_embeddings);
  auto qwen_window = ParseLlamaConfig(R"({"model_type": "qwen2", "num_hidden_layers": 4,
      "use_sliding_window": true, "sliding_window": 16, "max_window_layers": 2})");
  ASSERT_TRUE(qwen_window.ok()) << qwen_window.status();
  EXPECT_FALSE(qwen_window->SlidingLayer(1));
  EXPECT_TRUE(qwen_window->SlidingLayer(2) && qwen_window->SlidingLayer(3));

  // Written back, each family reads the same.
  for (const auto* parsed : {&*llama, &*mistral, &*qwen, &*qwen_window}) {
    auto back = ParseLlamaConfig(LlamaConfigToJson(*parsed));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->model_type, parsed->model_type);
    EXPECT_EQ(back->qkv_bias, parsed->qkv_bias);
    EXPECT_EQ(back->o_bias, parsed->o_bias);
    EXPECT_EQ(back->sliding_window, parsed->sliding_window);
    for (int64_t i = 0; i < parsed->num_hidden_layers; ++i) {
      EXPECT_EQ(back->SlidingLayer(i), parsed->SlidingLayer(i)) << parsed->model_type << " " << i;
    }
  }
}

TEST(EngineTinyModel, WritesEveryTensorOnceInOneFileOrShards) {
  TempDir dir;
  TinyModelOptions options;
  options.config.tie_word_embeddings = true;
  ASSERT_TRUE(MakeTinyModel(dir / "single", options).ok());
  options.max_shard_bytes = 40000;
  ASSERT_TRUE(MakeTinyModel(dir / "sharded", options).ok());
  int shards = 0;
  for (const std::string& name : ::qlora::testing::ListDir(dir / "sharded")) {
    shards += name.rfind("model-0", 0) == 0;
  }
  EXPECT_GT(shards, 2);
  EXPECT_GT(::qlora::testing::FileSize(dir / "sharded/model.safetensors.index.json"), 0);

  auto single = safetensors::CheckpointFiles::Open(dir / "single");
  auto sharded = safetensors::CheckpointFiles::Open(dir / "sharded");
  ASSERT_TRUE(single.ok() && sharded.ok()) << single.status() << sharded.status();
  const auto names = single->Names();
  EXPECT_EQ(names.size(), 1u + 2 * 9 + 1);  // embed, 2 layers x 9, norm; no lm_head (tied)
  EXPECT_EQ(names, sharded->Names());
  for (const std::string& name : names) {
    auto a = single->Get(name);
    auto b = sharded->Get(name);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->shape, b->shape);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(a->data), a->nbytes),
              std::string(reinterpret_cast<const char*>(b->data), b->nbytes))
        << name << " must not depend on sharding";
  }
  auto k = single->Get("model.layers.1.self_attn.k_proj.weight");
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(k->shape, (std::vector<int64_t>{2 * 16, 64}));
  auto config = LoadLlamaConfig(dir / "single");
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->num_key_value_heads, 2);
}

}  // namespace
}  // namespace qlora::engine
