// A compiled chat template (the `chat_template` of a model folder's tokenizer_config.json) and
// its rendering with the variables transformers' apply_chat_template passes: messages, tools
// and documents (none), add_generation_prompt, and the special-token strings that are set
// (bos_token, eos_token, pad_token; undefined otherwise).
//
// The supported Jinja subset is listed in lexer.h, parser.cc and builtins.h (worker/data/
// README.md, section Chat, sums it up). Errors name the template's line and column:
// INVALID_ARGUMENT for syntax and type errors, UNIMPLEMENTED for constructs outside the subset,
// FAILED_PRECONDITION for the template's own raise_exception(), RESOURCE_EXHAUSTED past
// RenderLimits. Torch-free.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/data/chat_template/ast.h"
#include "worker/data/chat_template/evaluator.h"
#include "worker/data/chat_template/limits.h"
#include "worker/data/chat_template/value.h"

namespace qlora::data {

// Templates larger than this are refused before lexing.
constexpr size_t kMaxChatTemplateBytes = 1u << 20;

struct ChatTemplateTokens {
  std::optional<std::string> bos_token, eos_token, pad_token;
};

class ChatTemplate {
 public:
  static absl::StatusOr<ChatTemplate> Compile(absl::string_view source,
                                              jinja::RenderLimits limits = {});

  // `messages` is a list of dicts (role, content, ...).
  absl::StatusOr<jinja::RenderResult> Render(const jinja::Value& messages, bool add_generation_prompt,
                                             const ChatTemplateTokens& tokens) const;

  // Whether the template marks assistant output with {% generation %} blocks.
  bool has_generation_blocks() const { return has_generation_; }

 private:
  ChatTemplate() = default;

  std::shared_ptr<const std::string> source_;  // normalized (positions in errors refer to it)
  std::shared_ptr<const jinja::Body> body_;
  jinja::RenderLimits limits_;
  bool has_generation_ = false;
};

}  // namespace qlora::data
