// The row alignment of the engine's widened operands and of rows with spare columns (the LoRA
// node's widened GEMMs, packed gate/up rows, packed gradient rows, the norms' gradient rows):
// one definition for the LoRA nodes, which lay rows out, and activation_plan.cc, which counts them.
// Torch-free.
#pragma once

#include <cstdint>

namespace qlora::engine {

// Rows are padded to a multiple of this many values (128 bytes in bf16), so that every row starts
// on a 128-byte line. Measured, it neither helps nor costs: the widened GEMMs run a few per cent
// slower per FLOP with and without it (the extra 64-wide K step), so the padding stays as the
// cheaper layout to reason about.
inline constexpr int64_t kRowAlignment = 64;

// `values` rounded up to a multiple of kRowAlignment.
constexpr int64_t AlignedRow(int64_t values) {
  return (values + kRowAlignment - 1) / kRowAlignment * kRowAlignment;
}

}  // namespace qlora::engine
