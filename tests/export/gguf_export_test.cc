// GGUF export against llama.cpp's own Python reader and quantizers (the gguf package): every key
// and tensor of tiny LLaMA (grouped-query, LLaMA-3 rope), Mistral and Qwen2 (biases, tied
// embeddings) folders in each type, byte for byte (gguf_check.py); the number conversions
// against known values; and what cannot be exported is refused, naming why.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "gtest/gtest.h"
#include "tests/engine/test_util.h"
#include "worker/engine/tiny_model.h"
#include "worker/export/gguf_export.h"
#include "worker/export/gguf_quant.h"

namespace qlora::gguf {
namespace {

using ::qlora::testing::RunScript;
using ::qlora::testing::TempDir;

std::string SourceDir() {
  const char* src = std::getenv("QLORA_SOURCE_DIR");
  return src != nullptr ? src : QLORA_DEFAULT_SOURCE_DIR;
}

// A bf16 tiny model with the example tokenizer (512 tokens).
std::string TinyFolder(const TempDir& dir, const std::string& name, engine::TinyModelOptions tiny) {
  const std::string model = dir / name;
  tiny.dtype = "bfloat16";
  tiny.init_std = 0.1;
  tiny.config.vocab_size = 512;
  tiny.config.bos_token_id = 0;
  tiny.config.eos_token_id = 1;
  EXPECT_TRUE(engine::MakeTinyModel(model, tiny).ok());
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    const std::string text = qlora::testing::ReadFile(SourceDir() + "/examples/tokenizer/" + file);
    qlora::testing::WriteFile(model + "/" + file, text);
  }
  return model;
}

TEST(GgufExport, EveryKeyAndTensorIsWhatLlamaCppsReaderAndQuantizersGive) {
  QLORA_PYTHON_OR_SKIP(python);
  TempDir dir;
  engine::TinyModelOptions llama;  // grouped-query heads, LLaMA-3 rope scaling
  llama.config.rope = {engine::RopeType::kLlama3, 500000.0, 8.0, 1.0, 4.0, 16};
  engine::TinyModelOptions mistral;
  ASSERT_TRUE(engine::SetModelFamily("mistral", 8, &mistral.config).ok());
  engine::TinyModelOptions qwen;  // q/k/v biases, tied embeddings
  ASSERT_TRUE(engine::SetModelFamily("qwen2", 0, &qwen.config).ok());
  qwen.config.tie_word_embeddings = true;
  engine::TinyModelOptions odd;  // rows of 45 and 97 values: Q8_0 falls back to F16 there
  odd.config.hidden_size = 45;
  odd.config.intermediate_size = 97;
  odd.config.num_attention_heads = 3;
  odd.config.num_key_value_heads = 1;
  odd.config.head_dim = 22;
  for (const auto& [name, tiny] : {std::pair<std::string, engine::TinyModelOptions>{"llama", llama},
                                   {"mistral", mistral}, {"qwen2", qwen}, {"odd", odd}}) {
    const std::string model = TinyFolder(dir, name, tiny);
    for (const char* type : {"f16", "bf16", "q8_0", "f32"}) {
      SCOPED_TRACE(name + " " + type);
      GgufExportOptions options;
      options.type = *ParseGgufType(type);
      const std::string out = dir / (name + "-" + type + ".gguf");
      ASSERT_TRUE(ExportGguf(model, out, options).ok());
      EXPECT_EQ(RunScript(python, "../export/gguf_check.py", {model, out, type}), 0);
    }
  }
}

TEST(GgufExport, ConversionsRoundAsGgmlDoes) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);                // rounds up past the largest: infinity
  EXPECT_EQ(FloatToHalf(1.0f + 1.0f / 2048), 0x3c00);       // a tie goes to the even neighbour
  EXPECT_EQ(FloatToHalf(1.0f + 3.0f / 2048), 0x3c02);
  EXPECT_EQ(FloatToHalf(5.960464477539063e-08f), 0x0001);   // the smallest subnormal
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_FLOAT_EQ(HalfToFloat(0x3555), 0.333251953125f);
  EXPECT_EQ(FloatToBf16(1.00390625f), 0x3f80);               // a tie goes to the even neighbour
  EXPECT_EQ(FloatToBf16(1.01171875f), 0x3f82);
  float block[32] = {};
  block[0] = 1.27f;
  block[1] = -0.005f;  // -0.5 after scaling: rounded away from zero
  block[2] = 0.015f;   // 1.5: rounded away from zero
  uint8_t out[34];
  QuantizeQ8_0(block, 32, out);
  uint16_t scale;
  std::memcpy(&scale, out, 2);
  EXPECT_EQ(scale, FloatToHalf(1.27f / 127.0f));
  EXPECT_EQ(static_cast<int8_t>(out[2]), 127);
  EXPECT_EQ(static_cast<int8_t>(out[3]), -1);
  EXPECT_EQ(static_cast<int8_t>(out[4]), 2);
  EXPECT_EQ(static_cast<int8_t>(out[5]), 0);
}

TEST(GgufExport, WhatCannotBeExportedIsRefusedNamingWhy) {
  TempDir dir;
  EXPECT_EQ(ParseGgufType("q4_k").status().code(), absl::StatusCode::kInvalidArgument);
  engine::TinyModelOptions nf4;
  nf4.bnb_nf4 = true;
  const std::string quantized = TinyFolder(dir, "nf4", nf4);
  const absl::Status refused = ExportGguf(quantized, dir / "nf4.gguf");
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("merged"), std::string::npos) << refused;
  engine::TinyModelOptions plain;
  ASSERT_TRUE(engine::MakeTinyModel(dir / "bare", plain).ok());  // no tokenizer
  EXPECT_EQ(ExportGguf(dir / "bare", dir / "bare.gguf").code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(qlora::testing::FileExists(dir / "bare.gguf"));
}

}  // namespace
}  // namespace qlora::gguf
