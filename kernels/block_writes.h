// Many small writes of 2-D blocks in one launch. A block is rows [rows, cols] of a wider buffer
// (unit column stride, any row stride), set to zeros, to a float32 source times a scale (the
// product formed in float32 and rounded once to the buffer's dtype: ColumnsAfter's arithmetic,
// quantize_4bit.h), or to a copy of a source of the buffer's dtype. The weights a model holds
// dequantized take their adapters' columns and rows this way once an optimizer step
// (worker/engine/dequantized_layers.h), where each layer's forward and backward wrote its own: at
// 7B with 26 layers held, 182 launches of a few microseconds a step, now one every four layers.
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>

namespace qlora::kernels {

struct BlockWrite {
  at::Tensor out;     // [rows, cols]: float32, float16 or bfloat16 with unit column stride
  at::Tensor source;  // [rows, cols], unit column stride: float32 (times scale, rounded once),
                      // or out's dtype (copied; scale must be 1); undefined: zeros
  double scale = 1.0;
};

// Writes every block (all on one device, one dtype; blocks must not overlap): one launch on
// CUDA, ATen ops elsewhere. Throws c10::Error on a malformed block, before writing anything.
void WriteBlocks(const std::vector<BlockWrite>& writes);

}  // namespace qlora::kernels
