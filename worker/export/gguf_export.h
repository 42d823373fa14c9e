// A Hugging Face LLaMA, Mistral or Qwen2 folder (a job's merged model) as one GGUF file that
// llama.cpp and Ollama load: its weights under llama.cpp's tensor names (LLaMA's and Mistral's
// q/k rows reordered for llama.cpp's rotary layout, as its converter does), norms and biases in
// float32 and the matrices in the chosen type (F16, BF16, Q8_0, or F32; a matrix whose rows do
// not split into Q8_0's blocks of 32 falls back to F16, as llama.cpp's converter does), the
// model's hyperparameters, LLaMA-3's rope frequency factors, and the tokenizer with its chat
// template (gguf_vocab.h). One tensor in memory at a time. Torch-free.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace qlora::gguf {

enum class GgufType { kF32, kF16, kBF16, kQ8_0 };

// "f32", "f16", "bf16", "q8_0"; INVALID_ARGUMENT naming the choices otherwise.
absl::StatusOr<GgufType> ParseGgufType(absl::string_view name);
const char* GgufTypeName(GgufType type);

struct GgufExportOptions {
  GgufType type = GgufType::kF16;
  std::string name;  // general.name; "" = the folder's name
};

// Writes `out_path` (through a temporary file beside it, renamed once complete).
// INVALID_ARGUMENT for a model it cannot carry over (pre-quantized weights, another family).
absl::Status ExportGguf(const std::string& model_dir, const std::string& out_path,
                        const GgufExportOptions& options = {});

}  // namespace qlora::gguf
