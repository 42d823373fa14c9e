// The training data as optimizer steps: each Next() is one step's gradient_accumulation_steps
// micro-batches of this rank, in epochs of the same number of steps on every rank (the rank with
// the fewest micro-batches sets an epoch's length: data::PlanEpoch; the others leave the rest of
// their share for that epoch, a different tail each epoch as the shuffle changes). Skip(n)
// replays the first n steps exactly, so a resumed run sees what an uninterrupted one would.
// Counts what became of this rank's records (trained, left over, malformed, without a target)
// per epoch and in all; a replay by Skip counts as trained (it was, before the checkpoint).
// Collective (planning an epoch counts every rank's micro-batches). Torch side.
//
// Next() reads the following step's micro-batches ahead, on a thread of its own, while the
// caller trains on the ones it returned (reading and tokenizing are host work that otherwise
// leaves the GPU idle between steps).
// The read-ahead's host-to-device copies are non-blocking from pinned memory (micro_batches.cc):
// a blocking copy would wait for every kernel the caller has queued meanwhile.
// Only within an epoch: planning the next one is a collective and stays on the caller's thread.
// The source is touched by one thread at a time (Next waits for the read-ahead first).
#pragma once

#include <cstdint>
#include <future>
#include <vector>

#include <c10/core/Device.h>

#include "absl/status/statusor.h"
#include "common/worker_protocol.h"
#include "worker/comm/communicator.h"
#include "worker/run/micro_batches.h"

namespace qlora::worker {

class StepBatches {
 public:
  // Plans epoch 0. `source` and `comm` must outlive this object.
  static absl::StatusOr<StepBatches> Start(MicroBatchSource* source, comm::Communicator* comm,
                                           const at::Device& device, int accumulation,
                                           int micro_batch_rows);

  StepBatches(StepBatches&&) = default;
  StepBatches& operator=(StepBatches&&) = delete;
  ~StepBatches();  // waits for a read-ahead still running

  int64_t steps_per_first_epoch() const { return first_epoch_steps_; }
  int epoch() const { return epoch_; }  // of the step Next() returned last
  // Whether the step Next() returned last was its epoch's last.
  bool epoch_finished() const { return in_epoch_ == epoch_steps_; }
  // This rank's records of epoch() so far (left_over once it is finished), and of all epochs.
  const RecordCounts& epoch_records() const { return epoch_records_; }
  RecordCounts total_records() const;

  // The next step's micro-batches (a new epoch starts when the current one's steps are done).
  absl::StatusOr<std::vector<DeviceBatch>> Next();
  // Draws and drops the next `steps` steps.
  absl::Status Skip(int64_t steps);

 private:
  StepBatches(MicroBatchSource* source, comm::Communicator* comm, const at::Device& device,
              int accumulation, int micro_batch_rows)
      : source_(source), comm_(comm), device_(device), accumulation_(accumulation),
        rows_(micro_batch_rows) {}
  // Optimizer steps of `epoch` (the same on every rank), and rewinds the source to its start.
  absl::StatusOr<int64_t> PlanEpoch(int epoch);

  MicroBatchSource* source_;
  comm::Communicator* comm_;
  at::Device device_;
  int accumulation_;
  int rows_;
  int epoch_ = 0;
  int64_t epoch_steps_ = 0;     // planned steps of the current epoch
  int64_t in_epoch_ = 0;        // steps taken in it
  int64_t first_epoch_steps_ = 0;
  int64_t epoch_examples_ = 0;      // examples in the current epoch (its counting pass)
  RecordCounts epoch_records_;
  RecordCounts earlier_records_;    // of the epochs before the current one
  // The next step's micro-batches being read (valid only within an epoch).
  std::future<absl::StatusOr<std::vector<DeviceBatch>>> ahead_;
};

}  // namespace qlora::worker
