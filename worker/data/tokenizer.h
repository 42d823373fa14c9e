// One interface over the tokenizers a model folder can carry, and the loader that picks one.
//
// Supported:
//  - HF tokenizer.json with a byte-level BPE model (GPT-2, LLaMA-3, Qwen-2 style): added and
//    special tokens split out first (longest match; lstrip, rstrip, single_word honoured),
//    normalizer null or a Unicode form (NFC as Qwen-2 sets, NFD, NFKC, NFKD, or a Sequence of
//    them; ICU, unicode_normalizer.h) applied to the text between added tokens,
//    pre-tokenizer Split(Regex, Isolated|Removed) and/or
//    ByteLevel(use_regex, add_prefix_space) inside an optional Sequence, BPE merges by rank
//    (both merges formats, ignore_merges), ByteLevel decoding. Other normalizers and
//    pre-tokenizers (Metaspace-style tokenizer.json as Mistral/LLaMA-2 ship) are refused with
//    a clear error, and LoadTokenizer then uses tokenizer.model if the folder has one.
//  - SentencePiece tokenizer.model (LLaMA-2: BPE with byte fallback; unigram too) through
//    libsentencepiece.
// BOS/EOS/pad come from tokenizer_config.json (bos_token, eos_token, pad_token,
// add_bos_token, add_eos_token) when present, else from the model (the post-processor
// template for tokenizer.json; the model's ids for SentencePiece).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace qlora::data {

struct SpecialTokens {
  int32_t bos_id = -1;   // -1: none
  int32_t eos_id = -1;
  int32_t pad_id = -1;
  bool add_bos = false;  // whether a full sequence starts with BOS (HF add_special_tokens)
  bool add_eos = false;  // whether a plain encode ends with EOS (the builder adds EOS itself)
};

// What tokenizer_config.json (or a chat_template.jinja beside it) gives a chat template: its
// source ("" when the folder has none) and the special-token strings it may print.
struct ChatConfig {
  std::string chat_template;
  std::optional<std::string> bos_token, eos_token, pad_token;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Appends the ids of `text` without any special token added around it (as HF
  // encode(text, add_special_tokens=False)). Special-token strings inside `text` become their
  // ids for tokenizer.json (as HF); SentencePiece tokenizes them as text, so callers insert
  // BOS/EOS by id.
  virtual absl::Status EncodeTo(absl::string_view text, std::vector<int32_t>* ids) const = 0;
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text) const {
    std::vector<int32_t> ids;
    absl::Status status = EncodeTo(text, &ids);
    if (!status.ok()) return status;
    return ids;
  }
  virtual absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const = 0;
  // The id of a whole token (special or not), or -1.
  virtual int32_t TokenToId(absl::string_view token) const = 0;
  virtual int32_t vocab_size() const = 0;
  virtual std::string kind() const = 0;  // "tokenizer.json (byte-level BPE)", ...
  // The exact bytes `id` stands for in a text that encodes to it (an added token: its
  // content), or nullopt where the tokenizer cannot say (SentencePiece). The chat-template
  // example builder aligns tokens with the rendered text through it.
  virtual std::optional<std::string> TokenText(int32_t id) const { return std::nullopt; }

  const SpecialTokens& special() const { return special_; }
  const ChatConfig& chat_config() const { return chat_config_; }
  void set_chat_config(ChatConfig config) { chat_config_ = std::move(config); }  // loaders

 protected:
  SpecialTokens special_;
  ChatConfig chat_config_;
};

// Loads tokenizer.json (preferred) or tokenizer.model from `model_dir`, with
// tokenizer_config.json when present.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& model_dir);

// The two concrete loaders (hf_bpe_tokenizer.cc, sentencepiece_tokenizer.cc). `config_path`
// may name a missing file.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadHfBpeTokenizer(const std::string& json_path,
                                                              const std::string& config_path);
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceTokenizer(
    const std::string& model_path, const std::string& config_path);

}  // namespace qlora::data
