// The tokenizer's chat template against the reference: make_chat_references.py builds a
// byte-level BPE tokenizer per template family (LLaMA-3, LLaMA-2, Mistral v0.1 and v0.3,
// Qwen2 and Qwen2.5; templates in tests/assets/chat_templates.json) and writes what
// transformers' apply_chat_template renders and tokenizes, and an assistant mask computed
// independently in Python. Our rendering (with and without the generation prompt), ids,
// labels and the templates' own raise_exception must agree. Small templates check the
// interpreter's details against jinja2 itself.
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/data_path/test_util.h"
#include "worker/data/chat_template/builtins.h"
#include "worker/data/chat_template/chat_template.h"
#include "worker/data/chat_template/evaluator.h"
#include "worker/data/chat_template/lexer.h"
#include "worker/data/chat_template/parser.h"
#include "worker/data/example_builder.h"
#include "worker/data/tokenizer.h"

namespace qlora::data {
namespace {

class DataChatReferenceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string source = std::getenv("QLORA_SOURCE_DIR");
    reference_ = new ReferenceRun<nlohmann::ordered_json>(
        absl::StrCat(source, "/tests/data_path/make_chat_references.py ", source,
                     "/tests/assets/chat_templates.json"));
  }
  static void TearDownTestSuite() {
    delete reference_;
    reference_ = nullptr;
  }
  void SetUp() override {
    if (reference_->python.empty()) GTEST_SKIP() << "QLORA_PYTHON is not set: no reference";
    ASSERT_NE(reference_->expected, nullptr) << reference_->command;
    dir_ = &reference_->dir;
    expected_ = reference_->expected.get();
  }

  static ReferenceRun<nlohmann::ordered_json>* reference_;
  const TempDir* dir_ = nullptr;
  nlohmann::ordered_json* expected_ = nullptr;
};
ReferenceRun<nlohmann::ordered_json>* DataChatReferenceTest::reference_ = nullptr;

jinja::Value Messages(const std::string& json) {
  return jinja::Value::FromJson(nlohmann::ordered_json::parse(json));
}

// Conversational preference pairs: the ids and completion labels of both sides are those TRL's
// DPOTrainer tokenizes (explicit prompts, and the implicit prompt both sides share).
TEST_F(DataChatReferenceTest, PreferencePairsEqualTrl) {
  const auto& families = (*expected_)["preference"];
  ASSERT_EQ(families.size(), 6u);
  int compared = 0;
  for (const auto& [family, cases] : families.items()) {
    SCOPED_TRACE(family);
    auto tokenizer = LoadTokenizer(dir_->path() + "/" + family);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    auto options = PreferenceLayout(DataFormat::kJsonl, {"prompt"}, {"chosen", "rejected"}, 4096);
    ASSERT_TRUE(options.ok()) << options.status();
    auto builder = ExampleBuilder::Create(*options, tokenizer->get());
    ASSERT_TRUE(builder.ok()) << builder.status();
    for (const auto& want : cases) {
      Record record;
      for (const auto& [key, value] : want["record"].items()) record.fields.emplace_back(key, value.get<std::string>());
      SCOPED_TRACE(want["record"].dump());
      Example example;
      auto kept = builder->Build(record, &example);
      ASSERT_TRUE(kept.ok()) << kept.status();
      ASSERT_TRUE(*kept);
      const size_t prompt_len = want["prompt_len"].get<size_t>();
      EXPECT_EQ(example.input_ids, want["chosen"].get<std::vector<int32_t>>());
      EXPECT_EQ(example.rejected_input_ids, want["rejected"].get<std::vector<int32_t>>());
      for (const auto* side : {&example.labels, &example.rejected_labels}) {
        const std::vector<int32_t>& ids = side == &example.labels ? example.input_ids : example.rejected_input_ids;
        for (size_t i = 0; i < side->size(); ++i) EXPECT_EQ((*side)[i], i < prompt_len ? kIgnoreIndex : ids[i]) << i;
      }
      ++compared;
    }
  }
  EXPECT_GE(compared, 12);
}

TEST_F(DataChatReferenceTest, FamiliesEqualApplyChatTemplate) {
  const auto& families = (*expected_)["families"];
  ASSERT_EQ(families.size(), 6u);
  int compared = 0, raised = 0;
  for (const auto& [family, cases] : families.items()) {
    SCOPED_TRACE(family);
    auto tokenizer = LoadTokenizer(dir_->path() + "/" + family);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    const ChatConfig& chat = (*tokenizer)->chat_config();
    ASSERT_FALSE(chat.chat_template.empty());
    auto compiled = ChatTemplate::Compile(chat.chat_template);
    ASSERT_TRUE(compiled.ok()) << compiled.status();
    const ChatTemplateTokens tokens{chat.bos_token, chat.eos_token, chat.pad_token};
    auto options = ExampleBuilder::OptionsFor(DataFormat::kJsonl, {"messages"}, {}, "", 4096);
    ASSERT_TRUE(options.ok());
    auto builder = ExampleBuilder::Create(*options, tokenizer->get());
    ASSERT_TRUE(builder.ok()) << builder.status();
    for (size_t c = 0; c < cases.size(); ++c) {
      SCOPED_TRACE(absl::StrCat("conversation #", c));
      const auto& want = cases[c];
      const std::string messages = want["messages"].get<std::string>();
      Record record;
      record.fields = {{"messages", messages}};
      Example example;
      auto built = builder->Build(record, &example);
      if (want.contains("error")) {  // the template's own raise_exception
        ++raised;
        auto rendered = compiled->Render(Messages(messages), false, tokens);
        ASSERT_FALSE(rendered.ok());
        EXPECT_EQ(rendered.status().code(), absl::StatusCode::kFailedPrecondition);
        EXPECT_NE(std::string(rendered.status().message()).find(want["error"].get<std::string>()),
                  std::string::npos)
            << rendered.status();
        EXPECT_FALSE(built.ok());
        continue;
      }
      ++compared;
      auto text = compiled->Render(Messages(messages), false, tokens);
      ASSERT_TRUE(text.ok()) << text.status();
      EXPECT_EQ(text->text, want["text"].get<std::string>());
      auto with_prompt = compiled->Render(Messages(messages), true, tokens);
      ASSERT_TRUE(with_prompt.ok()) << with_prompt.status();
      EXPECT_EQ(with_prompt->text, want["text_generation"].get<std::string>());

      ASSERT_TRUE(built.ok()) << built.status();
      ASSERT_TRUE(*built);
      const auto ids = want["ids"].get<std::vector<int32_t>>();
      EXPECT_EQ(example.input_ids, ids);
      const auto mask = want["mask"].get<std::vector<int>>();
      ASSERT_EQ(example.labels.size(), mask.size());
      std::vector<int32_t> labeled;
      for (size_t j = 0; j < mask.size(); ++j) {
        EXPECT_EQ(example.labels[j] != kIgnoreIndex, mask[j] == 1) << "token " << j;
        if (example.labels[j] != kIgnoreIndex) {
          EXPECT_EQ(example.labels[j], example.input_ids[j]);
          labeled.push_back(example.labels[j]);
        }
      }
      // The labeled tokens spell the assistant turns and their end-of-turn tokens.
      auto decoded = (*tokenizer)->Decode(labeled);
      ASSERT_TRUE(decoded.ok());
      for (const auto& message : nlohmann::json::parse(messages))
        if (message["role"] == "assistant") {
          const std::string core = jinja::PyStrip(message["content"].get<std::string>(), nullptr, true, true);
          EXPECT_NE(decoded->find(core), std::string::npos) << *decoded;
        }
      EXPECT_NE(decoded->find(*chat.eos_token), std::string::npos) << *decoded;
    }
  }
  EXPECT_EQ(compared, 6 * 7 - 3);
  EXPECT_EQ(raised, 3);  // LLaMA-2, Mistral v0.1, Mistral v0.3 refuse non-alternating roles
}

TEST_F(DataChatReferenceTest, InterpreterDetailsEqualJinja2) {
  const auto& cases = (*expected_)["micro"];
  ASSERT_GT(cases.size(), 20u);
  for (const auto& want : cases) {
    const std::string source = jinja::NormalizeSource(want["template"].get<std::string>());
    SCOPED_TRACE(source);
    auto tokens = jinja::Lex(source);
    ASSERT_TRUE(tokens.ok()) << tokens.status();
    auto body = jinja::Parse(*tokens, source);
    ASSERT_TRUE(body.ok()) << body.status();
    jinja::Dict variables;
    for (const auto& [name, value] : want["variables"].items())
      variables.emplace_back(name, jinja::Value::FromJson(value));
    auto rendered = jinja::Evaluate(*body, source, variables, jinja::RenderLimits());
    if (want.contains("error")) {
      ASSERT_FALSE(rendered.ok()) << rendered->text;
      const std::string error = want["error"].get<std::string>();
      if (error.rfind("TemplateError: ", 0) == 0)  // raise_exception's message is kept
        EXPECT_NE(std::string(rendered.status().message()).find(error.substr(15)), std::string::npos)
            << rendered.status();
      continue;
    }
    ASSERT_TRUE(rendered.ok()) << rendered.status();
    EXPECT_EQ(rendered->text, want["output"].get<std::string>());
  }
}

}  // namespace
}  // namespace qlora::data
