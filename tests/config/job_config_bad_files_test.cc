// Every file in tests/assets/jobs/bad/ must be refused with INVALID_ARGUMENT, and the message must
// contain what the file's header comments promise:
//   # expect: <substring>     (repeatable; e.g. the field path and the suggestion)
//   # line: <n>               (the message points at "<file>:<n>:")
// The files are parsed with paths unchecked and a dataset given as on the command line, so each
// one fails only for the reason it was written for.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/config/config_test_util.h"

namespace qlora {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::vector<std::string> BadFixtureNames() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const fs::directory_entry& e :
       fs::directory_iterator(testing::JobFixturesDir() + "/bad", ec)) {
    if (e.path().extension() == ".yaml") names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

struct Expectations {
  std::vector<std::string> substrings;
  int line = 0;
};

Expectations ReadHeader(const std::string& text) {
  Expectations e;
  for (absl::string_view row : absl::StrSplit(text, '\n')) {
    if (absl::ConsumePrefix(&row, "# expect:")) {
      e.substrings.emplace_back(absl::StripAsciiWhitespace(row));
    } else if (absl::ConsumePrefix(&row, "# line:")) {
      EXPECT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(row), &e.line));
    }
  }
  return e;
}

void ExpectRefusedAsPromised(const std::string& name) {
  SCOPED_TRACE(name);
  const std::string text = testing::ReadFile(testing::JobFixturesDir() + "/bad/" + name);
  const Expectations expect = ReadHeader(text);
  ASSERT_FALSE(expect.substrings.empty()) << name << " has no '# expect:' line";

  absl::StatusOr<JobConfig> c = testing::ParseNoPaths(text, name);
  ASSERT_FALSE(c.ok()) << name << " was accepted";
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  for (const std::string& s : expect.substrings) {
    EXPECT_THAT(c.status().message(), HasSubstr(s));
  }
  if (expect.line > 0) {
    EXPECT_THAT(c.status().message(), HasSubstr(name + ":" + std::to_string(expect.line) + ":"));
  }
  // Every message starts with the file's name, so a user knows where to look.
  EXPECT_TRUE(absl::StartsWith(c.status().message(), name)) << c.status();
}

class ConfigBadFileTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ConfigBadFileTest, IsRefusedNamingTheFieldAndLine) { ExpectRefusedAsPromised(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Fixtures, ConfigBadFileTest, ::testing::ValuesIn(BadFixtureNames()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string id = info.param.substr(0, info.param.size() - 5);
                           std::replace(id.begin(), id.end(), '-', '_');
                           return id;
                         });

TEST(ConfigBadFilesTest, ThereAreAtLeastThirty) { EXPECT_GE(BadFixtureNames().size(), 30u); }

// The parameterized tests are listed when the binary is built; this one reads the folder when it
// runs, so a fixture added since the last build is checked too.
TEST(ConfigBadFilesTest, EveryFixtureInTheFolderIsRefused) {
  for (const std::string& name : BadFixtureNames()) ExpectRefusedAsPromised(name);
}

}  // namespace
}  // namespace qlora
