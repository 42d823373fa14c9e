// Groups examples into micro-batches (rows x seq_len), padded or packed. A micro-batch is as wide
// as its longest row, rounded up to a multiple of kPadMultiple (64) and at most the options'
// seq_len (data.max_sequence_length), as transformers' collators pad to the longest: padding is
// compute that trains nothing, and trailing padding changes no value (causal attention: nothing
// before it attends to it; in packed rows it is a segment of its own).
//
// Unpacked: one example per row. Packed (padding-free, as transformers
// DataCollatorWithFlattening): examples are placed first-fit into the micro-batch's rows; a
// micro-batch is emitted when an example fits in none of its rows. In every row, position ids
// restart at 0 for each example and sequence_lengths lists the examples' lengths in order
// (cu_seqlens = their running sums), so the engine builds block-diagonal causal attention;
// the label at each example's first position is -100 (packed or not, so both give the same
// labels), hence nothing is predicted across a boundary. The tail of a row after its examples
// is padding: input pad_id, label -100, position ids 0, 1, ... (its own segment, never a
// label).
//
// Pairs (preference layout): `rows` pairs per micro-batch, laid out as TRL's preference collator
// lays them out: the chosen sequences in rows 0..n-1, the rejected ones in rows n..2n-1, so
// that one forward computes both. A partial micro-batch at the end of a stream has only its
// real pairs (an empty pair would add a zero-length preference to the loss's mean).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "worker/data/example_builder.h"

namespace qlora::data {

// Micro-batch widths are multiples of this (tensor-core and attention tiles), up to seq_len.
inline constexpr int kPadMultiple = 64;

struct MicroBatch {
  int rows = 0;
  int seq_len = 0;  // the micro-batch's width: its longest row, rounded up (see above)
  int pairs = 0;    // pairs mode: rows = 2 x pairs (chosen rows first); else 0
  std::vector<int32_t> input_ids;     // [rows * seq_len], row-major
  std::vector<int32_t> labels;        // [rows * seq_len], -100 = no loss
  std::vector<int32_t> position_ids;  // [rows * seq_len]
  std::vector<std::vector<int32_t>> sequence_lengths;  // per row, the examples' lengths
  int64_t num_examples = 0;
  int64_t num_tokens = 0;        // non-padding tokens
  int64_t num_label_tokens = 0;  // labels != -100 (transformers' num_items_in_batch)
};

struct BatchOptions {
  int rows = 1;        // trainer.batch_size
  int seq_len = 512;   // data.max_sequence_length: the widest a micro-batch gets
  bool packing = false;
  int32_t pad_id = 0;  // tokenizer pad, else EOS (no new token: the adapter fits the stock model)
  bool pairs = false;  // preference pairs: `rows` pairs per micro-batch (see above)
};

class Batcher {
 public:
  explicit Batcher(const BatchOptions& options);

  // Adds one example (at most seq_len tokens); returns a micro-batch when one is complete.
  std::optional<MicroBatch> Add(Example example);
  // The partial micro-batch at the end of a stream (empty rows fully padded), if any.
  std::optional<MicroBatch> Flush();

 private:
  struct Row {
    std::vector<Example> examples;
    int used = 0;
  };
  MicroBatch Emit();
  MicroBatch EmitPairs();

  BatchOptions options_;
  std::vector<Row> rows_;
  int filled_rows_ = 0;  // unpacked: rows holding an example
};

}  // namespace qlora::data
