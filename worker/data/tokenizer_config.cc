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

constexpr size_t kMaxTemplateFileRead = 4u << 20;

// tokenizer_config.json's chat_template: a string, or [{name, template}, ...] (the "default").
absl::StatusOr<std::string> ChatTemplateOf(const nlohmann::json& config, const std::string& path) {
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (const nlohmann::json& entry : *it)
      if (entry.is_object() && entry.value("name", std::string()) == "default" &&
          entry.contains("template") && entry["template"].is_string())
        return entry["template"].get<std::string>();
    return std::string();  // named templates only (tool_use, rag, ...): none is the default
  }
  return absl::InvalidArgumentError(absl::StrCat(path, ": chat_template must be a string or a list"));
}

// The chat_template.jinja beside `config_path`, if any.
std::optional<std::string> ChatTemplateFile(const std::string& config_path) {
  const size_t slash = config_path.rfind('/');
  const std::string path =
      (slash == std::string::npos ? std::string() : config_path.substr(0, slash + 1)) + "chat_template.jinja";
  if (access(path.c_str(), F_OK) != 0) return std::nullopt;
  // Read at most 4 MiB + 1 (an untrusted folder); ChatTemplate::Compile refuses large ones.
  std::ifstream in(path, std::ios::binary);
  std::string text(kMaxTemplateFileRead + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  return text;
}

}  // namespace

absl::StatusOr<TokenizerConfig> ReadTokenizerConfig(const std::string& path) {
  TokenizerConfig config;
  std::optional<std::string> template_file = ChatTemplateFile(path);
  if (template_file) config.chat_template = std::move(*template_file);
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
  if (!template_file) {
    absl::StatusOr<std::string> chat_template = ChatTemplateOf(json, path);
    if (!chat_template.ok()) return chat_template.status();
    config.chat_template = std::move(*chat_template);
  }
  return config;
}

absl::Status ApplyTokenizerConfig(const TokenizerConfig& config, Tokenizer* tokenizer,
                                  SpecialTokens* special) {
  tokenizer->set_chat_config({config.chat_template, config.bos_token, config.eos_token, config.pad_token});
  auto lookup = [&](const std::optional<std::string>& token, int32_t* id) -> absl::Status {
    if (!token) return absl::OkStatus();
    int32_t found = tokenizer->TokenToId(*token);
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
