// KEY.PATH=VALUE overrides of a job file: parsing the argument, YAML-typed values, created maps,
// errors naming the scalar or list on the path, and the parser seeing the overridden values.
#include "common/config/yaml_overrides.h"

#include <yaml-cpp/yaml.h>

#include "common/config/job_config_parser.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace qlora {
namespace {

using ::testing::HasSubstr;

std::vector<YamlOverride> Overrides(std::initializer_list<const char*> args) {
  std::vector<YamlOverride> out;
  for (const char* a : args) {
    absl::StatusOr<YamlOverride> o = ParseOverride(a);
    EXPECT_TRUE(o.ok()) << a << ": " << o.status();
    if (o.ok()) out.push_back(*o);
  }
  return out;
}

TEST(YamlOverridesTest, ParsesKeyPathAndValue) {
  absl::StatusOr<YamlOverride> o = ParseOverride("trainer.learning_rate=1e-4");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_THAT(o->path, ::testing::ElementsAre("trainer", "learning_rate"));
  EXPECT_EQ(o->value, "1e-4");
  absl::StatusOr<YamlOverride> with_eq = ParseOverride("data.prompt_template=a=b");
  ASSERT_TRUE(with_eq.ok());
  EXPECT_EQ(with_eq->value, "a=b");
  EXPECT_TRUE(IsOverrideArgument("name=run-1"));
  EXPECT_FALSE(IsOverrideArgument("job.yaml"));
  EXPECT_FALSE(IsOverrideArgument("a..b=1"));
  EXPECT_FALSE(IsOverrideArgument("=1"));
  EXPECT_FALSE(IsOverrideArgument("dir/job.yaml=1"));
}

TEST(YamlOverridesTest, SetsValuesWithTheirYamlTypes) {
  const std::string yaml =
      "# a comment\nbase_model: /m\nadapter: {type: lora, r: 8}\ntrainer:\n  learning_rate: 0.001\n";
  absl::StatusOr<std::string> out = ApplyOverrides(
      yaml, Overrides({"trainer.learning_rate=1e-4", "adapter.r=16", "data.max_sequence_length=1024",
                       "adapter.target_modules=[q_proj, k_proj]", "trainer.learning_rate=2e-4"}));
  ASSERT_TRUE(out.ok()) << out.status();
  YAML::Node n = YAML::Load(*out);
  EXPECT_EQ(n["trainer"]["learning_rate"].as<double>(), 2e-4);  // the later override wins
  EXPECT_EQ(n["adapter"]["r"].as<int>(), 16);
  EXPECT_EQ(n["adapter"]["type"].as<std::string>(), "lora");
  EXPECT_EQ(n["data"]["max_sequence_length"].as<int>(), 1024);  // `data` was created
  ASSERT_TRUE(n["adapter"]["target_modules"].IsSequence());
  EXPECT_EQ(n["adapter"]["target_modules"][1].as<std::string>(), "k_proj");
  EXPECT_EQ(n["base_model"].as<std::string>(), "/m");
}

TEST(YamlOverridesTest, NullMapsAreCreatedAndQuotedStringsStayStrings) {
  absl::StatusOr<std::string> out =
      ApplyOverrides("quantization:\nname: 'x'\n", Overrides({"quantization.bits=4", "name=\"007\""}));
  ASSERT_TRUE(out.ok()) << out.status();
  YAML::Node n = YAML::Load(*out);
  EXPECT_EQ(n["quantization"]["bits"].as<int>(), 4);
  EXPECT_EQ(n["name"].as<std::string>(), "007");
  absl::StatusOr<std::string> empty = ApplyOverrides("", Overrides({"trainer.epochs=2"}));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(YAML::Load(*empty)["trainer"]["epochs"].as<int>(), 2);
}

TEST(YamlOverridesTest, APathThroughAScalarOrAListIsAnErrorNamingIt) {
  absl::StatusOr<std::string> scalar =
      ApplyOverrides("trainer: {learning_rate: 0.1}\n", Overrides({"trainer.learning_rate.x=1"}));
  EXPECT_EQ(scalar.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(scalar.status().message(), HasSubstr("trainer.learning_rate is a scalar"));
  absl::StatusOr<std::string> list =
      ApplyOverrides("adapter: {target_modules: [q_proj]}\n", Overrides({"adapter.target_modules.0=k_proj"}));
  EXPECT_THAT(list.status().message(), HasSubstr("adapter.target_modules is a list"));
  EXPECT_FALSE(ApplyOverrides("- a\n- b\n", Overrides({"a=1"})).ok());
  EXPECT_FALSE(ApplyOverrides("a: 1\n---\nb: 2\n", Overrides({"a=2"})).ok());
  EXPECT_THAT(ApplyOverrides("a: 1\n", Overrides({"a=[1"})).status().message(), HasSubstr("not YAML"));
}

TEST(YamlOverridesTest, TheParserSeesOverridesAndNamesUnknownKeys) {
  const std::string yaml = "base_model: /m\ndataset: d.jsonl\nadapter: {type: lora}\ntrainer: {batch_size: 1}\n";
  ParseOptions options;
  options.check_paths = false;
  absl::StatusOr<std::string> out =
      ApplyOverrides(yaml, Overrides({"trainer.learning_rate=1e-4", "adapter.r=16", "data.max_sequence_length=1024"}));
  ASSERT_TRUE(out.ok()) << out.status();
  absl::StatusOr<JobConfig> config = ParseJobConfig(*out, options);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_DOUBLE_EQ(config->trainer.learning_rate, 1e-4);
  EXPECT_EQ(config->lora.r, 16);
  EXPECT_EQ(config->data.max_sequence_length, 1024);

  absl::StatusOr<std::string> typo = ApplyOverrides(yaml, Overrides({"trainer.learning_rat=1e-4"}));
  ASSERT_TRUE(typo.ok());
  absl::StatusOr<JobConfig> rejected = ParseJobConfig(*typo, options);
  EXPECT_EQ(rejected.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(rejected.status().message(), HasSubstr("learning_rate"));
}

}  // namespace
}  // namespace qlora
