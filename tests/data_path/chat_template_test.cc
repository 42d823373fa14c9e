// The chat-template interpreter on its own (no reference Python): errors name the template
// position, constructs outside the subset are UNIMPLEMENTED, hostile templates hit the limits;
// and the example builder's choice between the tokenizer's template and the built-in LLaMA-3
// layout (the fallback).
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/data_path/test_util.h"
#include "worker/data/chat_example.h"
#include "worker/data/chat_template/chat_template.h"
#include "worker/data/example_builder.h"
#include "worker/data/tokenizer.h"

namespace qlora::data {
namespace {

const char kTwoTurns[] =
    R"([{"role":"user","content":"Hi"},{"role":"assistant","content":" Yo "}])";

jinja::Value Messages(const std::string& json) {
  return jinja::Value::FromJson(nlohmann::ordered_json::parse(json));
}

absl::StatusOr<std::string> Render(const std::string& source, const std::string& messages = kTwoTurns,
                                   jinja::RenderLimits limits = {}) {
  auto compiled = ChatTemplate::Compile(source, limits);
  if (!compiled.ok()) return compiled.status();
  auto rendered = compiled->Render(Messages(messages), false, {std::string("<s>"), std::string("</s>"), {}});
  if (!rendered.ok()) return rendered.status();
  return rendered->text;
}

void ExpectError(const absl::StatusOr<std::string>& result, absl::StatusCode code,
                 const std::string& fragment) {
  ASSERT_FALSE(result.ok()) << *result;
  EXPECT_EQ(result.status().code(), code) << result.status();
  EXPECT_NE(std::string(result.status().message()).find(fragment), std::string::npos)
      << result.status() << " lacks " << fragment;
}

TEST(DataChatTemplateTest, RendersTheSubset) {
  auto out = Render(
      "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[U]{{ m['content'] }}"
      "{% elif loop.last %}[A{{ loop.index }}]{{ m.content|trim }}{{ eos_token }}{% endif %}{% endfor %}"
      "{{ messages|length }}{{ messages[1:]|length }}{{ pad_token is defined }}{{ tools is none }}");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "<s>[U]Hi[A2]Yo</s>21FalseTrue");
}

TEST(DataChatTemplateTest, SyntaxErrorsNameTheirPosition) {
  ExpectError(Render("ok\n{% for m in messages %}x"), absl::StatusCode::kInvalidArgument, "endfor");
  ExpectError(Render("line one\n  {{ 1 + }}"), absl::StatusCode::kInvalidArgument, "line 2, column 10");
  ExpectError(Render("{{ 'abc }}"), absl::StatusCode::kInvalidArgument, "unterminated string literal at line 1");
  ExpectError(Render("{% endfor %}"), absl::StatusCode::kInvalidArgument, "unknown statement 'endfor' at line 1, column 4");
  ExpectError(Render("{{ x "), absl::StatusCode::kInvalidArgument, "unterminated tag");
  ExpectError(Render("{# no end"), absl::StatusCode::kInvalidArgument, "unterminated comment");
  ExpectError(Render("{{ a ) }}"), absl::StatusCode::kInvalidArgument, "unbalanced ')'");
  ExpectError(Render("{{ a ; }}"), absl::StatusCode::kInvalidArgument, "unexpected character ';'");
}

TEST(DataChatTemplateTest, UnsupportedConstructsAreUnimplemented) {
  ExpectError(Render("x\n{% macro m() %}{% endmacro %}"), absl::StatusCode::kUnimplemented,
              "{% macro %} is not supported (at line 2, column 4)");
  ExpectError(Render("{% set x %}y{% endset %}"), absl::StatusCode::kUnimplemented, "block {% set %}");
  ExpectError(Render("{% for m in messages recursive %}{% endfor %}"), absl::StatusCode::kUnimplemented,
              "recursive loop");
  ExpectError(Render("{% include 'x' %}"), absl::StatusCode::kUnimplemented, "{% include %}");
  ExpectError(Render("{{ 1 < 2 < 3 }}"), absl::StatusCode::kUnimplemented, "chained comparison");
  // Unknown filters, tests and methods are found when they run.
  ExpectError(Render("{{ 'a'|wordwrap }}"), absl::StatusCode::kUnimplemented, "filter 'wordwrap' is not supported (at line 1");
  ExpectError(Render("{{ 1 is prime }}"), absl::StatusCode::kUnimplemented, "test 'prime'");
  ExpectError(Render("{{ 'a'.format(1) }}"), absl::StatusCode::kUnimplemented, "method 'format' of a string");
  ExpectError(Render("{{ messages(1) }}"), absl::StatusCode::kInvalidArgument, "a list is not callable");
}

TEST(DataChatTemplateTest, TypeErrorsAndUndefinedUse) {
  ExpectError(Render("{{ 'a' + 1 }}"), absl::StatusCode::kInvalidArgument,
              "unsupported operand types for +: string and int at line 1, column 8");
  ExpectError(Render("{{ nothing + 'a' }}"), absl::StatusCode::kInvalidArgument, "an undefined value in '+'");
  ExpectError(Render("{{ nothing.attr }}"), absl::StatusCode::kInvalidArgument, "attribute 'attr' of an undefined value");
  ExpectError(Render("{{ 1 // 0 }}"), absl::StatusCode::kInvalidArgument, "division by zero");
  ExpectError(Render("{{ 9223372036854775807 + 1 }}"), absl::StatusCode::kInvalidArgument, "integer overflow");
  ExpectError(Render("{% set x = 1 %}{% set x.a = 2 %}"), absl::StatusCode::kInvalidArgument, "not a namespace()");
}

TEST(DataChatTemplateTest, RaiseExceptionIsFailedPreconditionWithTheMessage) {
  ExpectError(Render("\n  {{ raise_exception('roles must alternate') }}"), absl::StatusCode::kFailedPrecondition,
              "chat_template raised an exception at line 2, column 21: roles must alternate");
}

TEST(DataChatTemplateTest, HostileTemplatesHitTheLimits) {
  jinja::RenderLimits small;
  small.max_output_bytes = 1 << 16;
  small.max_steps = 100000;
  ExpectError(Render("{% for i in range(1000000000) %}{% endfor %}", kTwoTurns, small),
              absl::StatusCode::kResourceExhausted, "range of");
  ExpectError(Render("{% for i in range(300) %}{% for j in range(300) %}{% endfor %}{% endfor %}", kTwoTurns, small),
              absl::StatusCode::kResourceExhausted, "evaluation steps");
  ExpectError(Render("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
                     kTwoTurns, small),
              absl::StatusCode::kResourceExhausted, "grew past 65536 bytes");
  ExpectError(Render("{% for i in range(5000) %}{{ 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx' }}{% endfor %}", kTwoTurns, small),
              absl::StatusCode::kResourceExhausted, "output or a value grew past");
  ExpectError(Render("{{ 'x' * 100000000 }}", kTwoTurns, small), absl::StatusCode::kResourceExhausted, "grew past");
  ExpectError(Render("{{ 2 ** 9999999999 }}"), absl::StatusCode::kInvalidArgument, "integer overflow");
  EXPECT_TRUE(Render("{{ 1 ** 9999999999999 }}{{ (-1) ** 9999999999999 }}").ok());
  // Deep nesting is refused by the parser before anything recurses far.
  ExpectError(Render("{{ " + std::string(500, '(') + "1" + std::string(500, ')') + " }}"),
              absl::StatusCode::kInvalidArgument, "nesting deeper than 64 levels");
  ExpectError(Render("{{ " + std::string(500, '-') + "1 }}"), absl::StatusCode::kInvalidArgument, "nesting deeper");
  std::string nested_ifs;
  for (int i = 0; i < 200; ++i) nested_ifs += "{% if true %}";
  ExpectError(Render(nested_ifs), absl::StatusCode::kInvalidArgument, "nesting deeper");
  ExpectError(Render(std::string(kMaxChatTemplateBytes + 1, 'x')), absl::StatusCode::kInvalidArgument, "at most");
}

// Example building with a tokenizer whose ids are bytes (plus LLaMA-3's chat tokens).
class DataChatExampleTest : public ::testing::Test {
 protected:
  std::unique_ptr<Tokenizer> Load(const std::string& chat_template) {
    WriteByteTokenizer(dir_.path());
    if (!chat_template.empty()) {
      nlohmann::json config = {{"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|end_of_text|>"},
                               {"chat_template", chat_template}};
      WriteFile(dir_.path() + "/tokenizer_config.json", config.dump());
    }
    auto tokenizer = LoadTokenizer(dir_.path());
    EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
    return std::move(*tokenizer);
  }
  absl::StatusOr<Example> Build(const Tokenizer* tokenizer, const std::string& prompt_template,
                                const std::string& messages) {
    auto options = ExampleBuilder::OptionsFor(DataFormat::kJsonl, {"messages"}, {}, prompt_template, 512);
    if (!options.ok()) return options.status();
    auto builder = ExampleBuilder::Create(*options, tokenizer);
    if (!builder.ok()) return builder.status();
    Record record;
    record.fields = {{"messages", messages}};
    Example example;
    auto built = builder->Build(record, &example);
    if (!built.ok()) return built.status();
    return example;
  }
  static std::string Labeled(const Example& example) {
    std::string out;
    for (int32_t label : example.labels)
      if (label != kIgnoreIndex) out += label < 256 ? std::string(1, static_cast<char>(label)) : "<" + std::to_string(label) + ">";
    return out;
  }

  TempDir dir_;
};

// A ChatML-like template over the byte tokenizer's tokens: ids are the bytes of the rendering.
constexpr char kTemplate[] =
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}: {{ m.content|trim }}"
    "<|eot_id|>\n{% endfor %}";

TEST_F(DataChatExampleTest, TokenizerTemplateIsRenderedAndMasked) {
  auto tokenizer = Load(kTemplate);
  ASSERT_EQ(tokenizer->chat_config().chat_template, kTemplate);
  auto example = Build(tokenizer.get(), "", kTwoTurns);
  ASSERT_TRUE(example.ok()) << example.status();
  std::vector<int32_t> want = {kByteBos, kByteStartHeader};
  for (char c : std::string("user: Hi")) want.push_back(c);
  want.insert(want.end(), {kByteEot, '\n', kByteStartHeader});
  for (char c : std::string("assistant: Yo")) want.push_back(c);
  want.insert(want.end(), {kByteEot, '\n'});
  EXPECT_EQ(example->input_ids, want);  // BOS comes from the template, once
  EXPECT_EQ(Labeled(*example), "Yo<" + std::to_string(kByteEot) + ">");  // not the "\n" after it
}

TEST_F(DataChatExampleTest, GenerationBlocksAreTheMaskWhenPresent) {
  auto tokenizer = Load(
      "{% for m in messages %}{{ m.role }}:{% if m.role == 'assistant' %}{% generation %}"
      "{{ m.content }}!{% endgeneration %}{% else %}{{ m.content }}{% endif %}|{% endfor %}");
  auto example = Build(tokenizer.get(), "", kTwoTurns);
  ASSERT_TRUE(example.ok()) << example.status();
  EXPECT_EQ(Labeled(*example), " Yo !");
}

TEST_F(DataChatExampleTest, Llama3ChatForcesTheBuiltInLayoutAndNoTemplateFallsBack) {
  auto with_template = Load(kTemplate);
  auto forced = Build(with_template.get(), "llama3_chat", kTwoTurns);
  ASSERT_TRUE(forced.ok()) << forced.status();
  auto plain_dir = std::make_unique<TempDir>();
  WriteByteTokenizer(plain_dir->path());
  auto plain = LoadTokenizer(plain_dir->path());
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE((*plain)->chat_config().chat_template.empty());
  auto fallback = Build(plain->get(), "", kTwoTurns);
  ASSERT_TRUE(fallback.ok()) << fallback.status();
  EXPECT_EQ(forced->input_ids, fallback->input_ids);
  EXPECT_EQ(forced->labels, fallback->labels);
  EXPECT_EQ(fallback->input_ids[1], kByteStartHeader);  // the LLaMA-3 layout: BOS, header, ...
  EXPECT_EQ(Labeled(*fallback), "Yo<" + std::to_string(kByteEot) + ">");
}

TEST_F(DataChatExampleTest, ChatTemplateJinjaFileWinsOverTheConfig) {
  WriteByteTokenizer(dir_.path());
  WriteFile(dir_.path() + "/chat_template.jinja", "{% for m in messages %}[{{ m.content }}]{% endfor %}\n");
  auto tokenizer = LoadTokenizer(dir_.path());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  auto example = Build(tokenizer->get(), "", kTwoTurns);
  ASSERT_TRUE(example.ok()) << example.status();
  std::vector<int32_t> want;
  for (char c : std::string("[Hi][ Yo ]")) want.push_back(c);  // the trailing newline dropped
  EXPECT_EQ(example->input_ids, want);
  EXPECT_EQ(Labeled(*example), " Yo ]");  // what the template prints after an assistant content
}

TEST_F(DataChatExampleTest, BadTemplatesAndRecordsAreClearErrors) {
  auto broken = Load("{% for m in messages %}");
  auto options = ExampleBuilder::OptionsFor(DataFormat::kJsonl, {"messages"}, {}, "", 512);
  auto builder = ExampleBuilder::Create(*options, broken.get());
  ASSERT_FALSE(builder.ok());
  EXPECT_NE(std::string(builder.status().message()).find("tokenizer_config.json: chat_template: missing {% endfor %}"),
            std::string::npos) << builder.status();

  auto twice = Load("{% for m in messages %}{{ m.content }}{{ m.content }}{% endfor %}");
  auto built = Build(twice.get(), "", kTwoTurns);
  ASSERT_FALSE(built.ok());
  EXPECT_NE(std::string(built.status().message()).find("2 times"), std::string::npos) << built.status();

  auto good = Load(kTemplate);
  EXPECT_FALSE(Build(good.get(), "", R"([{"content":"no role"}])").ok());
  EXPECT_FALSE(Build(good.get(), "", R"({"role":"user"})").ok());
  // An assistant turn the template does not print gets no labels: the example is dropped.
  auto users_only = Load("{% for m in messages if m.role == 'user' %}{{ m.content }}{% endfor %}");
  auto dropped_options = ExampleBuilder::OptionsFor(DataFormat::kJsonl, {"messages"}, {}, "", 512);
  auto dropping = ExampleBuilder::Create(*dropped_options, users_only.get());
  ASSERT_TRUE(dropping.ok());
  Record record;
  record.fields = {{"messages", kTwoTurns}};
  Example example;
  auto kept = dropping->Build(record, &example);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_FALSE(*kept);
  EXPECT_EQ(dropping->stats().dropped_no_target, 1);
}

TEST_F(DataChatExampleTest, SentencePieceTokenizersAreRefusedForTemplates) {
  const std::string fixture = std::string(std::getenv("QLORA_SOURCE_DIR")) + "/tests/assets/spm_bpe";
  WriteFile(dir_.path() + "/tokenizer.model", ReadFile(fixture + "/tokenizer.model"));
  nlohmann::json config = {{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"chat_template", kTemplate}};
  WriteFile(dir_.path() + "/tokenizer_config.json", config.dump());
  auto tokenizer = LoadTokenizer(dir_.path());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  auto options = ExampleBuilder::OptionsFor(DataFormat::kJsonl, {"messages"}, {}, "", 512);
  auto builder = ExampleBuilder::Create(*options, tokenizer->get());
  ASSERT_FALSE(builder.ok());
  EXPECT_EQ(builder.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(builder.status().message()).find("llama3_chat"), std::string::npos);
}

TEST(DataChatTokenEndsTest, AlignsAddedTokensAndPrefixSpaces) {
  TempDir dir;
  WriteByteTokenizer(dir.path());
  auto tokenizer = LoadTokenizer(dir.path());
  ASSERT_TRUE(tokenizer.ok());
  const std::string text = "ab<|eot_id|>c";
  auto ids = (*tokenizer)->Encode(text);
  ASSERT_TRUE(ids.ok());
  auto ends = TokenEnds(**tokenizer, text, *ids);
  ASSERT_TRUE(ends.ok()) << ends.status();
  EXPECT_EQ(*ends, (std::vector<size_t>{1, 2, 12, 13}));
  EXPECT_FALSE(TokenEnds(**tokenizer, "xyz", *ids).ok());  // ids of another text
}

}  // namespace
}  // namespace qlora::data
