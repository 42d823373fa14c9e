// ReadGgufVocab: tokenizer.json (BPE) or tokenizer.model (SentencePiece, read straight from its
// protobuf wire format: ModelProto.pieces = field 1, each {piece = 1, score = 2, type = 3}).
#include "worker/export/gguf_vocab.h"

#include <algorithm>
#include <cstring>
#include <map>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/posix_files.h"

namespace qlora::gguf {
namespace {

// The file's bytes, or nullopt when it cannot be read (a folder without it).
std::optional<std::string> ReadText(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  return text.ok() ? std::optional<std::string>(*std::move(text)) : std::nullopt;
}

// A protobuf varint at *at in `bytes`; false past the end.
bool Varint(const std::string& bytes, size_t* at, uint64_t* value) {
  *value = 0;
  for (int shift = 0; shift < 64 && *at < bytes.size(); shift += 7) {
    const uint8_t b = static_cast<uint8_t>(bytes[(*at)++]);
    *value |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

// Skips a field of wire type `wire`; false when malformed.
bool Skip(const std::string& bytes, size_t* at, uint64_t wire) {
  uint64_t n = 0;
  switch (wire) {
    case 0: return Varint(bytes, at, &n);
    case 1: *at += 8; return *at <= bytes.size();
    case 2: if (!Varint(bytes, at, &n)) return false; *at += n; return *at <= bytes.size();
    case 5: *at += 4; return *at <= bytes.size();
    default: return false;
  }
}

absl::Status ReadSentencePiece(const std::string& bytes, GgufVocab* vocab) {
  const absl::Status malformed = absl::InvalidArgumentError("tokenizer.model: not a SentencePiece model");
  size_t at = 0;
  while (at < bytes.size()) {
    uint64_t key = 0, length = 0;
    if (!Varint(bytes, &at, &key)) return malformed;
    if (key != ((1 << 3) | 2)) {
      if (!Skip(bytes, &at, key & 7)) return malformed;
      continue;
    }
    if (!Varint(bytes, &at, &length) || at + length > bytes.size()) return malformed;
    const std::string piece_bytes = bytes.substr(at, length);
    at += length;
    std::string piece;
    float score = 0;
    int32_t type = kNormal;
    for (size_t p = 0; p < piece_bytes.size();) {
      uint64_t field = 0, value = 0;
      if (!Varint(piece_bytes, &p, &field)) return malformed;
      if (field == ((1 << 3) | 2)) {
        if (!Varint(piece_bytes, &p, &value) || p + value > piece_bytes.size()) return malformed;
        piece = piece_bytes.substr(p, value);
        p += value;
      } else if (field == ((2 << 3) | 5)) {
        if (p + 4 > piece_bytes.size()) return malformed;
        std::memcpy(&score, piece_bytes.data() + p, 4);
        p += 4;
      } else if (field == ((3 << 3) | 0)) {
        if (!Varint(piece_bytes, &p, &value)) return malformed;
        type = static_cast<int32_t>(value);
      } else if (!Skip(piece_bytes, &p, field & 7)) {
        return malformed;
      }
    }
    if (type == kUnknown) vocab->unk_id = static_cast<int32_t>(vocab->tokens.size());
    vocab->tokens.push_back(piece);
    vocab->scores.push_back(score);
    vocab->types.push_back(type);
  }
  if (vocab->tokens.empty()) return malformed;
  vocab->model = "llama";
  vocab->pre = "default";  // as llama.cpp's converter writes it for SentencePiece too
  return absl::OkStatus();
}

absl::Status ReadBpe(const nlohmann::json& tokenizer, const std::string& family, GgufVocab* vocab) {
  const nlohmann::json& model = tokenizer.value("model", nlohmann::json::object());
  if (model.value("type", "") != "BPE" || !model.contains("vocab")) {
    return absl::InvalidArgumentError(
        "tokenizer.json: only BPE models carry over to GGUF here (WordPiece and Unigram do not)");
  }
  std::map<int64_t, std::pair<std::string, int32_t>> by_id;
  for (const auto& [token, id] : model["vocab"].items()) by_id[id.get<int64_t>()] = {token, kNormal};
  for (const nlohmann::json& added : tokenizer.value("added_tokens", nlohmann::json::array())) {
    by_id[added.value("id", int64_t{-1})] = {added.value("content", ""),
                                             added.value("special", false) ? kControl : kUserDefined};
  }
  const int64_t count = by_id.empty() ? 0 : by_id.rbegin()->first + 1;
  for (int64_t id = 0; id < count; ++id) {
    auto it = by_id.find(id);
    vocab->tokens.push_back(it == by_id.end() ? absl::StrCat("[PAD", id, "]") : it->second.first);
    vocab->types.push_back(it == by_id.end() ? kUnused : it->second.second);
  }
  for (const nlohmann::json& merge : model.value("merges", nlohmann::json::array())) {
    if (merge.is_string()) {
      vocab->merges.push_back(merge.get<std::string>());
    } else if (merge.is_array() && merge.size() == 2) {
      vocab->merges.push_back(absl::StrCat(merge[0].get<std::string>(), " ", merge[1].get<std::string>()));
    }
  }
  vocab->model = "gpt2";
  // llama.cpp names each family's pre-tokenizer (its splitting regex); LLaMA-3's and Qwen2's
  // are recognised, any other BPE gets llama.cpp's default one.
  const bool llama3 = model["vocab"].contains("<|begin_of_text|>") ||
                      std::any_of(vocab->tokens.begin(), vocab->tokens.end(),
                                  [](const std::string& t) { return t == "<|begin_of_text|>"; });
  vocab->pre = family == "qwen2" ? "qwen2" : llama3 ? "llama-bpe" : "default";
  return absl::OkStatus();
}

std::optional<int32_t> IdOf(const GgufVocab& vocab, const nlohmann::json& token) {
  std::string text;
  if (token.is_string()) text = token.get<std::string>();
  if (token.is_object()) text = token.value("content", "");
  if (text.empty()) return std::nullopt;
  for (size_t i = 0; i < vocab.tokens.size(); ++i) {
    if (vocab.tokens[i] == text) return static_cast<int32_t>(i);
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<GgufVocab> ReadGgufVocab(const std::string& model_dir, int64_t vocab_size,
                                       const std::string& family) {
  GgufVocab vocab;
  if (std::optional<std::string> json = ReadText(model_dir + "/tokenizer.json")) {
    const nlohmann::json tokenizer = nlohmann::json::parse(*json, nullptr, false);
    if (!tokenizer.is_object()) return absl::InvalidArgumentError("tokenizer.json is not JSON");
    if (absl::Status s = ReadBpe(tokenizer, family, &vocab); !s.ok()) return s;
  } else if (std::optional<std::string> model = ReadText(model_dir + "/tokenizer.model")) {
    if (absl::Status s = ReadSentencePiece(*model, &vocab); !s.ok()) return s;
  } else {
    return absl::NotFoundError(absl::StrCat(model_dir, " has no tokenizer.json nor tokenizer.model"));
  }
  if (static_cast<int64_t>(vocab.tokens.size()) > vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("the tokenizer has ", vocab.tokens.size(),
                                                   " tokens, the model's vocabulary ", vocab_size));
  }
  for (int64_t id = static_cast<int64_t>(vocab.tokens.size()); id < vocab_size; ++id) {
    vocab.tokens.push_back(absl::StrCat("[PAD", id, "]"));
    vocab.types.push_back(kUnused);
    if (!vocab.scores.empty()) vocab.scores.push_back(0);
  }
  if (std::optional<std::string> text = ReadText(model_dir + "/tokenizer_config.json")) {
    const nlohmann::json config = nlohmann::json::parse(*text, nullptr, false);
    if (config.is_object()) {
      if (config.contains("bos_token")) vocab.bos_id = IdOf(vocab, config["bos_token"]);
      if (config.contains("eos_token")) vocab.eos_id = IdOf(vocab, config["eos_token"]);
      if (config.contains("unk_token")) vocab.unk_id = IdOf(vocab, config["unk_token"]);
      if (config.contains("pad_token")) vocab.pad_id = IdOf(vocab, config["pad_token"]);
      if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean()) vocab.add_bos = config["add_bos_token"].get<bool>();
      if (config.contains("add_eos_token") && config["add_eos_token"].is_boolean()) vocab.add_eos = config["add_eos_token"].get<bool>();
      const nlohmann::json& chat = config.value("chat_template", nlohmann::json());
      if (chat.is_string()) vocab.chat_template = chat.get<std::string>();
      if (chat.is_array()) {
        for (const nlohmann::json& named : chat) {
          if (named.value("name", "") == "default") vocab.chat_template = named.value("template", "");
        }
      }
    }
  }
  if (vocab.chat_template.empty()) {
    if (std::optional<std::string> jinja = ReadText(model_dir + "/chat_template.jinja")) vocab.chat_template = *jinja;
  }
  return vocab;
}

}  // namespace qlora::gguf
