// Resolves tensor names to (possibly sharded) safetensors files of a model folder.
#include "common/safetensors/checkpoint_files.h"

#include <unistd.h>

#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace qlora::safetensors {
namespace {

// POSIX rather than std::filesystem: libtorch.so exports its own, partly broken, copies of
// std::filesystem symbols, and this library is linked beside it.
std::string Join(const std::string& dir, const std::string& name) {
  return dir.empty() ? name : dir + "/" + name;
}

bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

}  // namespace

absl::StatusOr<CheckpointFiles> CheckpointFiles::Open(const std::string& dir) {
  const std::string index_path = Join(dir, kIndexFileName);
  if (!Exists(index_path)) {
    const std::string single = Join(dir, kSingleFileName);
    if (!Exists(single)) {
      return absl::NotFoundError(absl::StrCat("no ", kSingleFileName, " or ", kIndexFileName,
                                              " in ", dir));
    }
    return OpenFile(single);
  }

  std::ifstream in(index_path);
  std::stringstream text;
  text << in.rdbuf();
  const auto json = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  const std::string& where = index_path;
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": not a JSON object"));
  }
  if (!json.contains("weight_map") || !json["weight_map"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": no \"weight_map\" object"));
  }
  CheckpointFiles files;
  files.dir_ = dir;
  for (const auto& [name, shard] : json["weight_map"].items()) {
    if (!shard.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": weight_map[\"", name, "\"] is not a file name"));
    }
    const std::string shard_name = shard.get<std::string>();
    if (shard_name.find('/') != std::string::npos || shard_name == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": shard \"", shard_name, "\" is not a plain file name"));
    }
    files.shard_of_[name] = shard_name;
  }
  // Every shard must exist and hold exactly the tensors the index assigns to it.
  std::map<std::string, std::set<std::string>> expected;
  for (const auto& [name, shard] : files.shard_of_) expected[shard].insert(name);
  for (const auto& [shard, names] : expected) {
    QLORA_ASSIGN_OR_RETURN(SafetensorsFile * file, files.Shard(*names.begin()));
    for (const auto& [name, info] : file->tensors()) {
      if (!names.count(name)) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": shard ", shard, " holds \"", name, "\", which the index does not map to it"));
      }
    }
    for (const std::string& name : names) {
      if (!file->Contains(name)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": index maps \"", name, "\" to ", shard, ", which lacks it"));
      }
    }
  }
  return files;
}

absl::StatusOr<CheckpointFiles> CheckpointFiles::OpenFile(const std::string& path) {
  QLORA_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path));
  CheckpointFiles files;
  const size_t slash = path.rfind('/');
  files.dir_ = slash == std::string::npos ? "" : path.substr(0, slash);
  const std::string shard = slash == std::string::npos ? path : path.substr(slash + 1);
  for (const auto& [name, info] : file->tensors()) files.shard_of_[name] = shard;
  files.open_[shard] = std::move(file);
  return files;
}

std::vector<std::string> CheckpointFiles::Names() const {
  std::vector<std::string> names;
  names.reserve(shard_of_.size());
  for (const auto& [name, shard] : shard_of_) names.push_back(name);
  return names;
}

absl::StatusOr<SafetensorsFile*> CheckpointFiles::Shard(const std::string& name) {
  auto it = shard_of_.find(name);
  if (it == shard_of_.end()) {
    return absl::NotFoundError(absl::StrCat("tensor \"", name, "\" not in checkpoint ", dir_));
  }
  auto open = open_.find(it->second);
  if (open == open_.end()) {
    QLORA_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                           SafetensorsFile::Open(Join(dir_, it->second)));
    open = open_.emplace(it->second, std::move(file)).first;
  }
  return open->second.get();
}

absl::StatusOr<TensorInfo> CheckpointFiles::Info(const std::string& name) {
  QLORA_ASSIGN_OR_RETURN(SafetensorsFile * file, Shard(name));
  return file->tensors().at(name);
}

absl::StatusOr<TensorView> CheckpointFiles::Get(const std::string& name) {
  QLORA_ASSIGN_OR_RETURN(SafetensorsFile * file, Shard(name));
  return file->Get(name);
}

void CheckpointFiles::Evict(const std::string& name, const TensorView& view) {
  auto it = shard_of_.find(name);
  if (it == shard_of_.end()) return;
  auto open = open_.find(it->second);
  if (open != open_.end()) open->second->Evict(view);
}

}  // namespace qlora::safetensors
