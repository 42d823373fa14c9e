// One rank's data path for one epoch: its shards -> records -> (split filter) -> bounded
// shuffle -> examples -> micro-batches, streaming in memory bounded by the shuffle buffer and
// one micro-batch, never by the files.
//
// Determinism: for a (seed, epoch, rank), the shard order (a permutation) and the shuffle
// buffer's draws are fixed, so an epoch replays exactly; another epoch gets another order.
// Validation split (validation_fraction without a validation file): a record belongs to the
// validation set when a hash of (path, byte offset, seed) falls below the fraction; the same
// on every rank and in every epoch, independent of sharding.
//
// Equal steps on every rank: PlanEpoch takes every rank's micro-batch count for the epoch
// (CountMicroBatches: a streaming pass with the same order) and gives each rank
// floor(min_count / gradient_accumulation_steps) optimizer steps; the micro-batches beyond
// that are dropped for this epoch (counted per rank; with shuffling a different tail is
// dropped each epoch). With byte-balanced shards that tail is small.
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
};

struct LoaderStats {
  int64_t records = 0;             // records read (in this rank's split)
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
  bool InSplit(const Record& record) const;
  void CloseReader();

  std::vector<ShardSpec> shards_;
  const Tokenizer* tokenizer_;
  LoaderOptions options_;
  ExampleBuilder builder_;
  std::vector<size_t> order_;
  size_t next_shard_ = 0;
  std::unique_ptr<RecordReader> reader_;
  Rng rng_{0};
  ShuffleBuffer<Record> buffer_{1, &rng_};
  bool source_done_ = false;
  std::optional<Batcher> batcher_;
  bool flushed_ = false;
  LoaderStats stats_;
};

// Runs `loader` through `epoch` and returns its micro-batch count (a streaming pass).
absl::StatusOr<int64_t> CountMicroBatches(DataLoader& loader, int64_t epoch);

struct EpochPlan {
  int64_t optimizer_steps = 0;           // the same on every rank
  int64_t micro_batches_per_rank = 0;    // optimizer_steps * gradient_accumulation_steps
  std::vector<int64_t> dropped_micro_batches;  // per rank
};
absl::StatusOr<EpochPlan> PlanEpoch(const std::vector<int64_t>& micro_batches_per_rank,
                                    int gradient_accumulation_steps);

}  // namespace qlora::data
