// The Arrow files of a Hugging Face datasets folder (see hf_dataset_folder.h).
#include "common/config/hf_dataset_folder.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace qlora {
namespace {

namespace fs = std::filesystem;

const char* SplitName(DatasetRoleSplit role) { return role == DatasetRoleSplit::kTrain ? "train" : "validation"; }

// A cache file of `split`: <name>-<split>.arrow or <name>-<split>-NNNNN-of-NNNNN.arrow.
bool IsOfSplit(const std::string& file_name, const char* split) {
  const std::string mark = absl::StrCat("-", split);
  return absl::StrContains(file_name, absl::StrCat(mark, ".arrow")) || absl::StrContains(file_name, absl::StrCat(mark, "-"));
}

// state.json's `_data_files`: [{"filename": "data-00000-of-00001.arrow"}, ...] (JSON is YAML).
absl::StatusOr<std::vector<std::string>> StateFiles(const fs::path& folder) {
  const fs::path state = folder / "state.json";
  std::vector<std::string> files;
  try {
    const YAML::Node root = YAML::LoadFile(state.string());
    const YAML::Node list = root["_data_files"];
    if (!list.IsSequence() || list.size() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(state.string(), ": no _data_files list"));
    }
    for (const YAML::Node& entry : list) {
      const std::string name = entry["filename"].as<std::string>("");
      if (name.empty() || absl::StrContains(name, "/") || name == "..") {
        return absl::InvalidArgumentError(
            absl::StrCat(state.string(), ": '", name, "' is not a file name in that folder"));
      }
      files.push_back((folder / name).string());
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(state.string(), ": not readable JSON: ", e.what()));
  }
  return files;
}

}  // namespace

absl::StatusOr<std::string> HfDatasetFolderFiles(const std::string& folder_path, DatasetRoleSplit role) {
  fs::path folder(folder_path);
  std::error_code ec;
  if (fs::is_regular_file(folder / "dataset_dict.json", ec)) {
    const fs::path split = folder / SplitName(role);
    if (!fs::is_directory(split, ec)) {
      std::vector<std::string> splits;
      for (const auto& entry : fs::directory_iterator(folder, ec)) {
        if (entry.is_directory(ec)) splits.push_back(entry.path().filename().string());
      }
      std::sort(splits.begin(), splits.end());
      return absl::NotFoundError(absl::StrCat(
          "the DatasetDict folder '", folder_path, "' has no '", SplitName(role), "' split (it has: ",
          absl::StrJoin(splits, ", "), "); name the split's folder itself"));
    }
    folder = split;
  }
  if (fs::is_regular_file(folder / "state.json", ec)) {
    absl::StatusOr<std::vector<std::string>> files = StateFiles(folder);
    if (!files.ok()) return files.status();
    return absl::StrJoin(*files, ",");
  }
  std::vector<std::string> all, of_split;
  bool any_split = false;
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    const std::string name = entry.path().filename().string();
    if (!absl::EndsWith(name, ".arrow") || !entry.is_regular_file(ec)) continue;
    all.push_back(entry.path().string());
    for (const char* split : {"train", "validation", "test"}) any_split = any_split || IsOfSplit(name, split);
    if (IsOfSplit(name, SplitName(role))) of_split.push_back(entry.path().string());
  }
  std::vector<std::string>& files = any_split ? of_split : all;
  if (files.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", folder.string(), "' is a folder, not a regular file, nor a folder that Hugging Face "
        "`datasets` wrote: no state.json, no dataset_dict.json and no ",
        any_split ? absl::StrCat("'", SplitName(role), "' split's ") : "",
        ".arrow files (name a data file, or a folder saved with save_to_disk)"));
  }
  std::sort(files.begin(), files.end());
  return absl::StrJoin(files, ",");
}

}  // namespace qlora
