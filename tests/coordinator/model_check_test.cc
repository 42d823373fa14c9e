// CheckBaseModelConfig: a base model folder whose config.json the workers would refuse is
// refused at submission, naming the folder and the reason; a FIFO never blocks the check.
#include "coordinator/admission/model_check.h"

#include <sys/stat.h>

#include <filesystem>

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

// A rank no adapter of the model can use is refused at submit (issue 58: `adapter.r: 1e9` was
// accepted and each worker tried a 512 GB allocation, retried twice): at most min(in, out) of
// the smallest targeted projection; k_proj of a grouped-query model is the narrow one.
TEST(CoordinatorModelCheckTest, AnAdapterRankTheModelCannotUseIsRefused) {
  TempDir dir;
  WriteFile(dir.path() + "/config.json",
            R"({"model_type": "llama", "hidden_size": 128, "intermediate_size": 256,
                "num_attention_heads": 4, "num_key_value_heads": 2})");
  LoraConfig lora;
  lora.target_modules = {"q_proj", "v_proj"};
  lora.r = 64;  // v_proj: 128 -> 64
  EXPECT_TRUE(CheckBaseModelConfig(dir.path(), &lora).ok());
  lora.r = 65;
  absl::Status refused = CheckBaseModelConfig(dir.path(), &lora);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(),
              HasSubstr("adapter.r: 65 is larger than any adapter of v_proj can use (128 -> 64 "
                        "features: at most 64)"));
  lora.r = 1000000000;
  lora.target_modules = {"gate_proj"};
  refused = CheckBaseModelConfig(dir.path(), &lora);
  EXPECT_THAT(refused.message(), HasSubstr("at most 128"));
  EXPECT_TRUE(CheckBaseModelConfig(dir.path()).ok()) << "without a LoRA config, the folder alone";
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

// With roots, config.json is read through a descriptor opened beneath them: a config.json that
// is a link out of the roots is refused, whatever it names.
TEST(CoordinatorModelCheckTest, WithRootsConfigJsonIsReadBeneathThem) {
  TempDir dir;
  const std::string model = dir.path() + "/root/model";
  WriteFile(dir.path() + "/outside/config.json", R"({"model_type": "llama"})");
  std::filesystem::create_directories(model);
  std::filesystem::create_symlink(dir.path() + "/outside/config.json", model + "/config.json");
  const absl::Status refused = CheckBaseModelConfig(model, nullptr, {dir.path() + "/root"});
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("leads out of"));
  // A link that stays beneath the root is followed, relative (the Hugging Face cache's snapshots
  // link to its blobs so) or absolute.
  WriteFile(dir.path() + "/root/blobs/config", R"({"model_type": "llama"})");
  const std::string snapshot = dir.path() + "/root/snapshot";
  std::filesystem::create_directories(snapshot);
  std::filesystem::create_symlink("../blobs/config", snapshot + "/config.json");
  EXPECT_TRUE(CheckBaseModelConfig(snapshot, nullptr, {dir.path() + "/root"}).ok());
  EXPECT_TRUE(CheckBaseModelConfig(model, nullptr, {dir.path()}).ok());
}

}  // namespace
}  // namespace qlora::coordinator
