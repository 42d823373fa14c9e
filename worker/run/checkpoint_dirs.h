// Where a job's checkpoints live and which one a run resumes from. A checkpoint is the folder
// <output_dir>/checkpoints/<job id>/step-<N>; it is complete once the strategy wrote its
// manifest.json (written last). Scoped by job id: another job writing to the same output_dir
// never resumes from it. POSIX only (no std::filesystem beside libtorch). Torch-free.
#pragma once

#include <cstdint>
#include <string>

namespace qlora::worker {

// <output_dir>/checkpoints/<job_id>
std::string CheckpointsDir(const std::string& output_dir, const std::string& job_id);
// <checkpoints_dir>/step-<step>
std::string CheckpointDir(const std::string& checkpoints_dir, int64_t step);
// The complete checkpoint with the highest step under `checkpoints_dir`, or "" when none.
std::string LatestCheckpoint(const std::string& checkpoints_dir);

}  // namespace qlora::worker
