// ChangedKeys: the leaves that differ between two resolved job files, by dotted key, with both
// values; a list is one leaf; a key present on one side only is a change from or to "".
#include "common/config/resolved_diff.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace qlora {
namespace {

using ::testing::HasSubstr;

TEST(ConfigResolvedDiffTest, NamesEachChangedLeafWithBothValues) {
  const std::string before =
      "name: a\nadapter:\n  r: 8\n  target_modules: [q_proj, v_proj]\ntrainer: {learning_rate: 0.003}\n";
  const std::string after =
      "name: a\nadapter:\n  r: 16\n  target_modules: [q_proj]\ntrainer: {learning_rate: 0.003, seed: 7}\n";
  absl::StatusOr<std::vector<KeyChange>> changes = ChangedKeys(before, after);
  ASSERT_TRUE(changes.ok()) << changes.status();
  ASSERT_EQ(changes->size(), 3u);
  EXPECT_EQ((*changes)[0].key, "adapter.r");
  EXPECT_EQ((*changes)[0].before, "8");
  EXPECT_EQ((*changes)[0].after, "16");
  EXPECT_EQ((*changes)[1].key, "adapter.target_modules");
  EXPECT_EQ((*changes)[1].before, "[q_proj, v_proj]");
  EXPECT_EQ((*changes)[1].after, "[q_proj]");
  EXPECT_EQ((*changes)[2].key, "trainer.seed");
  EXPECT_EQ((*changes)[2].before, "");
  EXPECT_EQ((*changes)[2].after, "7");
  EXPECT_TRUE(ChangedKeys(before, before)->empty());
}

TEST(ConfigResolvedDiffTest, TextThatIsNotAMappingIsNamed) {
  const absl::Status bad = ChangedKeys("a: 1\n", "- 1\n").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("the second resolved job file is not a mapping"));
}

}  // namespace
}  // namespace qlora
