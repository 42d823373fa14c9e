// One rank's data path for one epoch: its shards -> records -> (split filter) -> bounded
// shuffle -> examples -> micro-batches, streaming in memory bounded by the shuffle buffer and
// one micro-batch, never by the files.
//
// Record interleaving (shard_planner.h): every rank reads the same shards in the same order
// (a permutation per (seed, epoch), shared by the ranks) and keeps the records whose running
// index among its split's records is its phase modulo the stride, so the ranks' record counts
// differ by at most one. The index runs on from shard to shard (ReaderOptions::first_index).
//
// Determinism: for a (seed, epoch), the shard order is fixed, and for a (seed, epoch, rank) the
// shuffle buffer's draws, so an epoch replays exactly; another epoch gets another order.
// Validation split (validation_fraction without a validation file): a record belongs to the
// validation set when a hash of (path, byte offset, seed) falls below the fraction; the same
// on every rank and in every epoch, independent of sharding; with test_fraction, the next band
// of the same draw is held out (read by no role). The split filter runs in the reader before
// interleaving, so each rank gets an equal share of each split.
//
// Equal steps on every rank: PlanEpoch takes every rank's micro-batch count for the epoch
// (CountMicroBatches: a streaming pass with the same order) and gives each rank
// floor(min_count / gradient_accumulation_steps) optimizer steps; the micro-batches beyond
// that are left over for this epoch (counted per rank; with shuffling a different tail is
// left each epoch). With interleaved records that tail is at most about one micro-batch.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/batcher.h"
#include "worker/data/example_builder.h"
#include "common/dataset/record_reader.h"
#include "worker/data/shuffle.h"
#include "worker/data/tokenizer.h"

namespace qlora::data {

enum class SplitRole { kAll, kTrain, kValidation };

struct LoaderOptions {
  ReaderOptions reader;        // format, malformed-record policy, record size bound
  ExampleOptions example;      // layout, columns, template, max_sequence_length
  BatchOptions batch;          // rows, seq_len, packing, pad id
  uint64_t seed = 42;          // trainer.seed
  int rank = 0;
  bool shuffle = true;         // false for evaluation
  size_t shuffle_buffer_records = 8192;
  SplitRole split = SplitRole::kAll;
  double validation_fraction = 0.0;
  double test_fraction = 0.0;  // held out after the validation band: never read
};

struct LoaderStats {
  int64_t records = 0;             // records of this rank's share of its split, malformed included
  int64_t malformed_records = 0;   // skipped under the "skip" policy
  std::vector<std::string> malformed_messages;  // the first few
  ExampleStats examples;
  int64_t micro_batches = 0;
  int64_t tokens = 0;              // non-padding tokens in micro-batches
  int64_t label_tokens = 0;
};

class DataLoader {
 public:
  // `tokenizer` must outlive the loader; one tokenizer may serve several loaders (its Encode
  // is const and re-entrant).
  static absl::StatusOr<std::unique_ptr<DataLoader>> Create(std::vector<ShardSpec> shards,
                                                            const Tokenizer* tokenizer,
                                                            const LoaderOptions& options);

  // Rewinds to the start of `epoch` (stats are per epoch).
  absl::Status StartEpoch(int64_t epoch);
  // The next micro-batch, nullopt at the end of the epoch.
  absl::StatusOr<std::optional<MicroBatch>> Next();

  const LoaderStats& stats() const { return stats_; }

 private:
  DataLoader(std::vector<ShardSpec> shards, const Tokenizer* tokenizer,
             const LoaderOptions& options, ExampleBuilder builder);
  // The next record of this rank's split in shard order; false at the end.
  absl::StatusOr<bool> NextRecord(Record* record);
  // The next record after shuffling; false at the end.
  absl::StatusOr<bool> NextShuffled(Record* record);
  absl::Status Malformed(const Record& record, const absl::Status& reason);
  bool InSplit(const std::string& path, int64_t record_offset) const;
  void CloseReader();

  std::vector<ShardSpec> shards_;
  const Tokenizer* tokenizer_;
  LoaderOptions options_;
  ExampleBuilder builder_;
  std::vector<size_t> order_;
  size_t next_shard_ = 0;
  int64_t next_index_ = 0;  // interleaving index at the start of the next shard
  std::unique_ptr<RecordReader> reader_;
  Rng rng_{0};
  ShuffleBuffer<Record> buffer_{1, &rng_};
  bool source_done_ = false;
  std::optional<Batcher> batcher_;
  bool flushed_ = false;
  LoaderStats stats_;
};

// What one rank's epoch holds, from a counting pass.
struct EpochCount {
  int64_t micro_batches = 0;
  int64_t records = 0;         // this rank's share of its split, malformed included
  int64_t examples = 0;        // examples in the micro-batches (records that became one)
  int64_t malformed = 0;       // skipped as malformed (the "skip" policy)
  int64_t without_target = 0;  // dropped: nothing left to learn after truncation
};

// Runs `loader` through `epoch` and counts it (a streaming pass).
absl::StatusOr<EpochCount> CountMicroBatches(DataLoader& loader, int64_t epoch);

struct EpochPlan {
  int64_t optimizer_steps = 0;           // the same on every rank
  int64_t micro_batches_per_rank = 0;    // optimizer_steps * gradient_accumulation_steps
  std::vector<int64_t> dropped_micro_batches;  // per rank
};
absl::StatusOr<EpochPlan> PlanEpoch(const std::vector<int64_t>& micro_batches_per_rank,
                                    int gradient_accumulation_steps);

}  // namespace qlora::data
