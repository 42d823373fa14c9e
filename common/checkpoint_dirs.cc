// Checkpoint folder names and the latest complete one (see checkpoint_dirs.h).
#include "common/checkpoint_dirs.h"

#include <dirent.h>
#include <sys/stat.h>

#include <cinttypes>
#include <cstdio>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/posix_files.h"
#include "common/status_macros.h"

namespace qlora {

std::string CheckpointsDir(const std::string& output_dir, const std::string& job_id, const std::string& job_uid) {
  return job_uid.empty() ? absl::StrCat(output_dir, "/checkpoints/", job_id)
                         : absl::StrCat(output_dir, "/checkpoints/", job_id, "-", job_uid);
}

std::string CheckpointDir(const std::string& checkpoints_dir, int64_t step) {
  return absl::StrCat(checkpoints_dir, "/step-", step);
}

int64_t StepOfCheckpoint(const std::string& checkpoint_dir) {
  const size_t slash = checkpoint_dir.find_last_of('/');
  const std::string name = slash == std::string::npos ? checkpoint_dir : checkpoint_dir.substr(slash + 1);
  int64_t step = 0;
  char tail = 0;
  return sscanf(name.c_str(), "step-%" SCNd64 "%c", &step, &tail) == 1 && step >= 0 ? step : -1;
}

namespace {

struct CheckpointEntry {
  int64_t step;
  std::string path;
  bool complete;  // its manifest.json exists
};

// Every step-N folder under `checkpoints_dir`, by step.
std::vector<CheckpointEntry> ListCheckpoints(const std::string& checkpoints_dir) {
  std::vector<CheckpointEntry> out;
  DIR* d = opendir(checkpoints_dir.c_str());
  if (d == nullptr) return out;
  while (const dirent* entry = readdir(d)) {
    int64_t step = 0;
    char tail = 0;
    if (sscanf(entry->d_name, "step-%" SCNd64 "%c", &step, &tail) != 1) continue;
    const std::string path = absl::StrCat(checkpoints_dir, "/", entry->d_name);
    struct stat st;
    out.push_back({step, path, stat((path + "/manifest.json").c_str(), &st) == 0});
  }
  closedir(d);
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return out;
}

}  // namespace

std::string LatestCheckpoint(const std::string& checkpoints_dir) {
  std::string best;
  for (const CheckpointEntry& e : ListCheckpoints(checkpoints_dir)) {
    if (e.complete) best = e.path;
  }
  return best;
}

absl::Status PruneCheckpoints(const std::string& checkpoints_dir, int keep) {
  const std::vector<CheckpointEntry> all = ListCheckpoints(checkpoints_dir);
  std::vector<const CheckpointEntry*> complete;
  for (const CheckpointEntry& e : all) {
    if (e.complete) complete.push_back(&e);
  }
  if (complete.empty()) return absl::OkStatus();
  const int64_t newest = complete.back()->step;
  const int64_t oldest_kept =
      keep <= 0 || static_cast<int>(complete.size()) <= keep ? complete.front()->step
                                                              : complete[complete.size() - keep]->step;
  for (const CheckpointEntry& e : all) {
    const bool stale = e.complete ? e.step < oldest_kept : e.step < newest;
    if (stale) QLORA_RETURN_IF_ERROR(RemoveTree(e.path));
  }
  return absl::OkStatus();
}

}  // namespace qlora
