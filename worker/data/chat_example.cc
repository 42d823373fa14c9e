// Chat examples through the tokenizer's chat template (see chat_example.h).
#include "worker/data/chat_example.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/data/chat_template/builtins.h"

namespace qlora::data {
namespace {

// ShareGPT's speaker names, as LLaMA-Factory and Axolotl map them to chat roles.
absl::StatusOr<std::string> RoleOfSpeaker(const std::string& speaker) {
  static const std::pair<const char*, const char*> kRoles[] = {
      {"human", "user"},         {"user", "user"},          {"gpt", "assistant"},
      {"assistant", "assistant"}, {"model", "assistant"},    {"chatgpt", "assistant"},
      {"bard", "assistant"},     {"bing", "assistant"},     {"system", "system"},
      {"observation", "tool"},   {"tool", "tool"},          {"function_response", "tool"},
      {"function_call", "assistant"}};
  const std::string lower = absl::AsciiStrToLower(speaker);
  for (const auto& [name, role] : kRoles) {
    if (lower == name) return std::string(role);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown speaker '", speaker, "' (known: human, user, gpt, assistant, model, system, tool, "
      "observation, function_call, function_response)"));
}

}  // namespace

absl::StatusOr<std::string> ChatMessages(absl::string_view column, const std::string& text) {
  nlohmann::json turns = nlohmann::json::parse(text, nullptr, false);
  if (!turns.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", column, "' must be a JSON array of {role, content} or {from, value} turns"));
  }
  bool changed = false;
  for (nlohmann::json& turn : turns) {
    if (!turn.is_object() || turn.contains("role") || !turn.contains("from")) continue;
    if (!turn["from"].is_string() || !turn.contains("value") || !turn["value"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "each turn of '", column, "' must be {\"from\": str, \"value\": str}"));
    }
    QLORA_ASSIGN_OR_RETURN(const std::string role, RoleOfSpeaker(turn["from"].get<std::string>()));
    nlohmann::json message = {{"role", role}, {"content", turn["value"]}};
    turn = std::move(message);
    changed = true;
  }
  return changed ? turns.dump() : text;
}

namespace {

// Control characters that Python's str.strip() keeps (\x1c-\x1f are whitespace to it).
constexpr char kSentinels[] = "\x01\x02\x03\x04\x05\x06\x07\x08\x0e\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x7f";

size_t Count(const std::string& text, char c) { return static_cast<size_t>(std::count(text.begin(), text.end(), c)); }

// messages with message i's content replaced, and cut after message `keep` (all if npos).
jinja::Value WithContent(const jinja::Value& messages, size_t i, const std::string& content, size_t keep) {
  jinja::List list(messages.list().begin(),
                   messages.list().begin() + std::min(keep, messages.list().size()));
  jinja::Dict message = list[i].dict();
  for (auto& [key, value] : message)
    if (key == "content") value = jinja::Value::String(content);
  list[i] = jinja::Value::MakeDict(std::move(message));
  return jinja::Value::MakeList(std::move(list));
}

// Length of the whitespace code point at text[pos] (ASCII or Unicode, as HF's lstrip/rstrip),
// else 0.
size_t WhitespaceAt(absl::string_view text, size_t pos) {
  const std::string stripped = jinja::PyStrip(text.substr(pos, 4), nullptr, true, false);
  const size_t cut = std::min<size_t>(4, text.size() - pos) - stripped.size();
  if (cut == 0) return 0;
  const unsigned char c = static_cast<unsigned char>(text[pos]);
  const size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : 4;
  return std::min(cut, len);
}

}  // namespace

absl::StatusOr<std::vector<size_t>> TokenEnds(const Tokenizer& tokenizer, absl::string_view text,
                                              const std::vector<int32_t>& ids) {
  std::vector<size_t> ends;
  ends.reserve(ids.size());
  size_t at = 0;
  for (size_t j = 0; j < ids.size(); ++j) {
    std::optional<std::string> piece = tokenizer.TokenText(ids[j]);
    if (!piece) return absl::FailedPreconditionError(absl::StrCat(tokenizer.kind(), " cannot map token ", ids[j], " to text"));
    const std::string& p = *piece;
    size_t probe = at;
    while (true) {
      if (text.compare(probe, p.size(), p) == 0) {
        at = probe + p.size();
        break;
      }
      // ByteLevel add_prefix_space: a leading space that is not in the text.
      if (!p.empty() && p[0] == ' ' && text.compare(probe, p.size() - 1, absl::string_view(p).substr(1)) == 0) {
        at = probe + p.size() - 1;
        break;
      }
      const size_t space = probe < text.size() ? WhitespaceAt(text, probe) : 0;  // lstrip/rstrip
      if (space == 0)
        return absl::InternalError(absl::StrCat("chat example: token #", j, " (id ", ids[j],
                                                ") does not match the rendered text at byte ", at));
      probe += space;
    }
    ends.push_back(at);
  }
  while (at < text.size()) {
    const size_t space = WhitespaceAt(text, at);
    if (space == 0)
      return absl::InternalError(absl::StrCat("chat example: the tokens end at byte ", at, " of ", text.size()));
    at += space;
  }
  if (!ends.empty()) ends.back() = text.size();
  return ends;
}

absl::StatusOr<std::vector<ByteSpan>> AssistantSpans(const ChatTemplate& chat_template,
                                                     const ChatTemplateTokens& tokens,
                                                     const jinja::Value& messages,
                                                     const std::string& rendered) {
  char sentinel = 0;
  for (const char* c = kSentinels; *c != '\0'; ++c)
    if (rendered.find(*c) == std::string::npos) {
      sentinel = *c;
      break;
    }
  if (sentinel == 0)
    return absl::InvalidArgumentError("chat example: the conversation uses every sentinel control character");
  const std::string mark(1, sentinel);
  std::vector<ByteSpan> spans;
  const jinja::List& list = messages.list();
  for (size_t i = 0; i < list.size(); ++i) {
    const jinja::Value* role = list[i].Find("role");
    const jinja::Value* content = list[i].Find("content");
    if (!role->is_string() || role->str() != "assistant" || content == nullptr || !content->is_string()) continue;
    QLORA_ASSIGN_OR_RETURN(jinja::RenderResult marked,
                           chat_template.Render(WithContent(messages, i, mark, std::string::npos), false, tokens));
    const std::string& m = marked.text;
    const size_t count = Count(m, sentinel);
    if (count == 0) continue;  // the template does not print this message
    if (count > 1)
      return absl::InvalidArgumentError(absl::StrCat(
          "chat example: the chat template prints assistant message ", i, "'s content ", count,
          " times; its span is ambiguous"));
    size_t prefix = 0;
    while (prefix < m.size() && prefix < rendered.size() && m[prefix] == rendered[prefix]) ++prefix;
    size_t suffix = 0;
    const size_t max_suffix = std::min(m.size(), rendered.size()) - prefix;
    while (suffix < max_suffix && m[m.size() - 1 - suffix] == rendered[rendered.size() - 1 - suffix]) ++suffix;
    if (m.size() - suffix != prefix + 1 || m[prefix] != sentinel)
      return absl::InvalidArgumentError(absl::StrCat(
          "chat example: the chat template's output changes elsewhere than at assistant message ", i,
          "'s content when that content changes; its span cannot be told"));
    size_t end = rendered.size() - suffix;
    // The end of the turn: what the template prints after the content when the message is last.
    QLORA_ASSIGN_OR_RETURN(jinja::RenderResult turn,
                           chat_template.Render(WithContent(messages, i, mark, i + 1), false, tokens));
    if (Count(turn.text, sentinel) == 1) {
      std::string tail = turn.text.substr(turn.text.find(sentinel) + 1);
      tail = jinja::PyStrip(tail, nullptr, false, true);
      if (!tail.empty() && rendered.compare(end, tail.size(), tail) == 0) end += tail.size();
    }
    spans.emplace_back(prefix, end);
  }
  return spans;
}

absl::StatusOr<jinja::Value> MessagesValue(absl::string_view messages_json) {
  // Ordered: templates may print a message's keys (tojson) in their order.
  const nlohmann::ordered_json parsed = nlohmann::ordered_json::parse(messages_json, nullptr, false);
  if (!parsed.is_array() || parsed.empty())
    return absl::InvalidArgumentError("'messages' must be a non-empty JSON array of {role, content}");
  jinja::List list;
  for (const nlohmann::ordered_json& message : parsed) {
    if (!message.is_object() || !message.contains("role") || !message["role"].is_string())
      return absl::InvalidArgumentError("each message must be an object with a string \"role\"");
    jinja::Dict fields;
    for (const auto& [key, value] : message.items())  // transformers drops None-valued keys
      if (!value.is_null()) fields.emplace_back(key, jinja::Value::FromJson(value));
    list.push_back(jinja::Value::MakeDict(std::move(fields)));
  }
  return jinja::Value::MakeList(std::move(list));
}

absl::Status BuildTemplateChat(const ChatTemplate& chat_template, const ChatTemplateTokens& tokens,
                               const Tokenizer& tokenizer, absl::string_view messages_json,
                               Example* example) {
  QLORA_ASSIGN_OR_RETURN(const jinja::Value messages, MessagesValue(messages_json));
  QLORA_ASSIGN_OR_RETURN(jinja::RenderResult rendered, chat_template.Render(messages, false, tokens));
  std::vector<ByteSpan> spans;
  if (chat_template.has_generation_blocks()) {
    spans = rendered.generation_spans;
  } else {
    QLORA_ASSIGN_OR_RETURN(spans, AssistantSpans(chat_template, tokens, messages, rendered.text));
  }
  QLORA_RETURN_IF_ERROR(tokenizer.EncodeTo(rendered.text, &example->input_ids));
  QLORA_ASSIGN_OR_RETURN(std::vector<size_t> ends, TokenEnds(tokenizer, rendered.text, example->input_ids));
  spans.erase(std::remove_if(spans.begin(), spans.end(), [](const ByteSpan& s) { return s.first >= s.second; }),
              spans.end());
  std::sort(spans.begin(), spans.end());
  size_t span = 0, begin = 0;
  example->labels.resize(example->input_ids.size(), kIgnoreIndex);
  for (size_t j = 0; j < ends.size(); ++j) {
    while (span < spans.size() && spans[span].second <= begin) ++span;
    if (span < spans.size() && spans[span].first < ends[j] && spans[span].second > begin && ends[j] > begin)
      example->labels[j] = example->input_ids[j];
    begin = ends[j];
  }
  return absl::OkStatus();
}

}  // namespace qlora::data
