// Path confinement: a job reads datasets and models only under --read-roots and writes only
// under --output-root, with symbolic links resolved so that none leads out.
#include "coordinator/admission/path_confinement.h"

#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/test_util.h"

namespace qlora::coordinator {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::TempDir;
using testing::WriteFile;

class CoordinatorPathConfinementTest : public ::testing::Test {
 protected:
  void SetUp() override {
    data_ = dir_.path() + "/data";
    models_ = dir_.path() + "/models";
    outputs_ = dir_.path() + "/outputs";
    outside_ = dir_.path() + "/outside";
    for (const std::string& d : {data_, models_ + "/tiny", outputs_, outside_}) fs::create_directories(d);
    WriteFile(data_ + "/train.jsonl", "{}\n");
    WriteFile(outside_ + "/secret", "x\n");
    WriteFile(models_ + "/tiny/config.json", "{}");
    absl::StatusOr<PathRoots> roots = ResolvePathRoots(data_ + "," + models_, outputs_);
    ASSERT_TRUE(roots.ok()) << roots.status();
    roots_ = *roots;
  }
  JobConfig Config() const {
    JobConfig c;
    c.data.train_path = data_ + "/train.jsonl";
    c.base_model_path = models_ + "/tiny";
    c.output_dir = outputs_ + "/run-1";
    return c;
  }
  void ExpectRefused(const JobConfig& c, const std::string& field, const std::string& flag) {
    const absl::Status s = CheckJobPathsConfined(c, roots_);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(field + ": ")) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(flag)) << s;
  }
  TempDir dir_;
  std::string data_, models_, outputs_, outside_;
  PathRoots roots_;
};

TEST_F(CoordinatorPathConfinementTest, PathsInsideTheRootsAreAccepted) {
  EXPECT_TRUE(CheckJobPathsConfined(Config(), roots_).ok());
  JobConfig default_output = Config();
  default_output.output_dir.clear();  // the coordinator's own folder
  EXPECT_TRUE(CheckJobPathsConfined(default_output, roots_).ok());
}

TEST_F(CoordinatorPathConfinementTest, DatasetsOutsideOrLinkedOutAreRefused) {
  JobConfig c = Config();
  c.data.train_path = "/etc/passwd";
  ExpectRefused(c, "dataset", "--read-roots");
  // A link inside a root that leads out is followed.
  fs::create_symlink(outside_ + "/secret", data_ + "/link.jsonl");
  c.data.train_path = data_ + "/link.jsonl";
  ExpectRefused(c, "dataset", "--read-roots");
  c = Config();
  c.data.validation_path = data_ + "/train.jsonl," + outside_ + "/secret";
  ExpectRefused(c, "validation_dataset", "--read-roots");
  // ".." does not escape either.
  c = Config();
  c.data.train_path = data_ + "/../outside/secret";
  ExpectRefused(c, "dataset", "--read-roots");
}

TEST_F(CoordinatorPathConfinementTest, ModelFolderAndItsFilesMustStayInside) {
  JobConfig c = Config();
  c.base_model_path = outside_;
  ExpectRefused(c, "base_model", "--read-roots");
  fs::create_symlink(outside_ + "/secret", models_ + "/tiny/model.safetensors");
  ExpectRefused(Config(), "base_model", "--read-roots");
}

TEST_F(CoordinatorPathConfinementTest, OutputOutsideTheOutputRootIsRefused) {
  JobConfig c = Config();
  c.output_dir = outside_ + "/run";
  ExpectRefused(c, "output_dir", "--output-root");
  c.output_dir = outputs_;  // the root itself is fine
  EXPECT_TRUE(CheckJobPathsConfined(c, roots_).ok());
}

TEST_F(CoordinatorPathConfinementTest, NoRootsMeansNoConfinement) {
  JobConfig c = Config();
  c.data.train_path = "/etc/passwd";
  c.output_dir = "/tmp/anywhere";
  EXPECT_TRUE(CheckJobPathsConfined(c, PathRoots{}).ok());
}

TEST_F(CoordinatorPathConfinementTest, RootsMustBeExistingFolders) {
  absl::StatusOr<PathRoots> missing = ResolvePathRoots(dir_.path() + "/nope", "");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("--read-roots"));
  absl::StatusOr<PathRoots> file = ResolvePathRoots("", outside_ + "/secret");
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(file.status().message()), HasSubstr("--output-root"));
}

}  // namespace
}  // namespace qlora::coordinator
