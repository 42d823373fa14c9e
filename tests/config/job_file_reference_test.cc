// The job-file reference is the parser's key table: docs/job-file.md is exactly its rendering,
// every documented default is what the parser resolves, every key the resolved file writes is
// documented, and `qloractl explain` finds keys and suggests the closest for a typo.
#include "common/config/job_file_reference.h"

#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "absl/strings/numbers.h"
#include "common/config/job_config_emit.h"
#include "common/config/job_config_parser.h"
#include "common/config/job_config_schema.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/files.h"

namespace qlora {
namespace {

using config_internal::JobFileSchema;
using config_internal::SchemaNode;
using ::testing::HasSubstr;

// The resolved file of the smallest job: every default the parser chooses, written out.
YAML::Node ResolvedMinimalJob() {
  ParseOptions options;
  options.check_paths = false;
  absl::StatusOr<JobConfig> config = ParseJobConfig(
      "model_type: llm\nbase_model: /models/tiny\nadapter: {type: lora}\ndataset: train.jsonl\n",
      options);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? YAML::Load(EmitResolvedJobYaml(*config)) : YAML::Node();
}

// A scalar as written, a list of scalars as "[a, b]".
std::string Rendered(const YAML::Node& node) {
  if (node.IsScalar()) return node.Scalar();
  if (!node.IsSequence()) return "<mapping>";
  std::string out = "[";
  for (size_t i = 0; i < node.size(); ++i) out += (i ? ", " : "") + Rendered(node[i]);
  return out + "]";
}

// Equal as written, or as numbers ("1e+01" is 10).
bool SameValue(const std::string& resolved, const std::string& documented) {
  if (resolved == documented) return true;
  double a = 0, b = 0;
  return absl::SimpleAtod(resolved, &a) && absl::SimpleAtod(documented, &b) && a == b;
}

void CheckDefaults(const SchemaNode& node, const YAML::Node& resolved, const std::string& path,
                   int* checked) {
  for (const SchemaNode& child : node.children) {
    const std::string child_path = path.empty() ? child.key : path + "." + child.key;
    const YAML::Node value =
        resolved.IsDefined() && resolved.IsMap() ? resolved[child.key] : YAML::Node();
    if (!child.default_value.empty()) {
      ++(*checked);
      EXPECT_TRUE(value.IsDefined()) << child_path << ": documented default `"
                                     << child.default_value << "` but the resolved file has no "
                                     << "such key";
      if (value.IsDefined()) EXPECT_TRUE(SameValue(Rendered(value), child.default_value))
          << child_path << ": the resolved file has " << Rendered(value)
          << ", the reference says " << child.default_value;
    }
    if (!child.children.empty() && value.IsDefined() && value.IsMap()) {
      CheckDefaults(child, value, child_path, checked);
    }
  }
}

void CheckDocumented(const YAML::Node& resolved, const SchemaNode& node, const std::string& path) {
  if (!resolved.IsMap()) return;
  for (const auto& entry : resolved) {
    const std::string key = entry.first.Scalar();
    const std::string key_path = path.empty() ? key : path + "." + key;
    const SchemaNode* child = node.Child(key);
    ASSERT_NE(child, nullptr) << key_path << " is in the resolved file but not in the schema";
    EXPECT_TRUE(child->refused_because.empty()) << key_path;
    EXPECT_FALSE(child->type.empty()) << key_path << " has no documented type";
    CheckDocumented(entry.second, *child, key_path);
  }
}

TEST(ConfigTest, JobFileReferenceMatchesTheSchema) {
  const char* source = std::getenv("QLORA_SOURCE_DIR");
  ASSERT_NE(source, nullptr) << "QLORA_SOURCE_DIR is not set";
  const std::string doc = testing::ReadFile(std::string(source) + "/docs/job-file.md");
  EXPECT_TRUE(doc == JobFileReferenceMarkdown())
      << "docs/job-file.md is not the schema's rendering; regenerate it with\n"
      << "  build/cli/qloractl explain --markdown > docs/job-file.md";
}

TEST(ConfigTest, EveryDocumentedDefaultIsWhatTheParserResolves) {
  const YAML::Node resolved = ResolvedMinimalJob();
  ASSERT_TRUE(resolved.IsMap());
  int checked = 0;
  CheckDefaults(JobFileSchema(), resolved, "", &checked);
  EXPECT_GT(checked, 40);
}

TEST(ConfigTest, EveryKeyOfTheResolvedFileIsDocumented) {
  const YAML::Node resolved = ResolvedMinimalJob();
  ASSERT_TRUE(resolved.IsMap());
  CheckDocumented(resolved, JobFileSchema(), "");
}

TEST(ConfigTest, EveryKeyHasATypeOrARefusal) {
  std::vector<std::string> undocumented;
  std::function<void(const SchemaNode&, const std::string&)> walk =
      [&](const SchemaNode& node, const std::string& path) {
        for (const SchemaNode& child : node.children) {
          const std::string child_path = path.empty() ? child.key : path + "." + child.key;
          if (child.type.empty() == child.refused_because.empty()) undocumented.push_back(child_path);
          walk(child, child_path);
        }
      };
  walk(JobFileSchema(), "");
  EXPECT_THAT(undocumented, ::testing::IsEmpty());
}

TEST(ConfigTest, ExplainShowsAKeyItsDefaultAndItsSubKeys) {
  absl::StatusOr<std::string> trainer = ExplainJobFileKey("trainer");
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  EXPECT_THAT(*trainer, HasSubstr("trainer.batch_size  (integer >= 1)  default `1`"));
  EXPECT_THAT(*trainer, HasSubstr("trainer.use_mixed_precision: refused: DeepSpeed's AMP"));
  absl::StatusOr<std::string> r = ExplainJobFileKey("adapter.r");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "adapter.r  (integer >= 1)  default `8`: the LoRA rank\n");
  absl::StatusOr<std::string> top = ExplainJobFileKey("");
  ASSERT_TRUE(top.ok()) << top.status();
  EXPECT_THAT(*top, HasSubstr("  quantization  (mapping, or null for a 16-bit base)"));
}

TEST(ConfigTest, ExplainOfAnUnknownKeyIsNotFoundWithTheClosestName) {
  absl::StatusOr<std::string> typo = ExplainJobFileKey("trainer.batch_sise");
  ASSERT_FALSE(typo.ok());
  EXPECT_EQ(typo.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(typo.status().message()),
              HasSubstr("trainer.batch_sise: unknown field; did you mean 'batch_size'?"));
}

}  // namespace
}  // namespace qlora
