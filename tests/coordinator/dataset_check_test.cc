// CheckDatasetFiles: every file of the training and validation lists must be a regular,
// non-empty file (stat only); a Parquet file must also have a readable footer.
#include "coordinator/admission/dataset_check.h"

#include <sys/stat.h>
#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/test_util.h"

namespace qlora::coordinator {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;
using testing::WriteFile;

TEST(CoordinatorDatasetCheckTest, EveryFileOfACommaSeparatedListIsChecked) {
  TempDir dir;
  const std::string a = WriteFile(dir.path() + "/a.jsonl", "{}\n");
  const std::string b = WriteFile(dir.path() + "/b.jsonl", "{}\n");
  const std::string fifo = dir.path() + "/c.jsonl";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  DataConfig data;
  data.train_path = a + "," + b;
  EXPECT_TRUE(CheckDatasetFiles(data).ok());
  data.validation_path = b + "," + fifo;
  absl::Status status = CheckDatasetFiles(data);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("validation_dataset: '" + fifo + "' is a FIFO"));
  data.validation_path.clear();
  data.train_path = a + "," + dir.path() + "/missing.jsonl";
  status = CheckDatasetFiles(data);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("dataset: cannot stat '" + dir.path() + "/missing.jsonl'"));
}

TEST(CoordinatorDatasetCheckTest, AParquetFileWhoseFooterDoesNotReadIsRefused) {
  TempDir dir;
  // "PAR1" at both ends, but no valid footer between them (as a truncated upload can look).
  const std::string bad = WriteFile(dir.path() + "/bad.parquet", "PAR1 not really parquet PAR1");
  DataConfig data;
  data.train_path = bad;
  absl::Status status = CheckDatasetFiles(data);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("dataset: " + bad + ": not a readable Parquet file"));
  // The same bytes under a JSON Lines name are left to the reader's malformed-record policy.
  data.train_path = WriteFile(dir.path() + "/bad.jsonl", "PAR1 not really parquet PAR1");
  EXPECT_TRUE(CheckDatasetFiles(data).ok());
}

// With read roots, each file is opened beneath them at the moment it is looked at: a link planted
// in a root that leads out is refused, whatever it pointed at when the path was first checked.
TEST(CoordinatorDatasetCheckTest, WithRootsAFileIsLookedAtBeneathThem) {
  TempDir dir;
  const std::string root = dir.path() + "/root";
  const std::string inside = WriteFile(root + "/a.jsonl", "{}\n");
  const std::string outside = WriteFile(dir.path() + "/outside/secret.jsonl", "{}\n");
  const std::string link = root + "/link.jsonl";
  ASSERT_EQ(symlink(outside.c_str(), link.c_str()), 0);
  ASSERT_EQ(symlink("a.jsonl", (root + "/inner.jsonl").c_str()), 0);  // a link within: fine
  DataConfig data;
  data.train_path = inside + "," + root + "/inner.jsonl";
  EXPECT_TRUE(CheckDatasetFiles(data, {root}).ok());
  data.train_path = link;
  absl::Status status = CheckDatasetFiles(data, {root});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("leads out of the folders this coordinator reads"));
  data.train_path = root + "/../outside/secret.jsonl";
  EXPECT_EQ(CheckDatasetFiles(data, {root}).code(), absl::StatusCode::kInvalidArgument);
  // A bad Parquet file beneath a root is still named as the job names it.
  data.train_path = WriteFile(root + "/bad.parquet", "PAR1 not really parquet PAR1");
  status = CheckDatasetFiles(data, {root});
  EXPECT_THAT(status.message(), HasSubstr("dataset: " + data.train_path + ": not a readable"));
}

}  // namespace
}  // namespace qlora::coordinator
