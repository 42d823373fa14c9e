// The files beside the weights that make a merged model folder complete for
// AutoModelForCausalLM / AutoTokenizer / pipelines: generation_config.json and the base
// model's tokenizer files. Torch-free.
//
// Files are copied only when they are regular files (a symbolic link is followed, as in a
// Hugging Face cache snapshot, but a FIFO or a device is refused) of at most
// kMaxServingFileBytes, so that a hostile base folder can neither block the copy nor fill the disk.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/model/llama_config.h"

namespace qlora::engine {

inline constexpr char kGenerationConfigFile[] = "generation_config.json";
// tokenizer.json of large vocabularies is ~10 MB; nothing legitimate comes near this.
inline constexpr int64_t kMaxServingFileBytes = 256 << 20;

// Those of these that the base folder has are copied.
inline constexpr const char* kTokenizerFiles[] = {
    "tokenizer.json",          "tokenizer.model",   "tokenizer_config.json",
    "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
};

// generation_config.json as transformers writes it for a model without one
// (GenerationConfig.from_model_config): {"_from_model_config": true, "bos_token_id", "eos_token_id"}.
std::string GenerationConfigFromModelConfig(const LlamaConfig& config);

// Copies `base_dir`'s generation_config.json (else writes GenerationConfigFromModelConfig) and
// its tokenizer files into `out_dir` ("" base_dir: only the generated generation_config.json). InvalidArgument for a present file that is not regular
// or is too large.
absl::Status WriteServingFiles(const std::string& base_dir, const std::string& out_dir,
                               const LlamaConfig& config);

}  // namespace qlora::engine
