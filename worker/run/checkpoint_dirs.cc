// Checkpoint folder names and the latest complete one (see checkpoint_dirs.h).
#include "worker/run/checkpoint_dirs.h"

#include <dirent.h>
#include <sys/stat.h>

#include <cinttypes>
#include <cstdio>

#include "absl/strings/str_cat.h"

namespace qlora::worker {

std::string CheckpointsDir(const std::string& output_dir, const std::string& job_id, const std::string& job_uid) {
  return job_uid.empty() ? absl::StrCat(output_dir, "/checkpoints/", job_id)
                         : absl::StrCat(output_dir, "/checkpoints/", job_id, "-", job_uid);
}

std::string CheckpointDir(const std::string& checkpoints_dir, int64_t step) {
  return absl::StrCat(checkpoints_dir, "/step-", step);
}

std::string LatestCheckpoint(const std::string& checkpoints_dir) {
  std::string best;
  int64_t best_step = -1;
  DIR* d = opendir(checkpoints_dir.c_str());
  if (d == nullptr) return best;
  while (const dirent* entry = readdir(d)) {
    int64_t step = 0;
    char tail = 0;
    if (sscanf(entry->d_name, "step-%" SCNd64 "%c", &step, &tail) != 1) continue;
    const std::string path = absl::StrCat(checkpoints_dir, "/", entry->d_name);
    struct stat st;
    if (stat((path + "/manifest.json").c_str(), &st) != 0) continue;
    if (step > best_step) {
      best_step = step;
      best = path;
    }
  }
  closedir(d);
  return best;
}

}  // namespace qlora::worker
