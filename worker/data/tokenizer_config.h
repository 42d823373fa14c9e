// The parts of HF tokenizer_config.json the data path uses: special-token strings, whether
// BOS/EOS are added, and the chat template.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "worker/data/tokenizer.h"

namespace qlora::data {

struct TokenizerConfig {
  std::optional<std::string> bos_token;  // bos_token as a string or {"content": ...}
  std::optional<std::string> eos_token;
  std::optional<std::string> pad_token;
  std::optional<bool> add_bos_token;
  std::optional<bool> add_eos_token;
  // `chat_template` as a string, or the entry named "default" of a list of {name, template};
  // a chat_template.jinja beside the config wins (newer transformers save it there). "" if none.
  std::string chat_template;
};

// Reads `path`; a missing file gives an empty config.
absl::StatusOr<TokenizerConfig> ReadTokenizerConfig(const std::string& path);

// Overrides `special` with the config's tokens and flags, looked up in `tokenizer`, and gives
// `tokenizer` its chat config.
absl::Status ApplyTokenizerConfig(const TokenizerConfig& config, Tokenizer* tokenizer,
                                  SpecialTokens* special);

}  // namespace qlora::data
