// Reads tokenizer_config.json (see tokenizer_config.h).
#include <unistd.h>

#include "worker/data/tokenizer_config.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace qlora::data {
namespace {

std::optional<std::string> TokenString(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return std::nullopt;
}

std::optional<bool> Flag(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || !it->is_boolean()) return std::nullopt;
  return it->get<bool>();
}

}  // namespace

absl::StatusOr<TokenizerConfig> ReadTokenizerConfig(const std::string& path) {
  TokenizerConfig config;
  if (access(path.c_str(), F_OK) != 0) return config;
  std::ifstream in(path);
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", e.what()));
  }
  if (!json.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": not an object"));
  config.bos_token = TokenString(json, "bos_token");
  config.eos_token = TokenString(json, "eos_token");
  config.pad_token = TokenString(json, "pad_token");
  config.add_bos_token = Flag(json, "add_bos_token");
  config.add_eos_token = Flag(json, "add_eos_token");
  return config;
}

absl::Status ApplyTokenizerConfig(const TokenizerConfig& config, const Tokenizer& tokenizer,
                                  SpecialTokens* special) {
  auto lookup = [&](const std::optional<std::string>& token, int32_t* id) -> absl::Status {
    if (!token) return absl::OkStatus();
    int32_t found = tokenizer.TokenToId(*token);
    if (found < 0)
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer_config.json names token '", *token, "' that the vocabulary lacks"));
    *id = found;
    return absl::OkStatus();
  };
  absl::Status status = lookup(config.bos_token, &special->bos_id);
  if (status.ok()) status = lookup(config.eos_token, &special->eos_id);
  if (status.ok()) status = lookup(config.pad_token, &special->pad_id);
  if (!status.ok()) return status;
  if (config.add_bos_token) special->add_bos = *config.add_bos_token;
  if (config.add_eos_token) special->add_eos = *config.add_eos_token;
  if (special->bos_id < 0) special->add_bos = false;
  if (special->eos_id < 0) special->add_eos = false;
  return absl::OkStatus();
}

}  // namespace qlora::data
