// Chat examples from the tokenizer's own chat template: render the conversation, tokenize the
// rendering once (ids equal transformers' apply_chat_template(messages, tokenize=True)), and
// put labels on the tokens that overlap an assistant span.
//
// Assistant spans (byte ranges of the rendering):
//  - a template with {% generation %} blocks: those blocks, as transformers'
//    return_assistant_tokens_mask;
//  - otherwise, per assistant message i with string content: render again with that content
//    replaced by a one-character sentinel absent from the rendering; the common prefix and
//    suffix of the two renderings bound the content as the template printed it (trimmed or
//    not). Then render messages[0..i] with the sentinel: what follows it is the turn's end
//    ("<|eot_id|>", " </s>", "<|im_end|>\n"); its whitespace-trimmed text is added to the span
//    when the full rendering continues with it. This needs no prefix property of the template
//    (Mistral v0.3 moves the system prompt into the last user turn). A template that prints a
//    content twice, or whose rendering differs elsewhere when the content changes, is an error;
//    an assistant message the template does not print gets no labels.
// Tokens are aligned with the rendering through Tokenizer::TokenText (SentencePiece cannot
// say, so it is refused); a token that overlaps a span gets its id as label (transformers marks
// tokens the same way).
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/data/chat_template/chat_template.h"
#include "worker/data/example_builder.h"
#include "worker/data/tokenizer.h"

namespace qlora::data {

using ByteSpan = std::pair<size_t, size_t>;  // [begin, end)

// The conversation in `column`'s `text` as a JSON array of {role, content}: ShareGPT's
// {from, value} turns mapped to roles (human/user -> user, gpt/assistant/model/... -> assistant,
// system, tool), {role, content} turns as they are. INVALID_ARGUMENT when it is not an array.
absl::StatusOr<std::string> ChatMessages(absl::string_view column, const std::string& text);

// A non-empty JSON array of {role, ...} objects as the template's `messages` (keys in their
// order, null-valued keys dropped as transformers drops None).
absl::StatusOr<jinja::Value> MessagesValue(absl::string_view messages_json);

// `messages_json` is a JSON array of {role, content, ...} objects; the example is input_ids and
// labels of the whole conversation (the template writes BOS if the model wants it).
absl::Status BuildTemplateChat(const ChatTemplate& chat_template, const ChatTemplateTokens& tokens,
                               const Tokenizer& tokenizer, absl::string_view messages_json,
                               Example* example);

// The assistant spans of `rendered` (= the rendering of `messages` without generation prompt).
absl::StatusOr<std::vector<ByteSpan>> AssistantSpans(const ChatTemplate& chat_template,
                                                     const ChatTemplateTokens& tokens,
                                                     const jinja::Value& messages,
                                                     const std::string& rendered);

// The end offset in `text` of each of `ids` (= Encode(text)); token j covers
// [ends[j-1], ends[j]). Whitespace that an added token's lstrip/rstrip swallowed belongs to the
// neighbouring token.
absl::StatusOr<std::vector<size_t>> TokenEnds(const Tokenizer& tokenizer, absl::string_view text,
                                              const std::vector<int32_t>& ids);

}  // namespace qlora::data
