// The Tokenizer for HF tokenizer.json files with a byte-level BPE model (LLaMA-3, Qwen-2,
// GPT-2 style). What is supported is listed in tokenizer.h.
#include <algorithm>
#include <deque>
#include <fstream>
#include <limits>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/data/added_tokens.h"
#include "worker/data/bpe_model.h"
#include "worker/data/byte_level.h"
#include "worker/data/regex_splitter.h"
#include "worker/data/tokenizer.h"
#include "worker/data/tokenizer_config.h"
#include "worker/data/unicode_normalizer.h"

namespace qlora::data {
namespace {

using Json = nlohmann::json;

// One pre-tokenizer stage: prepend a space to pieces that lack one, and/or split them.
struct PreTokenizeStep {
  bool prefix_space = false;
  std::optional<RegexSplitter> split;
};

std::string TypeOf(const Json& node) {
  return node.is_object() && node.contains("type") && node["type"].is_string()
             ? node["type"].get<std::string>()
             : std::string();
}

// A token id as tokenizer.json writes it: an integer from 0 to 2^31 - 2 (so that the largest
// id + 1 is an int32_t too). nlohmann's get<int32_t> of a float or of a larger number is
// undefined behaviour.
absl::StatusOr<int32_t> TokenId(const Json& value, absl::string_view what) {
  constexpr uint64_t kMaxId = std::numeric_limits<int32_t>::max() - 1;
  if (value.is_number_unsigned() && value.get<uint64_t>() <= kMaxId)
    return static_cast<int32_t>(value.get<uint64_t>());
  return absl::InvalidArgumentError(
      absl::StrCat("tokenizer.json: ", what, " has id ",
                   value.is_number() ? value.dump() : std::string(value.type_name()),
                   "; a token id is an integer from 0 to ", kMaxId));
}

absl::Status ParsePreTokenizer(const Json& node, std::vector<PreTokenizeStep>* steps,
                               bool* byte_level) {
  if (node.is_null()) return absl::OkStatus();
  const std::string type = TypeOf(node);
  if (type == "Sequence") {
    for (const Json& child : node.value("pretokenizers", Json::array()))
      QLORA_RETURN_IF_ERROR(ParsePreTokenizer(child, steps, byte_level));
    return absl::OkStatus();
  }
  if (type == "Split") {
    const Json& pattern = node.value("pattern", Json::object());
    std::string regex;
    if (pattern.contains("Regex")) {
      regex = pattern["Regex"].get<std::string>();
    } else if (pattern.contains("String")) {
      regex = RegexSplitter::QuoteLiteral(pattern["String"].get<std::string>());
    } else {
      return absl::InvalidArgumentError("tokenizer.json: Split pre-tokenizer without a pattern");
    }
    const std::string behavior = node.value("behavior", std::string("Isolated"));
    if (node.value("invert", false) || (behavior != "Isolated" && behavior != "Removed"))
      return absl::UnimplementedError(absl::StrCat(
          "tokenizer.json: Split behavior '", behavior, "' (or invert) is not supported"));
    QLORA_ASSIGN_OR_RETURN(RegexSplitter splitter,
                           RegexSplitter::Compile(regex, behavior == "Isolated"
                                                             ? RegexSplitter::Behavior::kIsolated
                                                             : RegexSplitter::Behavior::kRemoved));
    steps->push_back({false, std::move(splitter)});
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    *byte_level = true;
    PreTokenizeStep step;
    step.prefix_space = node.value("add_prefix_space", false);
    if (node.value("use_regex", true)) {
      QLORA_ASSIGN_OR_RETURN(RegexSplitter splitter,
                             RegexSplitter::Compile(kGpt2SplitPattern,
                                                    RegexSplitter::Behavior::kIsolated));
      step.split = std::move(splitter);
    }
    if (step.prefix_space || step.split) steps->push_back(std::move(step));
    return absl::OkStatus();
  }
  return absl::UnimplementedError(
      absl::StrCat("tokenizer.json: pre_tokenizer '", type, "' is not supported"));
}

// BOS/EOS implied by a TemplateProcessing post-processor (possibly inside a Sequence).
absl::Status ParsePostProcessor(const Json& node, SpecialTokens* special) {
  const std::string type = TypeOf(node);
  if (type == "Sequence") {
    for (const Json& child : node.value("processors", Json::array()))
      QLORA_RETURN_IF_ERROR(ParsePostProcessor(child, special));
    return absl::OkStatus();
  }
  if (type != "TemplateProcessing") return absl::OkStatus();
  const Json& specials = node.value("special_tokens", Json::object());
  bool after_sequence = false;
  for (const Json& item : node.value("single", Json::array())) {
    if (item.contains("Sequence")) {
      after_sequence = true;
      continue;
    }
    if (!item.contains("SpecialToken")) continue;
    const std::string name = item["SpecialToken"].value("id", std::string());
    if (!specials.contains(name) || specials[name].value("ids", Json::array()).empty()) continue;
    QLORA_ASSIGN_OR_RETURN(const int32_t id,
                           TokenId(specials[name]["ids"][0], "post_processor special token"));
    if (after_sequence) {
      special->eos_id = id;
      special->add_eos = true;
    } else {
      special->bos_id = id;
      special->add_bos = true;
    }
  }
  return absl::OkStatus();
}

class HfBpeTokenizer : public Tokenizer {
 public:
  HfBpeTokenizer(AddedTokenSplitter added, std::vector<PreTokenizeStep> steps, BpeModel bpe,
                 absl::flat_hash_map<int32_t, std::string> id_to_bytes, int32_t vocab_size)
      : added_(std::move(added)),
        steps_(std::move(steps)),
        bpe_(std::move(bpe)),
        id_to_bytes_(std::move(id_to_bytes)),
        vocab_size_(vocab_size) {}
  SpecialTokens* mutable_special() { return &special_; }
  void set_normalizer(UnicodeNormalizer normalizer) { normalizer_ = std::move(normalizer); }

  absl::Status EncodeTo(absl::string_view text, std::vector<int32_t>* ids) const override {
    std::vector<absl::string_view> pieces, next;
    std::deque<std::string> owned;  // pieces that gained a prefix space or were normalized
    added_.Split(
        text,
        [&](absl::string_view segment) {
          // Added tokens are matched on the raw text (normalized: false, as HF's are by
          // default for special tokens); the text between them is normalized.
          if (normalizer_) {
            owned.push_back(normalizer_->Normalize(segment));
            segment = owned.back();
          }
          pieces.assign(1, segment);
          for (const PreTokenizeStep& step : steps_) {
            if (step.prefix_space) {
              for (absl::string_view& piece : pieces) {
                if (!piece.empty() && piece[0] == ' ') continue;
                owned.push_back(absl::StrCat(" ", piece));
                piece = owned.back();
              }
            }
            if (step.split) {
              next.clear();
              for (absl::string_view piece : pieces) step.split->Split(piece, &next);
              pieces.swap(next);
            }
          }
          for (absl::string_view piece : pieces) bpe_.Encode(piece, ids);
        },
        [&](int32_t id) { ids->push_back(id); });
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const override {
    std::string text;
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab_size_)
        return absl::OutOfRangeError(absl::StrCat("token id ", id, " is outside the vocabulary"));
      auto it = id_to_bytes_.find(id);
      if (it != id_to_bytes_.end()) text += it->second;  // an unused id decodes to nothing
    }
    return text;
  }

  int32_t TokenToId(absl::string_view token) const override {
    int32_t id = added_.Find(token);
    if (id >= 0) return id;
    std::string raw;
    return ByteLevelDecode(token, &raw) ? bpe_.Find(raw) : -1;
  }
  int32_t vocab_size() const override { return vocab_size_; }
  std::string kind() const override { return "tokenizer.json (byte-level BPE)"; }
  std::optional<std::string> TokenText(int32_t id) const override {
    auto it = id_to_bytes_.find(id);
    if (it == id_to_bytes_.end()) return std::nullopt;
    return it->second;
  }

 private:
  AddedTokenSplitter added_;
  std::optional<UnicodeNormalizer> normalizer_;
  std::vector<PreTokenizeStep> steps_;
  BpeModel bpe_;
  // What Decode prints for each id. A map, not a vector: ids may be sparse, and a vector sized
  // by the largest id let one entry of a tokenizer.json allocate gigabytes.
  absl::flat_hash_map<int32_t, std::string> id_to_bytes_;
  int32_t vocab_size_;  // the largest id + 1
};

// The normalizer: null, a Unicode form, or a Sequence of forms.
absl::StatusOr<std::optional<UnicodeNormalizer>> ParseNormalizer(const Json& node) {
  if (node.is_null()) return std::nullopt;
  std::vector<UnicodeNormalizer::Form> forms;
  const bool sequence = TypeOf(node) == "Sequence";
  const Json& list = sequence ? node.value("normalizers", Json::array()) : Json::array({node});
  for (const Json& entry : list) {
    absl::StatusOr<UnicodeNormalizer::Form> form = UnicodeNormalizer::ParseForm(TypeOf(entry));
    if (!form.ok()) return absl::Status(form.status().code(),
                                        absl::StrCat("tokenizer.json: ", form.status().message()));
    forms.push_back(*form);
  }
  QLORA_ASSIGN_OR_RETURN(UnicodeNormalizer normalizer, UnicodeNormalizer::Create(forms));
  return normalizer;
}

absl::StatusOr<std::unique_ptr<HfBpeTokenizer>> Build(const Json& root) {
  QLORA_ASSIGN_OR_RETURN(std::optional<UnicodeNormalizer> normalizer,
                         ParseNormalizer(root.value("normalizer", Json())));
  std::vector<PreTokenizeStep> steps;
  bool byte_level = false;
  QLORA_RETURN_IF_ERROR(ParsePreTokenizer(root.value("pre_tokenizer", Json()), &steps, &byte_level));
  const Json& model = root.value("model", Json::object());
  if (TypeOf(model) != "BPE" && !(model.contains("merges") && model.contains("vocab")))
    return absl::UnimplementedError(absl::StrCat("tokenizer.json: model '", TypeOf(model),
                                                 "' is not supported (byte-level BPE only)"));
  if (!byte_level)
    return absl::UnimplementedError(
        "tokenizer.json: only byte-level BPE is supported (no ByteLevel pre-tokenizer found)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(key) && !model[key].is_null() && !model[key].get<std::string>().empty())
      return absl::UnimplementedError(absl::StrCat("tokenizer.json: BPE ", key, " is not supported"));

  absl::flat_hash_map<int32_t, std::string> id_to_bytes;
  int32_t vocab_size = 0;
  auto set_id = [&](int32_t id, std::string bytes) {
    vocab_size = std::max(vocab_size, id + 1);
    id_to_bytes[id] = std::move(bytes);
  };
  absl::flat_hash_map<std::string, int32_t> vocab;
  const Json vocab_json = model.value("vocab", Json::object());  // items() needs a named owner
  for (const auto& [spelled, id_json] : vocab_json.items()) {
    QLORA_ASSIGN_OR_RETURN(const int32_t id,
                           TokenId(id_json, absl::StrCat("vocabulary entry '", spelled, "'")));
    std::string raw;
    if (ByteLevelDecode(spelled, &raw)) {
      vocab.emplace(raw, id);
      set_id(id, std::move(raw));
    } else {
      set_id(id, spelled);  // unreachable by byte-level BPE; decoded as written
    }
  }
  std::vector<std::pair<std::string, std::string>> merges;
  for (const Json& merge : model.value("merges", Json::array())) {
    std::string left, right;
    if (merge.is_string()) {  // legacy "a b"
      const std::string text = merge.get<std::string>();
      size_t space = text.find(' ');
      if (space == std::string::npos)
        return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: bad merge '", text, "'"));
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      return absl::InvalidArgumentError("tokenizer.json: a merge must be \"a b\" or [\"a\", \"b\"]");
    }
    std::string raw_left, raw_right;
    if (!ByteLevelDecode(left, &raw_left) || !ByteLevelDecode(right, &raw_right))
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: merge '", left, " ", right, "' is not byte-level"));
    merges.emplace_back(std::move(raw_left), std::move(raw_right));
  }
  int32_t unk_id = -1;
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    std::string raw;
    if (ByteLevelDecode(model["unk_token"].get<std::string>(), &raw)) {
      auto it = vocab.find(raw);
      if (it != vocab.end()) unk_id = it->second;
    }
  }
  QLORA_ASSIGN_OR_RETURN(BpeModel bpe, BpeModel::Build(std::move(vocab), merges,
                                                       model.value("ignore_merges", false), unk_id));
  std::vector<AddedToken> added;
  for (const Json& token : root.value("added_tokens", Json::array())) {
    AddedToken t;
    t.content = token.value("content", std::string());
    if (token.contains("id")) {
      QLORA_ASSIGN_OR_RETURN(t.id,
                             TokenId(token["id"], absl::StrCat("added token '", t.content, "'")));
    }
    t.lstrip = token.value("lstrip", false);
    t.rstrip = token.value("rstrip", false);
    t.single_word = token.value("single_word", false);
    t.special = token.value("special", false);
    if (t.content.empty() || t.id < 0) continue;
    set_id(t.id, t.content);
    added.push_back(std::move(t));
  }
  auto tokenizer = std::make_unique<HfBpeTokenizer>(AddedTokenSplitter(std::move(added)),
                                                    std::move(steps), std::move(bpe),
                                                    std::move(id_to_bytes), vocab_size);
  if (normalizer) tokenizer->set_normalizer(std::move(*normalizer));
  SpecialTokens* special = tokenizer->mutable_special();
  QLORA_RETURN_IF_ERROR(ParsePostProcessor(root.value("post_processor", Json()), special));
  for (int32_t id : {special->bos_id, special->eos_id})
    if (id >= vocab_size)
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer.json: post_processor special token id ", id, " is outside the vocabulary (",
          vocab_size, " ids)"));
  return tokenizer;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadHfBpeTokenizer(const std::string& json_path,
                                                              const std::string& config_path) {
  std::ifstream in(json_path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", json_path));
  std::unique_ptr<HfBpeTokenizer> tokenizer;
  try {
    Json root = Json::parse(in);
    absl::StatusOr<std::unique_ptr<HfBpeTokenizer>> built = Build(root);
    if (!built.ok())
      return absl::Status(built.status().code(),
                          absl::StrCat(json_path, ": ", built.status().message()));
    tokenizer = std::move(*built);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(json_path, ": ", e.what()));
  }
  QLORA_ASSIGN_OR_RETURN(TokenizerConfig config, ReadTokenizerConfig(config_path));
  QLORA_RETURN_IF_ERROR(ApplyTokenizerConfig(config, tokenizer.get(), tokenizer->mutable_special()));
  return std::unique_ptr<Tokenizer>(std::move(tokenizer));
}

}  // namespace qlora::data
