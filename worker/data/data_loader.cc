// The per-rank streaming pipeline and the equal-steps plan (see data_loader.h).
#include "worker/data/data_loader.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace qlora::data {
namespace {

// MixSeed's stream for the epoch's shard order (any value that is not a rank would do; ranks
// are small).
constexpr uint64_t kShardOrderStream = 0x5348415244ull;  // "SHARD"

uint64_t Fnv1a(absl::string_view bytes, uint64_t hash = 0xCBF29CE484222325ull) {
  for (char c : bytes) hash = (hash ^ static_cast<unsigned char>(c)) * 0x100000001B3ull;
  return hash;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DataLoader>> DataLoader::Create(std::vector<ShardSpec> shards,
                                                               const Tokenizer* tokenizer,
                                                               const LoaderOptions& options) {
  if (options.batch.rows < 1 || options.batch.seq_len < 2)
    return absl::InvalidArgumentError("micro-batch rows must be >= 1 and seq_len >= 2");
  if (options.validation_fraction < 0 || options.test_fraction < 0 ||
      options.validation_fraction + options.test_fraction >= 1)
    return absl::InvalidArgumentError(
        "data.validation_fraction and data.test_fraction must be >= 0 and sum to less than 1");
  QLORA_ASSIGN_OR_RETURN(ExampleBuilder builder, ExampleBuilder::Create(options.example, tokenizer));
  LoaderOptions resolved = options;  // the reader reads the columns the builder uses
  builder.Columns(&resolved.reader.columns, &resolved.reader.optional_columns);
  std::unique_ptr<DataLoader> loader(
      new DataLoader(std::move(shards), tokenizer, resolved, std::move(builder)));
  QLORA_RETURN_IF_ERROR(loader->StartEpoch(0));
  return loader;
}

DataLoader::DataLoader(std::vector<ShardSpec> shards, const Tokenizer* tokenizer,
                       const LoaderOptions& options, ExampleBuilder builder)
    : shards_(std::move(shards)),
      tokenizer_(tokenizer),
      options_(options),
      builder_(std::move(builder)) {}

absl::Status DataLoader::StartEpoch(int64_t epoch) {
  // The shard order is the same on every rank (the interleaving index runs on across shards in
  // this order, so every rank must count the same sequence); the shuffle buffer is per rank.
  Rng order_rng(MixSeed(options_.seed, static_cast<uint64_t>(epoch), kShardOrderStream));
  order_.resize(shards_.size());
  std::iota(order_.begin(), order_.end(), 0);
  if (options_.shuffle)
    for (size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[order_rng.Below(i)]);
  rng_ = Rng(MixSeed(options_.seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(options_.rank)));
  next_shard_ = 0;
  next_index_ = 0;
  reader_.reset();
  buffer_ = ShuffleBuffer<Record>(options_.shuffle ? options_.shuffle_buffer_records : 1, &rng_);
  source_done_ = false;
  batcher_.emplace(options_.batch);
  flushed_ = false;
  builder_.ResetStats();
  stats_ = LoaderStats();
  return absl::OkStatus();
}

bool DataLoader::InSplit(const std::string& path, int64_t record_offset) const {
  // Without a fraction there is no split: every record is training data.
  if (options_.validation_fraction <= 0 && options_.test_fraction <= 0)
    return options_.split != SplitRole::kValidation;
  uint64_t offset = static_cast<uint64_t>(record_offset);
  uint64_t hash = Fnv1a(absl::string_view(reinterpret_cast<const char*>(&offset), sizeof(offset)),
                        Fnv1a(path));
  Rng rng(MixSeed(options_.seed, hash));
  // [0, validation) validation, [validation, validation + test) held out, the rest training.
  const double u = rng.Uniform();
  if (u < options_.validation_fraction) return options_.split != SplitRole::kTrain;
  if (u < options_.validation_fraction + options_.test_fraction) return false;
  return options_.split != SplitRole::kValidation;
}

void DataLoader::CloseReader() {
  if (!reader_) return;
  next_index_ = reader_->next_index();
  stats_.records += reader_->malformed_count();  // read, though never past the reader
  stats_.malformed_records += reader_->malformed_count();
  for (const std::string& message : reader_->malformed_messages())
    if (stats_.malformed_messages.size() < options_.reader.kept_messages)
      stats_.malformed_messages.push_back(message);
  reader_.reset();
}

absl::StatusOr<bool> DataLoader::NextRecord(Record* record) {
  while (true) {
    if (!reader_) {
      if (next_shard_ == order_.size()) return false;
      const ShardSpec& shard = shards_[order_[next_shard_++]];
      // The split filter runs before interleaving, so each rank gets an equal share of its
      // split, and before parsing, so other splits' records cost only finding their end.
      ReaderOptions reader = options_.reader;
      reader.first_index = next_index_;
      reader.select = [this, path = shard.path](int64_t offset) { return InSplit(path, offset); };
      QLORA_ASSIGN_OR_RETURN(reader_, RecordReader::Open(shard, reader));
    }
    QLORA_ASSIGN_OR_RETURN(bool more, reader_->Next(record));
    if (more) return true;
    CloseReader();
  }
}

absl::StatusOr<bool> DataLoader::NextShuffled(Record* record) {
  while (!source_done_) {
    Record incoming;
    QLORA_ASSIGN_OR_RETURN(bool more, NextRecord(&incoming));
    if (!more) {
      source_done_ = true;
      break;
    }
    std::optional<Record> out = buffer_.Push(std::move(incoming));
    if (out) {
      *record = std::move(*out);
      return true;
    }
  }
  return buffer_.Drain(record);
}

absl::Status DataLoader::Malformed(const Record& record, const absl::Status& reason) {
  std::string where = record.line >= 1 ? absl::StrCat(record.path, ":", record.line)
                                       : absl::StrCat(record.path, " at byte ", record.offset);
  std::string message = absl::StrCat(where, ": malformed record: ", reason.message());
  if (!options_.reader.skip_malformed)
    return absl::InvalidArgumentError(absl::StrCat(
        message, " (data.malformed_records: fail; set it to skip to count and skip such records)"));
  ++stats_.malformed_records;
  if (stats_.malformed_messages.size() < options_.reader.kept_messages)
    stats_.malformed_messages.push_back(std::move(message));
  return absl::OkStatus();
}

absl::StatusOr<std::optional<MicroBatch>> DataLoader::Next() {
  Record record;
  Example example;
  while (true) {
    QLORA_ASSIGN_OR_RETURN(bool more, NextShuffled(&record));
    if (!more) break;
    ++stats_.records;
    absl::StatusOr<bool> built = builder_.Build(record, &example);
    if (!built.ok()) {
      if (built.status().code() != absl::StatusCode::kInvalidArgument) return built.status();
      QLORA_RETURN_IF_ERROR(Malformed(record, built.status()));
      continue;
    }
    if (!*built) continue;
    std::optional<MicroBatch> batch = batcher_->Add(std::move(example));
    if (batch) {
      ++stats_.micro_batches;
      stats_.tokens += batch->num_tokens;
      stats_.label_tokens += batch->num_label_tokens;
      stats_.examples = builder_.stats();
      return batch;
    }
  }
  stats_.examples = builder_.stats();
  if (flushed_) return std::optional<MicroBatch>();
  flushed_ = true;
  std::optional<MicroBatch> batch = batcher_->Flush();
  if (batch) {
    ++stats_.micro_batches;
    stats_.tokens += batch->num_tokens;
    stats_.label_tokens += batch->num_label_tokens;
  }
  return batch;
}

absl::StatusOr<EpochCount> CountMicroBatches(DataLoader& loader, int64_t epoch) {
  QLORA_RETURN_IF_ERROR(loader.StartEpoch(epoch));
  EpochCount count;
  while (true) {
    QLORA_ASSIGN_OR_RETURN(std::optional<MicroBatch> batch, loader.Next());
    if (!batch) break;
    ++count.micro_batches;
    count.examples += batch->num_examples;
  }
  const LoaderStats& stats = loader.stats();
  count.records = stats.records;
  count.malformed = stats.malformed_records;
  count.without_target = stats.examples.dropped_no_target;
  return count;
}

absl::StatusOr<EpochPlan> PlanEpoch(const std::vector<int64_t>& micro_batches_per_rank,
                                    int gradient_accumulation_steps) {
  if (micro_batches_per_rank.empty() || gradient_accumulation_steps < 1)
    return absl::InvalidArgumentError("PlanEpoch needs >= 1 rank and accumulation >= 1");
  auto fewest = std::min_element(micro_batches_per_rank.begin(), micro_batches_per_rank.end());
  EpochPlan plan;
  plan.optimizer_steps = *fewest / gradient_accumulation_steps;
  if (plan.optimizer_steps == 0)
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", fewest - micro_batches_per_rank.begin(), " has ", *fewest,
        " micro-batches this epoch, fewer than gradient_accumulation_steps (",
        gradient_accumulation_steps, "): too little data for this many workers"));
  plan.micro_batches_per_rank = plan.optimizer_steps * gradient_accumulation_steps;
  for (int64_t count : micro_batches_per_rank)
    plan.dropped_micro_batches.push_back(count - plan.micro_batches_per_rank);
  return plan;
}

}  // namespace qlora::data
