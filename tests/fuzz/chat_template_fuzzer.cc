// Fuzz target: chat templates, which come from user-supplied model folders. The input is a
// template's source: compiled, and when it compiles rendered with a fixed five-message
// conversation (system, user, assistant, user, assistant) with and without the generation
// prompt, under tight limits (1 MiB output, 200,000 steps) so that every input ends quickly.
// Any status is fine; a crash, sanitizer report, leak or hang is not.
#include <cstddef>
#include <cstdint>
#include <string>

#include "nlohmann/json.hpp"
#include "worker/data/chat_template/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const qlora::data::jinja::Value* messages = [] {
    const auto json = nlohmann::ordered_json::parse(R"([
      {"role": "system", "content": "You are terse."},
      {"role": "user", "content": "Hello {{ there }} <|eot_id|>"},
      {"role": "assistant", "content": " Hi! "},
      {"role": "user", "content": "日本語 🙂"},
      {"role": "assistant", "content": "ok"}])");
    return new qlora::data::jinja::Value(qlora::data::jinja::Value::FromJson(json));
  }();
  qlora::data::jinja::RenderLimits limits;
  limits.max_output_bytes = 1u << 20;
  limits.max_steps = 200'000;
  const std::string source(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<qlora::data::ChatTemplate> compiled = qlora::data::ChatTemplate::Compile(source, limits);
  if (!compiled.ok()) return 0;
  qlora::data::ChatTemplateTokens tokens;
  tokens.bos_token = "<s>";
  tokens.eos_token = "</s>";
  for (bool generation_prompt : {false, true}) {
    (void)compiled->Render(*messages, generation_prompt, tokens);
  }
  return 0;
}
