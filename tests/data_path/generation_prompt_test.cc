// GenerationPrompts: a prompt laid out as the job lays out its records, ending where the trained
// target begins: the template (plain text or a JSON object's columns), LLaMA-3's chat layout with
// the assistant's header opened, a record's own prompt; and prompts the layout cannot take.
#include "worker/data/generation_prompt.h"

#include <memory>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/data_path/test_util.h"

namespace qlora::data {
namespace {

using ::testing::HasSubstr;

class GenerationPromptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteByteTokenizer(dir_.path());
    tokenizer_ = std::move(*LoadTokenizer(dir_.path()));
    job_.data.train_path = dir_.path() + "/train.jsonl";
    WriteFile(job_.data.train_path, "{\"instruction\": \"hi\", \"output\": \"yo\"}\n");
  }
  std::string Text(const std::vector<int32_t>& ids) { return *tokenizer_->Decode(ids); }
  TempDir dir_;
  std::unique_ptr<Tokenizer> tokenizer_;
  JobConfig job_;
};

TEST_F(GenerationPromptTest, TheTemplateEndsWhereTheTargetBegins) {
  job_.input_features = {{"instruction", "text"}, {"input", "text"}};
  job_.output_features = {{"output", "text"}};
  job_.data.prompt_template = "Q: {instruction} ({input})\nA: ";
  auto prompts = GenerationPrompts::ForJob(job_, tokenizer_.get(), 512);
  ASSERT_TRUE(prompts.ok()) << prompts.status();
  auto ids = prompts->Ids("{\"instruction\": \"Count\", \"input\": \"to 3\"}");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(Text(*ids), "<|begin_of_text|>Q: Count (to 3)\nA: ");
  // Plain text cannot fill two columns; a missing column is named.
  EXPECT_THAT(prompts->Ids("Count").status().message(), HasSubstr("JSON object"));
  EXPECT_THAT(prompts->Ids("{\"instruction\": \"Count\"}").status().message(), HasSubstr("input"));
  // A record's own prompt: everything before its target.
  Record record;
  record.fields = {{"instruction", "hi"}, {"input", "x"}, {"output", "yo"}};
  auto from_record = prompts->IdsOfRecord(record);
  ASSERT_TRUE(from_record.ok());
  EXPECT_EQ(Text(*from_record), "<|begin_of_text|>Q: hi (x)\nA: ");
  auto first = GenerationPrompts::FirstRecords(job_, *tokenizer_, 5);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->size(), 1u);
}

TEST_F(GenerationPromptTest, AChatPromptOpensTheAssistantsTurn) {
  job_.input_features = {{"messages", "text"}};
  job_.output_features = {};
  auto prompts = GenerationPrompts::ForJob(job_, tokenizer_.get(), 512);
  ASSERT_TRUE(prompts.ok()) << prompts.status();
  auto ids = prompts->Ids("Hello");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(Text(*ids),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  auto conversation = prompts->Ids(
      "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi\"}]}");
  ASSERT_TRUE(conversation.ok()) << conversation.status();
  EXPECT_THAT(Text(*conversation), HasSubstr("system<|end_header_id|>\n\nBe brief.<|eot_id|>"));
  EXPECT_EQ(prompts->Ids("{\"messages\": []}").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace qlora::data
