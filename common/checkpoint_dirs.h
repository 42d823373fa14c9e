// Where a job's checkpoints live and which one a run resumes from. A checkpoint is the folder
// <output_dir>/checkpoints/<job id>-<job uid>/step-<N>; it is complete once the strategy wrote
// its manifest.json (written last). Scoped by the job's id and its random uid: another job, even
// one given the same id after a state folder was lost, never resumes from it on its own; a job
// continues another's only when told to (trainer.resume_from_checkpoint). POSIX only (no
// std::filesystem beside libtorch). Torch-free.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace qlora {

// <output_dir>/checkpoints/<job_id>-<job_uid> (<job_id> alone for jobs stored before uids).
std::string CheckpointsDir(const std::string& output_dir, const std::string& job_id, const std::string& job_uid);
// Inside a checkpoint, beside the ZeRO shards that an exact resume reads: the adapter of that
// step as a PEFT folder (what peft's PeftModel.from_pretrained loads), written by rank 0 once
// the shards are complete.
inline constexpr char kCheckpointAdapterDir[] = "adapter";

// <checkpoints_dir>/step-<step>
std::string CheckpointDir(const std::string& checkpoints_dir, int64_t step);
// The step a checkpoint folder (<checkpoints_dir>/step-<N>) holds, or -1 for another name.
int64_t StepOfCheckpoint(const std::string& checkpoint_dir);
// The complete checkpoint with the highest step under `checkpoints_dir`, or "" when none.
std::string LatestCheckpoint(const std::string& checkpoints_dir);
// Keeps the `keep` newest complete checkpoints (0 = all) and removes the older ones, and every
// incomplete one (no manifest: a save that a crash cut short) older than the newest complete.
// Called by rank 0 once a save has completed on every rank.
absl::Status PruneCheckpoints(const std::string& checkpoints_dir, int keep);

}  // namespace qlora
