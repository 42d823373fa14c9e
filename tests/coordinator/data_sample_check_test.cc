// CheckDataSample: the first training records, read at submit as the workers will read them; a
// job that would fail once its workers start is refused naming the file, the line and the column.
#include "coordinator/admission/data_sample_check.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/test_util.h"

namespace qlora::coordinator {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;
using testing::WriteFile;

class CoordinatorDataSampleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_.data.train_path = dir_.path() + "/train.jsonl";
    WriteFile(config_.data.train_path,
              "{\"instruction\": \"hi\", \"output\": \"yo\"}\n{\"instruction\": \"ok\", \"output\": \"k\"}\n");
    config_.input_features = {{"instruction", "text"}};
    config_.output_features = {{"output", "text"}};
  }
  TempDir dir_;
  JobConfig config_;
};

TEST_F(CoordinatorDataSampleTest, RecordsWithTheJobsColumnsPass) {
  EXPECT_TRUE(CheckDataSample(config_).ok());
  config_.data.prompt_template = "Q: {instruction}\nA: ";
  EXPECT_TRUE(CheckDataSample(config_).ok());
}

TEST_F(CoordinatorDataSampleTest, ARecordAsLongAsTheRowsAskIsRead) {
  // 1.5 MB of text, about 380,000 tokens: over the 1 MiB bound of short rows, within that of
  // rows of 400,000 tokens (16 bytes a token), whose records are that long.
  std::string words;
  while (words.size() < 1500000) words += "seven digits ";
  WriteFile(config_.data.train_path,
            "{\"instruction\": \"" + words + "\", \"output\": \"yo\"}\n");
  config_.data.max_sequence_length = 2048;
  absl::Status bad = CheckDataSample(config_);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("longer than max_record_bytes (1048576)"));
  config_.data.max_sequence_length = 400000;
  EXPECT_TRUE(CheckDataSample(config_).ok()) << CheckDataSample(config_);
}

TEST_F(CoordinatorDataSampleTest, AMisspelledFeatureOrPlaceholderIsNamedWithTheLine) {
  config_.input_features = {{"instrction", "text"}};
  absl::Status bad = CheckDataSample(config_);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("dataset: " + config_.data.train_path + ":1: missing column "
                                       "'instrction'; did you mean 'instruction'? (the record has: instruction, output)"));
  config_.input_features = {{"instruction", "text"}};
  config_.data.prompt_template = "Q: {instruction} {contxt}\nA: ";
  EXPECT_THAT(CheckDataSample(config_).message(), HasSubstr(":1: missing column 'contxt'"));
}

TEST_F(CoordinatorDataSampleTest, UnderSkipOnlyAColumnNoRecordHasIsRefused) {
  config_.data.malformed_records = MalformedRecords::kSkip;
  WriteFile(config_.data.train_path, "{\"instruction\": \"hi\"}\n{\"instruction\": \"ok\", \"output\": \"k\"}\n");
  EXPECT_TRUE(CheckDataSample(config_).ok());  // one record lacks it: skipped and counted by the run
  config_.output_features = {{"answer", "text"}};
  absl::Status bad = CheckDataSample(config_);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("no sampled record has what the job reads"));
}

TEST_F(CoordinatorDataSampleTest, ContentThatIsNotTheJobsFormatIsNamed) {
  WriteFile(config_.data.train_path, "instruction,output\nhi,yo\n");  // CSV named .jsonl
  absl::Status bad = CheckDataSample(config_);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("dataset: " + config_.data.train_path + ":1: malformed jsonl record"));
  config_.data.format = DatasetFormat::kCsv;
  EXPECT_TRUE(CheckDataSample(config_).ok());
}

TEST_F(CoordinatorDataSampleTest, AChatSetNeedsAChatTemplateOrLlama3Tokens) {
  WriteFile(config_.data.train_path,
            "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}\n");
  config_.input_features = {{"messages", "text"}};
  config_.output_features = {};
  config_.base_model_path = dir_.path() + "/model";
  WriteFile(config_.base_model_path + "/tokenizer_config.json", "{\"eos_token\": \"</s>\"}");
  WriteFile(config_.base_model_path + "/tokenizer.json", "{\"added_tokens\": [{\"content\": \"</s>\"}]}");
  absl::Status bad = CheckDataSample(config_);
  EXPECT_EQ(bad.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(bad.message(), HasSubstr("the chat column 'messages' needs a chat template"));
  WriteFile(config_.base_model_path + "/tokenizer_config.json",
            "{\"eos_token\": \"</s>\", \"chat_template\": \"{% for m in messages %}{{ m.content }}{% endfor %}\"}");
  EXPECT_TRUE(CheckDataSample(config_).ok());
  WriteFile(config_.data.train_path, "{\"messages\": \"hello\"}\n");
  EXPECT_THAT(CheckDataSample(config_).message(), HasSubstr(":1: 'messages' must be a JSON array"));
}

// Preference jobs: TRL's columns at submit; a conversation pair may leave its prompt implicit.
TEST_F(CoordinatorDataSampleTest, PreferencePairsNeedChosenRejectedAndAPrompt) {
  config_.trainer.type = TrainerType::kDpo;
  config_.input_features = {{"prompt", "text"}};
  config_.output_features = {{"chosen", "text"}, {"rejected", "text"}};
  WriteFile(config_.data.train_path, "{\"prompt\": \"Q\", \"chosen\": \"a\", \"rejected\": \"b\"}\n");
  EXPECT_TRUE(CheckDataSample(config_).ok());
  WriteFile(config_.data.train_path, "{\"prompt\": \"Q\", \"chosen\": \"a\", \"rejectd\": \"b\"}\n");
  absl::Status bad = CheckDataSample(config_);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr(":1: missing column 'rejected'; did you mean 'rejectd'?"));
  WriteFile(config_.data.train_path, "{\"chosen\": \"a\", \"rejected\": \"b\"}\n");
  EXPECT_THAT(CheckDataSample(config_).message(), HasSubstr(":1: missing column 'prompt': only conversations"));
  WriteFile(config_.data.train_path,
            "{\"chosen\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"a\"}], "
            "\"rejected\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"b\"}]}\n");
  EXPECT_TRUE(CheckDataSample(config_).ok());
}

}  // namespace
}  // namespace qlora::coordinator
