// base_model resolution, offline: local folders, the Hugging Face hub cache layout
// (models--org--name/refs/main -> snapshots/<hash>), and the NOT_FOUND / FAILED_PRECONDITION
// errors ParseJobConfig reports with check_paths.
#include "common/config/hf_model_path.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/config/job_config_emit.h"
#include "common/config/job_config_parser.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/files.h"

namespace qlora {
namespace {

namespace fs = std::filesystem;
using ::qlora::testing::WriteFile;  // a fs::path converts to the std::string it takes
using ::testing::HasSubstr;

class ConfigHfModelPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = fs::temp_directory_path() /
            absl::StrCat("qlora-config-test-", ::getpid(), "-", info->name());
    fs::remove_all(root_);
    cache_ = root_ / "hub";
    fs::create_directories(cache_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // A cache entry laid out as huggingface_hub writes it.
  fs::path AddSnapshot(const std::string& repo, const std::string& hash, bool with_config) {
    std::string folder = "models--" + repo;
    for (size_t i = folder.find('/'); i != std::string::npos; i = folder.find('/')) {
      folder.replace(i, 1, "--");
    }
    const fs::path snapshot = cache_ / folder / "snapshots" / hash;
    fs::create_directories(snapshot);
    if (with_config) WriteFile(snapshot / "config.json", "{}");
    return snapshot;
  }
  void SetMainRef(const std::string& folder, const std::string& hash) {
    WriteFile(cache_ / folder / "refs" / "main", hash);
  }

  // A job file naming `base_model` and `dataset`.
  absl::StatusOr<JobConfig> Parse(const std::string& base_model, const std::string& dataset) {
    ParseOptions options;
    options.hf_hub_cache = cache_.string();
    return ParseJobConfig(absl::StrCat("base_model: '", base_model, "'\nadapter: {type: lora}\n",
                                       "dataset: '", dataset, "'\n"),
                          options);
  }
  std::string Dataset() {
    const fs::path path = root_ / "train.jsonl";
    WriteFile(path, "{\"instruction\": \"a\", \"output\": \"b\"}\n");
    return path.string();
  }

  fs::path root_;
  fs::path cache_;
};

TEST_F(ConfigHfModelPathTest, LocalFolderWithConfigJsonWins) {
  const fs::path model = root_ / "my-model";
  WriteFile(model / "config.json", "{}");
  absl::StatusOr<std::string> path = ResolveBaseModelPath(model.string(), cache_.string());
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, model.string());
}

TEST_F(ConfigHfModelPathTest, HubNameResolvesThroughRefsMain) {
  AddSnapshot("org/name", "aaaa", true);
  const fs::path wanted = AddSnapshot("org/name", "bbbb", true);
  SetMainRef("models--org--name", "bbbb\n");
  absl::StatusOr<std::string> path = ResolveBaseModelPath("org/name", cache_.string());
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, wanted.string());
}

TEST_F(ConfigHfModelPathTest, SingleSegmentHubName) {
  const fs::path wanted = AddSnapshot("gpt2", "cafe", true);
  SetMainRef("models--gpt2", "cafe");
  absl::StatusOr<std::string> path = ResolveBaseModelPath("gpt2", cache_.string());
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, wanted.string());
}

TEST_F(ConfigHfModelPathTest, WithoutRefsMainFallsBackToTheSnapshotWithConfig) {
  AddSnapshot("org/name", "incomplete", false);
  const fs::path wanted = AddSnapshot("org/name", "complete", true);
  absl::StatusOr<std::string> path = ResolveBaseModelPath("org/name", cache_.string());
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, wanted.string());
}

TEST_F(ConfigHfModelPathTest, StaleRefsMainFallsBackToTheNewestCompleteSnapshot) {
  const fs::path older = AddSnapshot("org/name", "older", true);
  const fs::path newer = AddSnapshot("org/name", "newer", true);
  fs::last_write_time(older / "config.json",
                      fs::last_write_time(newer / "config.json") - std::chrono::hours(1));
  SetMainRef("models--org--name", "missing-hash");
  absl::StatusOr<std::string> path = ResolveBaseModelPath("org/name", cache_.string());
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, newer.string());
}

TEST_F(ConfigHfModelPathTest, HubNameMissingFromTheCacheSaysToDownloadIt) {
  AddSnapshot("org/other", "h", true);
  absl::StatusOr<std::string> path = ResolveBaseModelPath("org/name", cache_.string());
  EXPECT_EQ(path.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(path.status().message(),
              HasSubstr(absl::StrCat("base_model 'org/name' is neither a local folder nor in the "
                                     "Hugging Face cache at ",
                                     cache_.string(), "; download it first")));
  EXPECT_THAT(path.status().message(), HasSubstr("hf download org/name"));
}

TEST_F(ConfigHfModelPathTest, FolderWithoutConfigJsonIsAFailedPrecondition) {
  fs::create_directories(root_ / "empty-model");
  absl::StatusOr<std::string> path =
      ResolveBaseModelPath((root_ / "empty-model").string(), cache_.string());
  EXPECT_EQ(path.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(path.status().message(), HasSubstr("has no config.json"));
}

TEST_F(ConfigHfModelPathTest, MissingPathIsNotFound) {
  absl::StatusOr<std::string> path =
      ResolveBaseModelPath((root_ / "a" / "b" / "c").string(), cache_.string());
  EXPECT_EQ(path.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(path.status().message(), HasSubstr("does not exist"));
}

TEST_F(ConfigHfModelPathTest, RepoIdShapes) {
  EXPECT_TRUE(LooksLikeHubRepoId("meta-llama/Llama-2-7b-hf"));
  EXPECT_TRUE(LooksLikeHubRepoId("gpt2"));
  EXPECT_FALSE(LooksLikeHubRepoId("/abs/path"));
  EXPECT_FALSE(LooksLikeHubRepoId("./rel"));
  EXPECT_FALSE(LooksLikeHubRepoId("a/b/c"));
  EXPECT_FALSE(LooksLikeHubRepoId("org/../x"));
  EXPECT_FALSE(LooksLikeHubRepoId("org name/x"));
}

TEST_F(ConfigHfModelPathTest, ParseResolvesTheModelAndMakesTheDatasetAbsolute) {
  const fs::path snapshot = AddSnapshot("meta-llama/Llama-2-7b-hf", "0123abcd", true);
  SetMainRef("models--meta-llama--Llama-2-7b-hf", "0123abcd");
  absl::StatusOr<JobConfig> c = Parse("meta-llama/Llama-2-7b-hf", Dataset());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->base_model, "meta-llama/Llama-2-7b-hf");
  EXPECT_EQ(c->base_model_path, snapshot.string());
  EXPECT_TRUE(fs::path(c->data.train_path).is_absolute());
}

TEST_F(ConfigHfModelPathTest, ParseMissingDatasetIsNotFoundNamingFieldAndPath) {
  AddSnapshot("org/name", "h", true);
  SetMainRef("models--org--name", "h");
  const std::string missing = (root_ / "nope.jsonl").string();
  absl::StatusOr<JobConfig> c = Parse("org/name", missing);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(), HasSubstr("job.yaml:3: dataset: file '" + missing +
                                              "' does not exist"));
}

// A dataset named like a hub dataset gets how to fetch it: the service reads local files only.
TEST_F(ConfigHfModelPathTest, AHubDatasetNameSaysHowToFetchIt) {
  const fs::path model = root_ / "model";
  WriteFile(model / "config.json", "{}");
  ParseOptions options;
  options.hf_hub_cache = cache_.string();
  options.base_dir = root_.string();
  absl::StatusOr<JobConfig> c = ParseJobConfig(
      absl::StrCat("base_model: ", model.string(), "\nadapter: {type: lora}\ndataset: tatsu-lab/alpaca\n"),
      options);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(),
              HasSubstr("'tatsu-lab/alpaca' looks like a Hugging Face hub dataset, which the service "
                        "does not download: fetch it with `hf download tatsu-lab/alpaca --repo-type "
                        "dataset --local-dir DIR`"));
  absl::StatusOr<JobConfig> plain = ParseJobConfig(
      absl::StrCat("base_model: ", model.string(), "\nadapter: {type: lora}\ndataset: data/missing.jsonl\n"),
      options);
  EXPECT_EQ(plain.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(plain.status().message(), ::testing::Not(HasSubstr("hub dataset")));
}

TEST_F(ConfigHfModelPathTest, ParseMissingDatasetOverrideNamesTheCommandLine) {
  ParseOptions options;
  options.hf_hub_cache = cache_.string();
  options.dataset_override = (root_ / "cli.jsonl").string();
  options.check_paths = true;
  const fs::path model = root_ / "model";
  WriteFile(model / "config.json", "{}");
  absl::StatusOr<JobConfig> c = ParseJobConfig(
      absl::StrCat("base_model: ", model.string(), "\nadapter: {type: lora}\n"), options);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(), HasSubstr("dataset (from the command line): file"));
}

// adapter.pretrained_adapter_weights: a PEFT adapter folder, relative to the client's folder,
// comes back absolute; a folder without the adapter's two files is NOT_FOUND naming what is
// missing; the resolved file carries it.
TEST_F(ConfigHfModelPathTest, PretrainedAdapterFolderResolvesOrIsNamed) {
  const fs::path model = root_ / "model";
  WriteFile(model / "config.json", "{}");
  WriteFile(root_ / "train.jsonl", "{}\n");
  WriteFile(root_ / "run1/adapter/adapter_config.json", "{}");
  ParseOptions options;
  options.hf_hub_cache = cache_.string();
  options.base_dir = root_.string();
  const std::string job = absl::StrCat("base_model: ", model.string(), "\ndataset: train.jsonl\n",
                                       "adapter: {type: lora, pretrained_adapter_weights: run1/adapter}\n");
  absl::StatusOr<JobConfig> missing = ParseJobConfig(job, options);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("adapter.pretrained_adapter_weights: '" + (root_ / "run1/adapter").string() +
                        "' is not a PEFT adapter folder (no adapter_model.safetensors)"));
  WriteFile(root_ / "run1/adapter/adapter_model.safetensors", "x");
  absl::StatusOr<JobConfig> c = ParseJobConfig(job, options);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->lora.pretrained_adapter_path, (root_ / "run1/adapter").string());
  absl::StatusOr<JobConfig> again = ParseResolvedJobConfig(EmitResolvedJobYaml(*c));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->lora.pretrained_adapter_path, c->lora.pretrained_adapter_path);
}

// trainer.resume_from_checkpoint: a checkpoint folder, relative to the client's folder, comes
// back absolute; a folder without the manifest a complete checkpoint has (a PEFT folder, a
// half-written save) is NOT_FOUND saying where an adapter goes instead; the resolved file keeps it.
TEST_F(ConfigHfModelPathTest, ResumeCheckpointResolvesOrIsNamed) {
  const fs::path model = root_ / "model";
  WriteFile(model / "config.json", "{}");
  WriteFile(root_ / "train.jsonl", "{}\n");
  WriteFile(root_ / "run1/step-40/adapter/adapter_config.json", "{}");
  ParseOptions options;
  options.hf_hub_cache = cache_.string();
  options.base_dir = root_.string();
  const std::string job = absl::StrCat("base_model: ", model.string(), "\ndataset: train.jsonl\n",
                                       "adapter: {type: lora}\ntrainer: {resume_from_checkpoint: run1/step-40}\n");
  absl::StatusOr<JobConfig> missing = ParseJobConfig(job, options);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("trainer.resume_from_checkpoint: '" + (root_ / "run1/step-40").string() +
                        "' is not a complete checkpoint of this service (no manifest.json); a PEFT "
                        "adapter folder goes in adapter.pretrained_adapter_weights"));
  WriteFile(root_ / "run1/step-40/manifest.json", "{}");
  absl::StatusOr<JobConfig> c = ParseJobConfig(job, options);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->trainer.resume_from_checkpoint, (root_ / "run1/step-40").string());
  absl::StatusOr<JobConfig> again = ParseResolvedJobConfig(EmitResolvedJobYaml(*c));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->trainer.resume_from_checkpoint, c->trainer.resume_from_checkpoint);
}

// A dataset named by a folder that Hugging Face `datasets` wrote becomes its Arrow files: those
// state.json lists (save_to_disk), a DatasetDict's splits, or a cache folder's files of the
// role's split; any other folder is INVALID_ARGUMENT saying what a datasets folder holds.
TEST_F(ConfigHfModelPathTest, ADatasetsFolderBecomesItsArrowFiles) {
  const fs::path model = root_ / "model";
  WriteFile(model / "config.json", "{}");
  WriteFile(root_ / "saved/state.json", R"({"_data_files": [{"filename": "b.arrow"}, {"filename": "a.arrow"}]})");
  WriteFile(root_ / "cache/alpaca-train-00000-of-00002.arrow", "x");
  WriteFile(root_ / "cache/alpaca-train-00001-of-00002.arrow", "x");
  WriteFile(root_ / "cache/alpaca-validation.arrow", "x");
  WriteFile(root_ / "empty/readme.txt", "x");
  WriteFile(root_ / "dict/dataset_dict.json", R"({"splits": ["train", "validation"]})");
  WriteFile(root_ / "dict/train/state.json", R"({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]})");
  WriteFile(root_ / "dict/validation/state.json", R"({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]})");
  ParseOptions options;
  options.hf_hub_cache = cache_.string();
  options.base_dir = root_.string();
  auto parse = [&](const std::string& dataset, const std::string& validation) {
    return ParseJobConfig(absl::StrCat("base_model: ", model.string(), "\nadapter: {type: lora}\ndataset: ",
                                       dataset, validation.empty() ? "" : "\nvalidation_dataset: ", validation, "\n"),
                          options);
  };
  absl::StatusOr<JobConfig> saved = parse("saved", "");
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->data.train_path, (root_ / "saved/b.arrow").string() + "," + (root_ / "saved/a.arrow").string());
  absl::StatusOr<JobConfig> cached = parse("cache", "cache");
  ASSERT_TRUE(cached.ok()) << cached.status();
  EXPECT_EQ(cached->data.train_path, (root_ / "cache/alpaca-train-00000-of-00002.arrow").string() + "," +
                                         (root_ / "cache/alpaca-train-00001-of-00002.arrow").string());
  EXPECT_EQ(cached->data.validation_path, (root_ / "cache/alpaca-validation.arrow").string());
  // A DatasetDict: its train split trains and, with nothing else named, its validation split validates.
  absl::StatusOr<JobConfig> dict = parse("dict", "");
  ASSERT_TRUE(dict.ok()) << dict.status();
  EXPECT_EQ(dict->data.train_path, (root_ / "dict/train/data-00000-of-00001.arrow").string());
  EXPECT_EQ(dict->data.validation_path, (root_ / "dict/validation/data-00000-of-00001.arrow").string());
  absl::StatusOr<JobConfig> other = parse("empty", "");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(other.status().message(), HasSubstr("' is a folder, not a regular file, nor a folder that Hugging Face"));
}

TEST_F(ConfigHfModelPathTest, ParseModelNotInCacheIsFailedPreconditionWithLine) {
  absl::StatusOr<JobConfig> c = Parse("org/absent", Dataset());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(c.status().message(), HasSubstr("job.yaml:1: base_model 'org/absent' is neither"));
  EXPECT_THAT(c.status().message(), HasSubstr("hf download org/absent"));
}

TEST_F(ConfigHfModelPathTest, ParseWithoutCheckPathsKeepsPathsAsWritten) {
  ParseOptions options;
  options.check_paths = false;
  options.hf_hub_cache = cache_.string();
  absl::StatusOr<JobConfig> c = ParseJobConfig(
      "base_model: org/absent\nadapter: {type: lora}\ndataset: rel/train.jsonl\n", options);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->base_model_path, "org/absent");
  EXPECT_EQ(c->data.train_path, "rel/train.jsonl");
}

TEST_F(ConfigHfModelPathTest, WrittenBaseModelPathIsCheckedAndKept) {
  const fs::path model = root_ / "resolved";
  WriteFile(model / "config.json", "{}");
  ParseOptions options;
  options.hf_hub_cache = cache_.string();
  options.dataset_override = Dataset();
  absl::StatusOr<JobConfig> c = ParseJobConfig(
      absl::StrCat("base_model: org/absent\nbase_model_path: ", model.string(),
                   "\nadapter: {type: lora}\n"),
      options);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->base_model_path, model.string());
}

}  // namespace
}  // namespace qlora
