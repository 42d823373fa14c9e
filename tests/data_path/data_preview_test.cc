// PreviewJobData (`qloractl validate`): the first records built as a worker builds them; a
// column the records lack fails naming the line, the column and the nearest one they have; the
// counts of cut and target-less records; one example with the trained tokens marked.
#include "worker/data/data_preview.h"

#include <memory>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/data_path/test_util.h"

namespace qlora::data {
namespace {

using ::testing::HasSubstr;

class DataPreviewTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteByteTokenizer(dir_.path());
    tokenizer_ = std::move(*LoadTokenizer(dir_.path()));
    job_.input_features = {{"instruction", "text"}};
    job_.output_features = {{"output", "text"}};
    job_.data.prompt_template = "Q: {instruction}\nA: ";
    job_.data.max_sequence_length = 16;
  }
  TempDir dir_;
  std::unique_ptr<Tokenizer> tokenizer_;
  JobConfig job_;
};

TEST_F(DataPreviewTest, CountsWhatARunWouldDropAndShowsTheTrainedTokens) {
  job_.data.train_path = dir_.path() + "/train.jsonl";
  WriteFile(job_.data.train_path,
            "{\"instruction\": \"hi\", \"output\": \"yo\"}\n"
            "{\"instruction\": \"a long question that fills the window\", \"output\": \"x\"}\n"
            "{\"instruction\": \"ok\", \"output\": \"a long answer past the end\"}\n");
  absl::StatusOr<DataPreview> preview = PreviewJobData(job_, *tokenizer_);
  ASSERT_TRUE(preview.ok()) << preview.status();
  EXPECT_EQ(preview->layout, "instruction");
  EXPECT_EQ(preview->records, 3);
  EXPECT_EQ(preview->without_target, 1);
  EXPECT_EQ(preview->truncated, 2);
  EXPECT_EQ(preview->example_line, 1);
  // BOS, "Q: hi\nA: " (context), then "yo" and EOS (trained): byte ids, one per character.
  EXPECT_EQ(preview->rendered, "<|begin_of_text|>Q: hi\nA: [[yo<|end_of_text|>]]");
  EXPECT_EQ(preview->example_tokens, 13);
  EXPECT_EQ(preview->example_trained_tokens, 3);
  const std::string text = DataPreviewText(*preview);
  EXPECT_THAT(text, HasSubstr("2 cut to max_sequence_length, 1 left without a target"));
  EXPECT_THAT(text, HasSubstr("#   <|begin_of_text|>Q: hi\n#   A: [[yo"));
}

TEST_F(DataPreviewTest, AMisspelledColumnIsNamedWithTheLineAndTheNearestColumn) {
  job_.data.train_path = dir_.path() + "/train.jsonl";
  WriteFile(job_.data.train_path, "{\"instruction\": \"hi\", \"output\": \"yo\"}\n");
  job_.data.prompt_template = "Q: {instrution}\nA: ";
  absl::Status bad = PreviewJobData(job_, *tokenizer_).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr(job_.data.train_path + ":1: missing column 'instrution'; did "
                                       "you mean 'instruction'? (the record has: instruction, output)"));
  // Under `skip` too, when no sampled record has it: the job would train nothing.
  job_.data.malformed_records = MalformedRecords::kSkip;
  bad = PreviewJobData(job_, *tokenizer_).status();
  EXPECT_THAT(bad.message(), HasSubstr("no sampled record has what the job reads"));
}

TEST_F(DataPreviewTest, ContentThatIsNotTheJobsFormatIsNamed) {
  job_.data.train_path = dir_.path() + "/train.jsonl";  // CSV content under a .jsonl name
  WriteFile(job_.data.train_path, "instruction,output\nhi,yo\n");
  absl::Status bad = PreviewJobData(job_, *tokenizer_).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr(job_.data.train_path + ":1: malformed jsonl record"));
  job_.data.format = DatasetFormat::kCsv;
  absl::StatusOr<DataPreview> csv = PreviewJobData(job_, *tokenizer_);
  ASSERT_TRUE(csv.ok()) << csv.status();
  EXPECT_EQ(csv->examples, 1);
}

}  // namespace
}  // namespace qlora::data
