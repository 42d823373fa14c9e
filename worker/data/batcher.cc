// Padding and first-fit packing into micro-batches as wide as their longest row (see batcher.h).
#include "worker/data/batcher.h"

#include <algorithm>

namespace qlora::data {

Batcher::Batcher(const BatchOptions& options) : options_(options), rows_(options.rows) {}

std::optional<MicroBatch> Batcher::Add(Example example) {
  if (example.input_ids.size() > static_cast<size_t>(options_.seq_len)) {  // cut the tail
    example.input_ids.resize(options_.seq_len);
    example.labels.resize(options_.seq_len);
  }
  if (options_.pairs) {
    if (example.rejected_input_ids.size() > static_cast<size_t>(options_.seq_len)) {
      example.rejected_input_ids.resize(options_.seq_len);
      example.rejected_labels.resize(options_.seq_len);
    }
    rows_[filled_rows_++].examples.push_back(std::move(example));
    if (filled_rows_ == options_.rows) return EmitPairs();
    return std::nullopt;
  }
  const int length = static_cast<int>(example.input_ids.size());
  std::optional<MicroBatch> done;
  auto place = [&]() -> bool {
    if (!options_.packing) {
      if (filled_rows_ == options_.rows) return false;
      rows_[filled_rows_].used = length;
      rows_[filled_rows_++].examples.push_back(std::move(example));
      return true;
    }
    for (Row& row : rows_) {
      if (row.used + length <= options_.seq_len) {
        row.used += length;
        row.examples.push_back(std::move(example));
        return true;
      }
    }
    return false;
  };
  if (!place()) {
    done = Emit();
    place();
  }
  if (!options_.packing && filled_rows_ == options_.rows) done = Emit();
  return done;
}

std::optional<MicroBatch> Batcher::Flush() {
  if (options_.pairs) {
    if (filled_rows_ == 0) return std::nullopt;
    return EmitPairs();
  }
  for (const Row& row : rows_)
    if (!row.examples.empty()) return Emit();
  return std::nullopt;
}

MicroBatch Batcher::Emit() {
  MicroBatch batch;
  batch.rows = options_.rows;
  int longest = 1;
  for (const Row& row : rows_) longest = std::max(longest, row.used);
  const int width = (longest + kPadMultiple - 1) / kPadMultiple * kPadMultiple;
  batch.seq_len = std::min(width, options_.seq_len);
  const int seq_len = batch.seq_len;
  const size_t size = static_cast<size_t>(options_.rows) * seq_len;
  batch.input_ids.assign(size, options_.pad_id);
  batch.labels.assign(size, kIgnoreIndex);
  batch.position_ids.assign(size, 0);
  batch.sequence_lengths.resize(options_.rows);
  for (int r = 0; r < options_.rows; ++r) {
    Row& row = rows_[r];
    size_t at = static_cast<size_t>(r) * seq_len;
    for (Example& example : row.examples) {
      const size_t n = example.input_ids.size();
      std::copy(example.input_ids.begin(), example.input_ids.end(), batch.input_ids.begin() + at);
      std::copy(example.labels.begin(), example.labels.end(), batch.labels.begin() + at);
      batch.labels[at] = kIgnoreIndex;  // nothing predicts an example's first token
      for (size_t i = 0; i < n; ++i) {
        batch.position_ids[at + i] = static_cast<int32_t>(i);
        batch.num_label_tokens += batch.labels[at + i] != kIgnoreIndex;
      }
      batch.sequence_lengths[r].push_back(static_cast<int32_t>(n));
      batch.num_tokens += static_cast<int64_t>(n);
      ++batch.num_examples;
      at += n;
    }
    const size_t row_end = static_cast<size_t>(r + 1) * seq_len;
    for (size_t i = at; i < row_end; ++i) batch.position_ids[i] = static_cast<int32_t>(i - at);
    row.examples.clear();
    row.used = 0;
  }
  filled_rows_ = 0;
  return batch;
}

MicroBatch Batcher::EmitPairs() {
  const int pairs = filled_rows_;
  std::vector<std::pair<const std::vector<int32_t>*, const std::vector<int32_t>*>> sides;
  for (int i = 0; i < pairs; ++i) sides.emplace_back(&rows_[i].examples[0].input_ids, &rows_[i].examples[0].labels);
  for (int i = 0; i < pairs; ++i) {
    sides.emplace_back(&rows_[i].examples[0].rejected_input_ids, &rows_[i].examples[0].rejected_labels);
  }
  MicroBatch batch;
  batch.pairs = pairs;
  batch.rows = 2 * pairs;
  size_t longest = 1;
  for (const auto& side : sides) longest = std::max(longest, side.first->size());
  const int width = static_cast<int>((longest + kPadMultiple - 1) / kPadMultiple * kPadMultiple);
  batch.seq_len = std::min(width, options_.seq_len);
  const size_t seq_len = static_cast<size_t>(batch.seq_len);
  const size_t size = static_cast<size_t>(batch.rows) * seq_len;
  batch.input_ids.assign(size, options_.pad_id);
  batch.labels.assign(size, kIgnoreIndex);
  batch.position_ids.assign(size, 0);
  batch.sequence_lengths.resize(batch.rows);
  for (size_t r = 0; r < sides.size(); ++r) {
    const std::vector<int32_t>& ids = *sides[r].first;
    const std::vector<int32_t>& labels = *sides[r].second;
    const size_t at = r * seq_len;
    std::copy(ids.begin(), ids.end(), batch.input_ids.begin() + at);
    std::copy(labels.begin(), labels.end(), batch.labels.begin() + at);
    batch.labels[at] = kIgnoreIndex;  // nothing predicts a sequence's first token
    for (size_t i = 0; i < seq_len; ++i) {
      batch.position_ids[at + i] = static_cast<int32_t>(i);
      batch.num_label_tokens += batch.labels[at + i] != kIgnoreIndex;
    }
    batch.sequence_lengths[r].push_back(static_cast<int32_t>(ids.size()));
    batch.num_tokens += static_cast<int64_t>(ids.size());
  }
  batch.num_examples = pairs;
  for (int i = 0; i < pairs; ++i) rows_[i].examples.clear();
  filled_rows_ = 0;
  return batch;
}

}  // namespace qlora::data
