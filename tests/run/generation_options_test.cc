// Which decoding settings a generation session runs with (worker/run/generation_run.h): the
// request over the job file's `generation:` over the model's generation_config.json, and
// temperature 0 as greedy decoding, as transformers takes it.
#include <string>

#include "common/posix_files.h"
#include "gtest/gtest.h"
#include "tests/util/temp_dir.h"
#include "worker/run/generation_run.h"

namespace qlora::worker {
namespace {

GenerationRequest WithModelConfig(const testing::TempDir& dir, const std::string& generation_config) {
  EXPECT_TRUE(WriteFileAtomically(dir.path() + "/generation_config.json", generation_config).ok());
  GenerationRequest request;
  request.job.base_model_path = dir.path();
  return request;
}

TEST(GenerationOptionsTest, TheRequestOverTheJobOverTheModel) {
  testing::TempDir dir;
  GenerationRequest request =
      WithModelConfig(dir, R"({"do_sample": true, "temperature": 0.6, "top_p": 0.9, "max_new_tokens": 40})");
  absl::StatusOr<engine::GenerationOptions> model = ResolveGenerationOptions(request, {2});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_TRUE(model->sampling.do_sample);
  EXPECT_DOUBLE_EQ(model->sampling.temperature, 0.6);
  EXPECT_DOUBLE_EQ(model->sampling.top_p, 0.9);
  EXPECT_EQ(model->max_new_tokens, 40);

  request.job.generation.temperature = 0.8;
  request.job.generation.max_new_tokens = 20;
  request.parameters.temperature = 1.2;
  absl::StatusOr<engine::GenerationOptions> layered = ResolveGenerationOptions(request, {2});
  ASSERT_TRUE(layered.ok()) << layered.status();
  EXPECT_DOUBLE_EQ(layered->sampling.temperature, 1.2);
  EXPECT_EQ(layered->max_new_tokens, 20);
  EXPECT_TRUE(layered->sampling.do_sample);
}

// A chat model's generation_config.json asks for sampling; a job file that writes temperature 0
// means greedy decoding, and gets it. Sampling that the job or the request asks for is kept (and
// the engine refuses it at 0).
TEST(GenerationOptionsTest, TemperatureZeroTurnsOffSamplingOnlyTheModelAskedFor) {
  testing::TempDir dir;
  GenerationRequest request = WithModelConfig(dir, R"({"do_sample": true, "temperature": 0.6})");
  request.job.generation.temperature = 0.0;
  absl::StatusOr<engine::GenerationOptions> greedy = ResolveGenerationOptions(request, {2});
  ASSERT_TRUE(greedy.ok()) << greedy.status();
  EXPECT_FALSE(greedy->sampling.do_sample);

  request.parameters.do_sample = true;
  absl::StatusOr<engine::GenerationOptions> asked = ResolveGenerationOptions(request, {2});
  ASSERT_TRUE(asked.ok()) << asked.status();
  EXPECT_TRUE(asked->sampling.do_sample);
  EXPECT_DOUBLE_EQ(asked->sampling.temperature, 0.0);
}

}  // namespace
}  // namespace qlora::worker
