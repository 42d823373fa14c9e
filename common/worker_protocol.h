// Plain structs that travel between the coordinator and its workers (the gRPC layer maps them
// to proto/qlora/v1/worker_service.proto): a rank's progress, and its assignment. No gRPC or
// torch here, so both the coordinator core and the worker's engine side can use them.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/dataset/record.h"

namespace qlora {

// The environment variable through which the coordinator hands a worker its startup token (never
// argv: /proc/PID/cmdline is world-readable, /proc/PID/environ only by the owner). Single-use:
// the coordinator refuses a second Register with it.
inline constexpr char kWorkerTokenVariable[] = "QLORA_WORKER_TOKEN";
// The coordinator's --state-umask in octal, applied by a worker before it creates anything: a
// worker on a Ray host would otherwise keep that host's umask for its outputs.
inline constexpr char kWorkerUmaskVariable[] = "QLORA_UMASK";

// The end of a run as Hugging Face's Trainer.train() reports it (train_runtime, train_loss,
// train_samples_per_second, train_steps_per_second), plus tokens, peak memory and evaluation.
// Rank 0 reports it; figures cover every rank and only this run (a resumed run counts from the
// checkpoint it resumed), from its first phase up to its outputs being written.
struct TrainSummary {
  double train_runtime_seconds = 0;
  double train_loss = std::nan("");        // mean of this run's step losses (NaN: no step ran)
  double final_train_loss = std::nan("");  // the last step's
  int64_t steps = 0;                       // optimizer steps this run took
  int64_t global_step = 0;                 // optimizer steps done in all, resumed ones included
  int64_t samples = 0;                     // rows trained on (a packed row counts once), all ranks
  int64_t tokens = 0;                      // non-padding input tokens trained on, all ranks
  double train_samples_per_second = 0;
  double train_steps_per_second = 0;
  double tokens_per_second = 0;
  // The largest over ranks: the CUDA allocator's peak on GPUs, the peak resident set on CPUs.
  int64_t peak_memory_bytes = 0;
  double eval_loss = std::nan("");         // the last evaluation's (NaN: none)
  double best_eval_loss = std::nan("");    // the lowest evaluation loss (NaN: none)
};

// How a rank's run ended, as the rank reports it.
struct WorkerCompletion {
  bool ok = false;
  std::string error;                 // when !ok
  // When !ok: whether running again from the last checkpoint may succeed (a collective that
  // failed or timed out, a lost peer, out of memory, an I/O error) as opposed to a mistake in
  // the job (a bad file or setting) that would fail the same way again.
  bool retryable = false;
  std::string adapter_path;          // rank 0, when ok
  std::string merged_path;           // rank 0, when ok and a merge was asked
  std::optional<TrainSummary> summary;  // rank 0, when ok
};

// The completion a rank reports for a run that ended with `status` (not OK). Retryable unless
// the code says the job itself is wrong (INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION,
// PERMISSION_DENIED, OUT_OF_RANGE, UNIMPLEMENTED): those would fail the same way again. So would
// running out of memory (RESOURCE_EXHAUSTED) before the run's first step (`stepped` false): a
// restart of the same job from the same checkpoint asks for the same memory.
inline WorkerCompletion FailedCompletion(const absl::Status& status, bool stepped = true) {
  WorkerCompletion c;
  c.error = std::string(status.message());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kUnimplemented: c.retryable = false; break;
    case absl::StatusCode::kResourceExhausted:
      c.retryable = stepped;
      if (!stepped) {
        c.error += " (before the first step, so a restart would run out the same way: lower "
                   "trainer.batch_size or data.max_sequence_length, or set "
                   "enable_gradient_checkpointing: true)";
      }
      break;
    default: c.retryable = true;
  }
  return c;
}

struct MemorySnapshot {
  int64_t device_allocated_bytes = 0;
  int64_t device_peak_bytes = 0;
  int64_t master_weight_bytes = 0;   // held by the ZeRO strategy on this rank
  int64_t optimizer_state_bytes = 0;
  int64_t gradient_bytes = 0;
  int64_t comm_buffer_bytes = 0;
  int64_t host_rss_bytes = 0;
  int64_t device_reserved_peak_bytes = 0;  // the caching allocator's peak reservation
  int64_t host_peak_rss_bytes = 0;  // the largest resident set so far (getrusage), loading too
};

// The data-parallel strategy a rank actually runs (what its strategy object says of itself, not
// what the job file asked for).
struct StrategySnapshot {
  int zero_stage = -1;               // -1: not reported
  int world_size = 0;
  int64_t trainable_elements = 0;    // every trainable (LoRA) parameter element
  int64_t partition_elements = 0;    // elements this rank keeps fp32 master + AdamW state for
  bool partitioned_optimizer = false;
  bool partitioned_gradients = false;
  // The base weights (v1::StrategyReport says what each is); the byte counts and the wait are
  // the reported step's.
  bool partitioned_base_weights = false;
  bool base_weights_in_host_memory = false;
  int64_t base_weight_gathered_bytes = 0;
  int64_t base_weight_copied_bytes = 0;
  double base_weight_wait_seconds = 0;
};

// The activation checkpointing a rank runs (trainer.enable_gradient_checkpointing): its split
// of the decoder layers and, with auto, the plan behind it.
struct CheckpointingReport {
  int64_t checkpointed_layers = -1;  // -1: not reported; the first ones are checkpointed
  int64_t layers = 0;
  int64_t planned_peak_bytes = 0;    // auto with a budget: the plan's peak (0 otherwise)
  int64_t budget_bytes = 0;          // auto: trainer.max_memory_gib or the GPU's free memory
  int64_t measured_peak_bytes = 0;   // auto on a GPU: the largest peak the first steps set
  int64_t offloaded_layers = 0;      // layers whose saved tensors wait in host memory
  int64_t dequantized_layers = 0;    // layers whose 4-bit weights are kept dequantized
};

// What became of a rank's records (its share of the training split). Each read record is
// trained, left over, malformed or without a target.
struct RecordCounts {
  int64_t trained = 0;         // in the micro-batches of the optimizer steps taken
  int64_t left_over = 0;       // beyond a finished epoch's planned steps (the shortest rank's)
  int64_t malformed = 0;       // skipped as malformed (data.malformed_records: skip)
  int64_t without_target = 0;  // nothing left to learn after truncation
};

struct ProgressSnapshot {
  int rank = 0;
  int64_t step = 0;                  // optimizer steps done
  int64_t total_steps = 0;
  int epoch = 0;
  double loss = 0;
  double learning_rate = 0;
  double tokens_per_second = 0;      // this rank
  double eval_loss = 0;              // NaN until evaluated
  double elapsed_seconds = 0;
  MemorySnapshot memory;
  StrategySnapshot strategy;
  // This rank's records: of `epoch` so far (malformed and without_target for the whole epoch,
  // left_over once its last step is done), and of every epoch up to this step.
  RecordCounts epoch_records;
  RecordCounts total_records;
  CheckpointingReport checkpointing;
  std::vector<std::string> notices;  // warnings since the last report
  // The objective's metrics of this step (preference tuning: TRL's names, rewards/chosen, ...),
  // and after an evaluation the same of the validation data, prefixed eval_.
  std::vector<std::pair<std::string, double>> metrics;
};

// Where a worker computes. On the wire (Assignment.device): "cuda" or "cpu".
enum class DeviceKind { kCpu, kCuda };

// What one worker needs to start training (WorkerService.GetAssignment).
struct WorkerAssignment {
  std::string job_id;
  // Random, unique per job and never reused (job ids can be, when a state folder is lost):
  // a checkpoint is resumed only by the job whose uid it carries. "" for jobs stored before.
  std::string job_uid;
  int rank = 0;
  int world_size = 1;
  DeviceKind device = DeviceKind::kCpu;
  std::string resolved_config_yaml;
  std::vector<data::ShardSpec> train_shards;
  std::vector<data::ShardSpec> validation_shards;
  std::string nccl_unique_id;        // bytes of ncclUniqueId (GPU jobs)
  int64_t generation = 0;            // rendezvous generation: store keys are scoped to it
  std::string output_dir;
};

}  // namespace qlora
