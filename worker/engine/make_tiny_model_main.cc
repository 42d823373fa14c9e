// qlora-make-tiny-model OUTDIR [--model_type mistral --layers N ...]: writes a random LLaMA,
// Mistral or Qwen2 checkpoint as an HF folder (config.json + model.safetensors) for demos and tests.
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "common/program/program_flags.h"
#include "worker/engine/tiny_model.h"

ABSL_FLAG(std::string, model_type, "llama", "llama | mistral | qwen2");
ABSL_FLAG(int64_t, sliding_window, 0, "mistral/qwen2 attention window (0: none)");
ABSL_FLAG(int64_t, layers, 2, "num_hidden_layers");
ABSL_FLAG(int64_t, hidden, 64, "hidden_size");
ABSL_FLAG(int64_t, intermediate, 128, "intermediate_size");
ABSL_FLAG(int64_t, heads, 4, "num_attention_heads");
ABSL_FLAG(int64_t, kv_heads, 2, "num_key_value_heads");
ABSL_FLAG(int64_t, head_dim, 0, "head_dim (0: hidden / heads)");
ABSL_FLAG(int64_t, vocab, 256, "vocab_size");
ABSL_FLAG(int64_t, bos_token_id, 1, "bos_token_id (match the tokenizer put beside the model)");
ABSL_FLAG(int64_t, eos_token_id, 2, "eos_token_id (generation stops at it: match the tokenizer)");
ABSL_FLAG(int64_t, max_positions, 512, "max_position_embeddings");
ABSL_FLAG(bool, tie_embeddings, false, "tie_word_embeddings");
ABSL_FLAG(bool, llama3_rope, false, "llama3 rope scaling (factor 8, original context 64)");
ABSL_FLAG(bool, rope_parameters, false, "write transformers 5's rope_parameters form");
ABSL_FLAG(double, rope_theta, 10000.0, "rope_theta");
ABSL_FLAG(std::string, dtype, "float32", "float32 | bfloat16 | float16");
ABSL_FLAG(double, init_std, 0.02, "std of the random weights");
ABSL_FLAG(uint64_t, seed, 0, "random seed");
ABSL_FLAG(uint64_t, max_shard_bytes, 0, "0: one file; else shard with an index");
ABSL_FLAG(bool, bnb_nf4, false,
          "linear weights pre-quantized as bitsandbytes saves NF4 with double quantization "
          "(random codes; any shape, e.g. LLaMA-2-70B's in the time it takes to write 36 GB)");

int main(int argc, char** argv) {
  qlora::ProgramFlagsOptions program;
  program.program = "qlora-make-tiny-model";
  program.usage = "qlora-make-tiny-model OUTDIR [flags]\n"
                  "Writes a random LLaMA, Mistral or Qwen2 checkpoint (config.json + model.safetensors).";
  program.flag_files = {"make_tiny_model_main.cc"};
  std::vector<char*> args = qlora::ParseProgramFlags(argc, argv, program);
  if (args.size() != 2) {
    std::cerr << "usage: qlora-make-tiny-model OUTDIR [--layers N --hidden N ...]\n";
    return 2;
  }
  qlora::engine::TinyModelOptions options;
  qlora::engine::LlamaConfig& c = options.config;
  c.num_hidden_layers = absl::GetFlag(FLAGS_layers);
  c.hidden_size = absl::GetFlag(FLAGS_hidden);
  c.intermediate_size = absl::GetFlag(FLAGS_intermediate);
  c.num_attention_heads = absl::GetFlag(FLAGS_heads);
  c.num_key_value_heads = absl::GetFlag(FLAGS_kv_heads);
  c.head_dim = absl::GetFlag(FLAGS_head_dim) > 0 ? absl::GetFlag(FLAGS_head_dim)
                                                 : c.hidden_size / c.num_attention_heads;
  c.vocab_size = absl::GetFlag(FLAGS_vocab);
  c.bos_token_id = absl::GetFlag(FLAGS_bos_token_id);
  c.eos_token_id = absl::GetFlag(FLAGS_eos_token_id);
  c.max_position_embeddings = absl::GetFlag(FLAGS_max_positions);
  c.tie_word_embeddings = absl::GetFlag(FLAGS_tie_embeddings);
  c.rope.theta = absl::GetFlag(FLAGS_rope_theta);
  if (absl::GetFlag(FLAGS_llama3_rope)) {
    c.rope.type = qlora::engine::RopeType::kLlama3;
    c.rope.factor = 8.0;
    c.rope.original_max_position_embeddings = 64;
  }
  if (const absl::Status family = qlora::engine::SetModelFamily(
          absl::GetFlag(FLAGS_model_type), absl::GetFlag(FLAGS_sliding_window), &c);
      !family.ok()) {
    std::cerr << family.message() << "\n";
    return 2;
  }
  options.rope_form = absl::GetFlag(FLAGS_rope_parameters)
                          ? qlora::engine::RopeJsonForm::kRopeParameters
                          : qlora::engine::RopeJsonForm::kRopeScaling;
  options.dtype = absl::GetFlag(FLAGS_dtype);
  options.init_std = absl::GetFlag(FLAGS_init_std);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.max_shard_bytes = absl::GetFlag(FLAGS_max_shard_bytes);
  options.bnb_nf4 = absl::GetFlag(FLAGS_bnb_nf4);
  if (c.num_attention_heads <= 0 || c.num_key_value_heads <= 0 ||
      c.num_attention_heads % c.num_key_value_heads != 0 || c.head_dim % 2 != 0) {
    std::cerr << "heads must be a positive multiple of kv_heads and head_dim even\n";
    return 2;
  }
  const absl::Status status = qlora::engine::MakeTinyModel(args[1], options);
  if (!status.ok()) {
    std::cerr << status << "\n";
    return 1;
  }
  std::cout << "wrote " << args[1] << "\n";
  return 0;
}
