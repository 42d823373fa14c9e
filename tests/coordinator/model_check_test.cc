// CheckBaseModelConfig: a base model folder whose config.json the workers would refuse is
// refused at submission, naming the folder and the reason; a FIFO never blocks the check.
#include "coordinator/admission/model_check.h"

#include <sys/stat.h>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/test_util.h"

namespace qlora::coordinator {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;
using testing::WriteFile;

TEST(CoordinatorModelCheckTest, SupportedFamiliesPassOthersAreRefusedByName) {
  TempDir dir;
  for (const char* type : {"llama", "mistral", "qwen2"}) {
    WriteFile(dir.path() + "/config.json", absl::StrCat(R"({"model_type": ")", type, R"("})"));
    EXPECT_TRUE(CheckBaseModelConfig(dir.path()).ok()) << type;
  }
  WriteFile(dir.path() + "/config.json", R"({"model_type": "gemma"})");
  const absl::Status gemma = CheckBaseModelConfig(dir.path());
  EXPECT_EQ(gemma.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(gemma.message(), HasSubstr("base_model '" + dir.path() + "'"));
  EXPECT_THAT(gemma.message(), HasSubstr("\"gemma\" is not supported (supported: llama, mistral, qwen2)"));

  WriteFile(dir.path() + "/config.json", "not json");
  EXPECT_EQ(CheckBaseModelConfig(dir.path()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckBaseModelConfig("").ok());
}

TEST(CoordinatorModelCheckTest, FifoOrHugeConfigIsRefusedWithoutReadingIt) {
  TempDir dir;
  const std::string fifo = dir.path() + "/config.json";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  const absl::Status status = CheckBaseModelConfig(dir.path());  // would block if opened
  EXPECT_THAT(status.message(), HasSubstr("not a regular file"));
  TempDir big;
  WriteFile(big.path() + "/config.json", std::string(5 << 20, ' '));
  EXPECT_THAT(CheckBaseModelConfig(big.path()).message(), HasSubstr("larger than 4 MiB"));
}

}  // namespace
}  // namespace qlora::coordinator
