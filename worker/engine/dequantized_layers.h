// Frozen 4-bit weights kept dequantized for the whole job (trainer.dequantized_weight_layers):
// a decoder layer's projections then cost no dequantization in forward or backward, for
// (their weights + the adapters' rows) x the compute dtype's bytes of device memory each.
//
// Layout: one buffer per group of projections that read one input or run alone (q/k/v, o,
// gate/up, down), [sum of out + sum of r, AlignedRow(in + sum of r)], which the LoRA nodes
// (worker/engine/*_function.cc) use in place of the buffers they would dequantize into:
//   rows of the weights, columns [0, in)     W_1; ...; W_n (each FrozenWeight::dequantized views
//                                            its rows), written once here;
//   the same rows, the columns after in      the widened forward's [0 | scale B_i | 0];
//   the rows below, columns [0, in)          A_1; ...; A_n for the input-gradient GEMM over
//                                            [g | dh'].
// So the forward GEMM reads [W | adapters' columns] and the backward GEMM [W; A] from the one
// buffer, where each would otherwise dequantize W into a buffer of its own. The adapters' blocks
// are written from the adapters each pass runs, by the pass itself, except where the adapters'
// scope (adapter_copies.h) has them written already: a training forward writes every held
// layer's a few layers a launch (WriteDequantizedAdapters below; LlamaForCausalLM::Forward) and the
// passes then skip theirs.
// The values are the same bits as dequantized at each use. Torch side.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "worker/engine/linear4bit.h"

namespace qlora::engine {

struct DecoderLayer;

// Bytes of the buffers KeepDequantized makes for `layer` in `dtype` (0 where no group is 4-bit).
int64_t DequantizedBufferBytes(const DecoderLayer& layer, at::ScalarType dtype);
// Device bytes of the 4-bit codes KeepDequantized moves to host memory (0 on the CPU): a held
// layer's device bytes are DequantizedBufferBytes less these (at 7B, 0.38 less 0.09 GiB).
int64_t MovedCodeBytes(const DecoderLayer& layer);

// Dequantizes each of the layer's 4-bit groups into its buffer and points the weights'
// `dequantized` at it (a group with a dense weight stays as it is), then moves those weights'
// codes (Quantized4bit::packed) to host memory: every use in the compute dtype reads the
// buffer; another dtype (the float32 merge of export) dequantizes from a device copy of the
// codes made for it (linear4bit.h DequantizeWeight). The block scales stay. Idempotent.
void KeepDequantized(DecoderLayer& layer, at::ScalarType dtype);

// Drops the buffers (freed once no autograd graph holds a view of them), the codes back on the
// device first.
void DropDequantized(DecoderLayer& layer);

// The adapters' columns and rows that a training step's forward and backward over the held
// `layers` read (linear4bit.h: DequantizedGroupColumns for q/k/v and gate/up, DequantizedWidenedColumns for
// the down projection when `widened_down`, DequantizedRowsBelow for each group), written in one launch
// and noted in the adapters' open scope, where each pass then finds its own written and skips
// it: one launch for all of `layers` where each pass wrote its own (at 7B with 26 layers held,
// 182 small launches a step). A pass this does not foresee writes what it needs itself. Nothing
// outside an AdapterCopyScope (nothing is noted there). The same bits either way.
void WriteDequantizedAdapters(const std::vector<const DecoderLayer*>& layers, bool training,
                       bool widened_down);

}  // namespace qlora::engine
