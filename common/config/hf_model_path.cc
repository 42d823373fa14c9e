// Offline resolution of base_model to a local Hugging Face model folder.
#include "common/config/hf_model_path.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace qlora {
namespace fs = std::filesystem;
namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

bool HasConfigJson(const fs::path& folder) {
  std::error_code ec;
  return fs::is_regular_file(folder / "config.json", ec);
}

std::string Absolute(const fs::path& path) {
  std::error_code ec;
  fs::path absolute = fs::absolute(path, ec);
  return (ec ? path : absolute).lexically_normal().string();
}

// The snapshot refs/main points at, when it holds config.json.
fs::path SnapshotFromRefsMain(const fs::path& repo_dir) {
  std::ifstream ref(repo_dir / "refs" / "main");
  std::string hash;
  if (!ref || !std::getline(ref, hash)) return {};
  hash = std::string(absl::StripAsciiWhitespace(hash));
  if (hash.empty() || hash.find('/') != std::string::npos) return {};
  const fs::path snapshot = repo_dir / "snapshots" / hash;
  return HasConfigJson(snapshot) ? snapshot : fs::path();
}

// The most recently written snapshot that holds config.json (ties: the larger name).
fs::path NewestCompleteSnapshot(const fs::path& repo_dir) {
  std::error_code ec;
  fs::path best;
  fs::file_time_type best_time;
  for (const fs::directory_entry& entry : fs::directory_iterator(repo_dir / "snapshots", ec)) {
    if (!HasConfigJson(entry.path())) continue;
    const fs::file_time_type time = fs::last_write_time(entry.path() / "config.json", ec);
    if (best.empty() || time > best_time || (time == best_time && entry.path() > best)) {
      best = entry.path();
      best_time = time;
    }
  }
  return best;
}

bool IsRepoIdChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '.' || c == '_' || c == '-';
}

}  // namespace

std::string DefaultHfHubCache() {
  if (std::string v = Env("HF_HUB_CACHE"); !v.empty()) return v;
  if (std::string v = Env("HF_HOME"); !v.empty()) return (fs::path(v) / "hub").string();
  if (std::string v = Env("XDG_CACHE_HOME"); !v.empty()) {
    return (fs::path(v) / "huggingface" / "hub").string();
  }
  return (fs::path(Env("HOME")) / ".cache" / "huggingface" / "hub").string();
}

bool LooksLikeHubRepoId(const std::string& text) {
  const std::vector<std::string> parts = absl::StrSplit(text, '/');
  if (parts.size() > 2) return false;
  for (const std::string& part : parts) {
    if (part.empty() || part.front() == '.' || part.front() == '-' || part.back() == '.' ||
        part.find("..") != std::string::npos) {
      return false;
    }
    for (char c : part) {
      if (!IsRepoIdChar(c)) return false;
    }
  }
  return true;
}

absl::StatusOr<std::string> ResolveBaseModelPath(const std::string& base_model,
                                                 const std::string& hub_cache) {
  fs::path local = base_model;
  if (base_model.rfind("~/", 0) == 0) local = fs::path(Env("HOME")) / base_model.substr(2);
  std::error_code ec;
  if (fs::exists(local, ec)) {
    if (!fs::is_directory(local, ec)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "base_model '", base_model, "' is a file; it must be a model folder with config.json"));
    }
    if (!HasConfigJson(local)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "base_model folder '", Absolute(local), "' has no config.json; it must be a Hugging "
          "Face model folder (config.json, *.safetensors, tokenizer files)"));
    }
    return Absolute(local);
  }
  if (!LooksLikeHubRepoId(base_model)) {
    return absl::NotFoundError(
        absl::StrCat("base_model folder '", Absolute(local), "' does not exist"));
  }
  const fs::path repo_dir =
      fs::path(hub_cache) / absl::StrCat("models--", absl::StrReplaceAll(base_model, {{"/", "--"}}));
  fs::path snapshot = SnapshotFromRefsMain(repo_dir);
  if (snapshot.empty()) snapshot = NewestCompleteSnapshot(repo_dir);
  if (snapshot.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "base_model '", base_model, "' is neither a local folder nor in the Hugging Face cache at ",
        hub_cache, "; download it first (e.g. `hf download ", base_model, "`)"));
  }
  return Absolute(snapshot);
}

}  // namespace qlora
