// A Hugging Face tokenizer as GGUF's tokenizer.ggml.* metadata: tokenizer.json's byte-level BPE
// ("gpt2": tokens in id order, merges, token types, the pre-tokenizer's llama.cpp name) or
// SentencePiece's tokenizer.model ("llama": pieces, scores, types), with tokenizer_config.json's
// special tokens, add_bos/add_eos and chat template. Ids the model has beyond the tokenizer's
// become "[PAD<id>]" tokens of type unused, as llama.cpp's converter pads them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace qlora::gguf {

// GGUF token types (llama.cpp's llama_token_type).
enum TokenType : int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

struct GgufVocab {
  std::string model;                 // "gpt2" (BPE) or "llama" (SentencePiece)
  std::string pre;                   // the pre-tokenizer's llama.cpp name ("default" for SentencePiece)
  std::vector<std::string> tokens;
  std::vector<float> scores;         // SentencePiece only
  std::vector<int32_t> types;
  std::vector<std::string> merges;   // BPE only, "a b"
  std::optional<int32_t> bos_id, eos_id, unk_id, pad_id;
  std::optional<bool> add_bos, add_eos;
  std::string chat_template;         // "" when none
};

// From `model_dir`; `vocab_size` is the model's (config.json). `family` (model_type) helps name
// the BPE pre-tokenizer. INVALID_ARGUMENT for a tokenizer it cannot carry over.
absl::StatusOr<GgufVocab> ReadGgufVocab(const std::string& model_dir, int64_t vocab_size,
                                       const std::string& family);

}  // namespace qlora::gguf
