// ChatTemplate: lex, parse, render (see chat_template.h).
#include "worker/data/chat_template/chat_template.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/data/chat_template/lexer.h"
#include "worker/data/chat_template/parser.h"

namespace qlora::data {
namespace {

bool HasGeneration(const jinja::Body& body) {
  for (const auto& stmt : body) {
    if (stmt->kind == jinja::Stmt::Kind::kGeneration) return true;
    for (const jinja::Body& inner : stmt->bodies)
      if (HasGeneration(inner)) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::Compile(absl::string_view source, jinja::RenderLimits limits) {
  if (source.size() > kMaxChatTemplateBytes)
    return absl::InvalidArgumentError(absl::StrCat("chat_template: ", source.size(),
                                                   " bytes; at most ", kMaxChatTemplateBytes, " are accepted"));
  ChatTemplate compiled;
  auto normalized = std::make_shared<const std::string>(jinja::NormalizeSource(source));
  QLORA_ASSIGN_OR_RETURN(std::vector<jinja::Token> tokens, jinja::Lex(*normalized));
  QLORA_ASSIGN_OR_RETURN(jinja::Body body, jinja::Parse(tokens, *normalized));
  compiled.has_generation_ = HasGeneration(body);
  compiled.source_ = std::move(normalized);
  compiled.body_ = std::make_shared<const jinja::Body>(std::move(body));
  compiled.limits_ = limits;
  return compiled;
}

absl::StatusOr<jinja::RenderResult> ChatTemplate::Render(const jinja::Value& messages,
                                                         bool add_generation_prompt,
                                                         const ChatTemplateTokens& tokens) const {
  jinja::Dict variables = {{"messages", messages},
                           {"tools", jinja::Value::None()},
                           {"documents", jinja::Value::None()},
                           {"add_generation_prompt", jinja::Value::Bool(add_generation_prompt)}};
  if (tokens.bos_token) variables.emplace_back("bos_token", jinja::Value::String(*tokens.bos_token));
  if (tokens.eos_token) variables.emplace_back("eos_token", jinja::Value::String(*tokens.eos_token));
  if (tokens.pad_token) variables.emplace_back("pad_token", jinja::Value::String(*tokens.pad_token));
  return jinja::Evaluate(*body_, *source_, variables, limits_);
}

}  // namespace qlora::data
