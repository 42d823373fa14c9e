// Preference pairs tokenized as TRL's DPOTrainer does (see preference_example.h).
#include "worker/data/preference_example.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/data/chat_example.h"
#include "worker/data/chat_template/chat_template.h"

namespace qlora::data {
namespace {

// A conversation: a non-empty JSON array of objects. A string completion that merely looks like
// JSON ("[1, 2]") stays a string.
bool IsConversation(const std::string& text) {
  if (text.empty() || text.front() != '[') return false;
  const nlohmann::json parsed = nlohmann::json::parse(text, nullptr, false);
  if (!parsed.is_array() || parsed.empty()) return false;
  for (const nlohmann::json& turn : parsed)
    if (!turn.is_object()) return false;
  return true;
}

size_t CommonPrefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

absl::StatusOr<std::vector<int32_t>> EncodeString(const Tokenizer& tokenizer, const std::string& text) {
  std::vector<int32_t> ids;
  if (tokenizer.special().add_bos) ids.push_back(tokenizer.special().bos_id);
  QLORA_RETURN_IF_ERROR(tokenizer.EncodeTo(text, &ids));
  return ids;
}

// The EOS token's text, where the tokenizer can say.
std::string EosText(const Tokenizer& tokenizer) {
  if (tokenizer.chat_config().eos_token) return *tokenizer.chat_config().eos_token;
  return tokenizer.TokenText(tokenizer.special().eos_id).value_or("");
}

// prompt + completion with EOS, as TRL's add_eos then tokenization give it.
absl::StatusOr<std::vector<int32_t>> EncodeSide(const Tokenizer& tokenizer, const std::string& prompt,
                                                const std::string& completion) {
  QLORA_ASSIGN_OR_RETURN(std::vector<int32_t> ids, EncodeString(tokenizer, prompt + completion));
  const std::string eos = EosText(tokenizer);
  if (eos.empty() || !absl::EndsWith(completion, eos)) ids.push_back(tokenizer.special().eos_id);
  return ids;
}

absl::StatusOr<std::vector<int32_t>> RenderIds(const PreferenceTokenization& t, const nlohmann::json& messages,
                                               bool add_generation_prompt) {
  QLORA_ASSIGN_OR_RETURN(const jinja::Value value, MessagesValue(messages.dump()));
  QLORA_ASSIGN_OR_RETURN(const jinja::RenderResult rendered,
                         t.chat_template->Render(value, add_generation_prompt, *t.chat_tokens));
  std::vector<int32_t> ids;
  QLORA_RETURN_IF_ERROR(t.tokenizer->EncodeTo(rendered.text, &ids));
  return ids;
}

absl::StatusOr<nlohmann::json> Turns(absl::string_view column, const std::string& text) {
  QLORA_ASSIGN_OR_RETURN(const std::string messages, ChatMessages(column, text));
  return nlohmann::json::parse(messages);
}

nlohmann::json Concat(const nlohmann::json& a, const nlohmann::json& b) {
  nlohmann::json out = a;
  for (const nlohmann::json& turn : b) out.push_back(turn);
  return out;
}

struct PairIds {
  std::vector<int32_t> prompt, chosen, rejected;
};

absl::StatusOr<PairIds> ConversationIds(const PreferenceTokenization& t, const ExampleOptions& options,
                                        const std::string* prompt_text, const std::string& chosen_text,
                                        const std::string& rejected_text) {
  if (t.chat_template == nullptr) {
    return absl::FailedPreconditionError(
        "conversational preference data needs the tokenizer's chat template "
        "(tokenizer_config.json has none); use prompt, chosen and rejected strings");
  }
  QLORA_ASSIGN_OR_RETURN(nlohmann::json chosen, Turns(options.output_column, chosen_text));
  QLORA_ASSIGN_OR_RETURN(nlohmann::json rejected, Turns(options.rejected_column, rejected_text));
  nlohmann::json prompt = nlohmann::json::array();
  if (prompt_text != nullptr) {
    QLORA_ASSIGN_OR_RETURN(prompt, Turns(options.input_columns[0], *prompt_text));
  } else {
    // TRL's extract_prompt: the turns before the first that differs (the last shared one when
    // one side is a prefix of the other).
    const size_t shortest = std::min(chosen.size(), rejected.size());
    size_t split = shortest == 0 ? 0 : shortest - 1;
    for (size_t i = 0; i < shortest; ++i) {
      if (chosen[i] != rejected[i]) {
        split = i;
        break;
      }
    }
    if (split == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "no prompt: '", options.output_column, "' and '", options.rejected_column,
          "' share no first turns, and the record has no '", options.input_columns[0], "' column"));
    }
    prompt = nlohmann::json(chosen.begin(), chosen.begin() + split);
    chosen = nlohmann::json(chosen.begin() + split, chosen.end());
    rejected = nlohmann::json(rejected.begin() + split, rejected.end());
  }
  PairIds ids;
  QLORA_ASSIGN_OR_RETURN(ids.prompt, RenderIds(t, prompt, /*add_generation_prompt=*/true));
  QLORA_ASSIGN_OR_RETURN(ids.chosen, RenderIds(t, Concat(prompt, chosen), false));
  QLORA_ASSIGN_OR_RETURN(ids.rejected, RenderIds(t, Concat(prompt, rejected), false));
  return ids;
}

// One side: ids with labels on what follows the prompt, cut to `max` tokens.
bool Fill(const std::vector<int32_t>& ids, size_t prompt_len, size_t max, std::vector<int32_t>* out_ids,
          std::vector<int32_t>* out_labels) {
  const size_t n = std::min(ids.size(), max);
  out_ids->assign(ids.begin(), ids.begin() + n);
  out_labels->assign(n, kIgnoreIndex);
  for (size_t i = prompt_len; i < n; ++i) (*out_labels)[i] = ids[i];
  return n < ids.size();
}

}  // namespace

absl::StatusOr<PreferenceBuild> BuildPreferencePair(const PreferenceTokenization& t,
                                                    const ExampleOptions& options,
                                                    const Record& record, Example* example) {
  const std::string* prompt = record.Find(options.input_columns[0]);
  const std::string* chosen = record.Find(options.output_column);
  const std::string* rejected = record.Find(options.rejected_column);
  for (const auto& [column, value] : {std::pair{&options.output_column, chosen}, {&options.rejected_column, rejected}}) {
    if (value == nullptr) return absl::InvalidArgumentError(absl::StrCat("missing column '", *column, "'"));
  }
  const bool conversation = IsConversation(*chosen);
  if (IsConversation(*rejected) != conversation || (prompt != nullptr && IsConversation(*prompt) != conversation)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", options.input_columns[0], "', '", options.output_column, "' and '", options.rejected_column,
        "' must all be strings or all be conversations (JSON arrays of turns)"));
  }
  PairIds ids;
  if (conversation) {
    QLORA_ASSIGN_OR_RETURN(ids, ConversationIds(t, options, prompt, *chosen, *rejected));
  } else {
    if (prompt == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("missing column '", options.input_columns[0], "'"));
    }
    QLORA_ASSIGN_OR_RETURN(ids.prompt, EncodeString(*t.tokenizer, *prompt));
    QLORA_ASSIGN_OR_RETURN(ids.chosen, EncodeSide(*t.tokenizer, *prompt, *chosen));
    QLORA_ASSIGN_OR_RETURN(ids.rejected, EncodeSide(*t.tokenizer, *prompt, *rejected));
  }
  const size_t prompt_len = std::min(CommonPrefix(ids.prompt, ids.chosen), CommonPrefix(ids.prompt, ids.rejected));
  const size_t max = static_cast<size_t>(options.max_sequence_length);
  PreferenceBuild build;
  if (prompt_len >= max) return build;
  build.kept = true;
  build.truncated |= Fill(ids.chosen, prompt_len, max, &example->input_ids, &example->labels);
  build.truncated |= Fill(ids.rejected, prompt_len, max, &example->rejected_input_ids, &example->rejected_labels);
  return build;
}

absl::StatusOr<std::vector<int32_t>> PreferencePromptIds(const PreferenceTokenization& t,
                                                         const std::string& prompt) {
  if (!IsConversation(prompt)) return EncodeString(*t.tokenizer, prompt);
  if (t.chat_template == nullptr) {
    return absl::FailedPreconditionError("a conversation needs the tokenizer's chat template");
  }
  QLORA_ASSIGN_OR_RETURN(const nlohmann::json turns, Turns("prompt", prompt));
  return RenderIds(t, turns, /*add_generation_prompt=*/true);
}

}  // namespace qlora::data
