// Frozen linear layers (dense or 4-bit) with an optional LoRA adapter.
//
// Linear4bit: y = x W^T where W is stored as NF4/FP4 (kernels/quantize_4bit.h). A custom
// autograd function dequantizes W in forward, multiplies and drops it; backward dequantizes again
// for grad_input = grad_output W. W never gets a gradient and the dequantized copy is never kept
// between forward and backward (what bitsandbytes' MatMul4Bit does), unless the weight is held
// dequantized for the job (FrozenWeight::dequantized, dequantized_layers.h): then its view is used.
//
// LoRA (PEFT semantics, bias "none"): y = base(x) + B(A(dropout(x))) * scale, with A [r, in] and B [out, r]
// trainable float32 parameters cast to the compute dtype (x's dtype) for the matmuls.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "kernels/block_writes.h"
#include "kernels/quantize_4bit.h"
#include "kernels/tuned_gemm.h"
#include "worker/engine/adapter_copies.h"

namespace qlora::engine {

// The kernels' entry points, raising c10::Error when the build has no kernels.
kernels::Quantized4bit QuantizeWeight(const at::Tensor& weight,
                                      const kernels::Quantize4bitOptions& options);
// (On q's block scales' device: codes in host memory, a dequantized layer's, are copied there first.)
at::Tensor DequantizeWeight(const kernels::Quantized4bit& q, at::ScalarType dtype);
// q with its codes on its block scales' device (itself where they are; else a copy whose codes
// are copied there: a layer kept dequantized keeps its codes in host memory, dequantized_layers.h).
kernels::Quantized4bit WithCodesOnDevice(const kernels::Quantized4bit& q);
// The 16-entry code table bitsandbytes stores as `quant_map` (float32).
at::Tensor BitsandbytesQuantMap(kernels::QuantType type);

// y = x W^T with a 4-bit W, in x's dtype. Differentiable with respect to x only.
at::Tensor Linear4bit(const at::Tensor& x, const kernels::Quantized4bit& weight);

// A frozen weight [out, in]: dense (in the compute dtype) or 4-bit, and an optional frozen bias
// (never quantized, as bitsandbytes keeps Linear4bit's bias).
struct FrozenWeight {
  at::Tensor dense;                                 // [out, in]; undefined when quantized
  std::optional<kernels::Quantized4bit> quantized;  // set when 4-bit
  at::Tensor bias;                                  // [out] in the compute dtype, or undefined
  int64_t out_features = 0;
  int64_t in_features = 0;
  // A 4-bit weight kept dequantized for the whole job (dequantized_layers.h): [out, in] in the
  // compute dtype, a view of its group's buffer (row stride >= in); undefined: dequantized at
  // each use and dropped.
  at::Tensor dequantized;
  // Its forward GEMM runs in FP8 where it is 4-bit (float8_forward.h;
  // quantization.float8_base_forward): set on the decoder layers' weights by the loader.
  bool float8_forward = false;

  // The weight as a dense tensor of `dtype` (dequantized when 4-bit; the dequantized view itself
  // where there is one of that dtype: read it, never write it).
  at::Tensor Materialize(at::ScalarType dtype) const;
  // The same written into out [out_features, in_features] (any float dtype; any row stride),
  // with `after`'s columns after each row (kernels::Dequantize4bitInto, one launch when 4-bit).
  // Where out is the dequantized view itself, only `after`'s columns are written.
  void MaterializeInto(const at::Tensor& out,
                       const kernels::ColumnsAfter* after = nullptr) const;
  // Whether out is the dequantized view itself (MaterializeInto then writes only `after`'s columns).
  bool IsDequantizedView(const at::Tensor& out) const;
  // x W^T (+ bias) in x's dtype.
  at::Tensor Apply(const at::Tensor& x) const;
};

struct LoraWeights {
  at::Tensor a;  // [r, in], float32, requires_grad
  at::Tensor b;  // [out, r], float32, requires_grad
  double scale = 1.0;    // alpha / r, or alpha / sqrt(r) for rsLoRA
  double dropout = 0.0;  // applied to the LoRA branch's input while training
};

struct LinearLayer {
  FrozenWeight base;
  std::optional<LoraWeights> lora;
  // Runs the layer's GEMMs with cuBLASLt's fastest algorithm per shape (kernels/tuned_gemm.h);
  // owned by the model, which outlives every graph its layers build. Null: ATen's GEMMs.
  kernels::GemmTuner* gemm = nullptr;
  // The adapters' compute-dtype copies (adapter_copies.h); owned by the model like `gemm`. Null:
  // the adapters are cast at every use.
  AdapterCopies* adapter_copies = nullptr;
  // The gradient of the output, where its rows have spare columns (OutputGradientSpareColumns:
  // the decoder's norms leave them, ResidualRmsNorm's grad_spare_columns), has them to itself:
  // backward writes dh' there and the input gradient is one GEMM over [g | dh'] and [W; A].
  bool owns_output_gradient_spare_columns = false;

  // x: [..., in] in the compute dtype; returns [..., out] in the same dtype. With value_unused
  // (a checkpointed block's recomputation, where only the graph matters) the result's value is
  // unspecified and the frozen GEMM is skipped; every gradient is the same.
  at::Tensor Forward(const at::Tensor& x, bool training, bool value_unused = false) const;
  // W + scale * B A as float32 [out, in] (the base weight when there is no adapter).
  at::Tensor MergedWeight() const;
};

// Forward(x) of each of `layers`, which read the same input (q/k/v, or gate/up): the same values
// and gradients (up to the GEMMs' summation order), computed as one node when every layer has
// an adapter and no dropout runs, so that x is read once for the rank-r projections and its
// gradient is accumulated in one buffer (see lora_group_function.cc).
//
// Widened rows: when x's rows are followed by SharedInputSpareColumns(layers) spare values (x a
// view of [T, in + spare] rows, as ResidualRmsNorm's spare_columns makes them), the node writes
// the adapters' rank-r projections there and runs each layer's forward as one GEMM over the
// widened rows and its widened weight [W | 0 | scale B], with no separate pass for the
// adapter's output (lora_wide_group_function.cc). Same values up to rounding.
//
// With `rotary` (q/k/v), the first two outputs come back rotated (fused_ops.h's Rotary over
// their rows seen as [batch, seq, out / head_dim, head_dim]). Where the widened node runs and
// the layers' outputs are equally wide without biases (q/k/v of multi-head attention, not
// grouped-query; gate/up), they run as one GEMM over a stacked weight
// [W_q | s B_q . . ; W_k | . s B_k . ; W_v | . . s B_v] whose output is packed rows [T, n out]
// (the outputs are views of them): for q/k/v the layout cuDNN's attention reads as it is, the
// rotation written over q's and k's columns in place (the node's backward rotates their
// gradients back); for gate/up the rows SwiGLU reads, whose backward writes the gradients back
// over them, so that the node's input gradient is one GEMM over the packed gradient, with the
// adapters' low-rank term inside it (the rows' spare columns). With packed_gradients the q/k/v
// node's backward packs their gradients likewise (q's and k's rotated back into the rows, v's
// copied) for one such GEMM: one [T, q + k + v] buffer more at a layer's backward, so a model
// that saves memory first (checkpointing) leaves it off.
//
// With `normed` (x = rms_norm(source) * weight, the norm's input and its rows' float32 1/rms:
// fused_ops.h ResidualRmsNorm), the widened node keeps source and rstd, which the norm keeps
// for its own backward anyway, and its rank-r projections (copied out of the spare columns)
// instead of x's rows: one [T, in] activation less a node (q/k/v and gate/up: 2 x 64 MB a layer
// at 7B, micro-batch 4). Its backward takes the As' gradient from source,
//   dA = dh'^T x = ((rstd dh')^T source) diag(weight),
// the same sum with the norm's factors moved outside the GEMM (the values of the node keeping x
// up to rounding: fused_paths_test).
struct SharedInputRotary {
  at::Tensor cos, sin;  // [batch or 1, 1, seq, head_dim] in x's dtype (constants)
  int64_t batch = 0, seq = 0, head_dim = 0;
  bool packed_gradients = false;
};
struct NormedInput {
  at::Tensor source;  // x's shape and dtype: the norm's input (its residual stream)
  at::Tensor rstd;    // float32, one per row of source
  at::Tensor weight;  // [in] in x's dtype, frozen
};
std::vector<at::Tensor> SharedInputForward(const std::vector<const LinearLayer*>& layers,
                                           const at::Tensor& x, bool training,
                                           bool value_unused = false,
                                           const SharedInputRotary* rotary = nullptr,
                                           const NormedInput* normed = nullptr);

// The spare columns SharedInputForward(layers, x, training) uses when x's rows have them: the
// adapters' ranks summed, rounded up so that rows are a multiple of 64 values (aligned rows
// for the GEMMs), when the layers run as one node; else 0.
int64_t SharedInputSpareColumns(const std::vector<const LinearLayer*>& layers, bool training);

// The adapters' columns and rows of weights kept dequantized (dequantized_layers.h), as the passes
// that read them write them: blocks (kernels/block_writes.h) with where they go (`key`, the
// first block's destination) and what they write (`signature`), and whether every source is a
// tensor whose values the adapters' scope fixes (`stable`: a float32 adapter itself, or its
// scope copy; only such writes are noted and skipped, AdapterCopies::Written).
struct DequantizedWrites {
  std::vector<kernels::BlockWrite> blocks;
  const void* key = nullptr;
  uint64_t signature = 0;
  bool stable = false;
};
DequantizedWrites MakeDequantizedWrites(std::vector<kernels::BlockWrite> blocks, bool stable);
// Writes those of `writes` that `copies`' open scope has not noted (copies may be null: all of
// them), in one launch, and notes the stable ones there.
void WriteDequantized(AdapterCopies* copies, const std::vector<DequantizedWrites>& writes);
// What the passes over `layers` held in one buffer write (empty where they are not, or where a
// pass would not run that way): the widened forward's adapter columns of layers that run as one
// node while `training` (q/k/v, gate/up; SharedInputForward): packed, [0 | scale B_i | 0] for
// all of them at once, else each layer's [0 | scale B_i] (grouped-query q/k/v);
std::vector<DequantizedWrites> DequantizedGroupColumns(const std::vector<const LinearLayer*>& layers,
                                         bool training);
// the widened forward's [scale B] of one layer (the down projection over widened rows:
// SwigluThenOptions::widened_rows);
DequantizedWrites DequantizedWidenedColumns(const LinearLayer& layer, bool training);
// the input-gradient GEMM's As under the weights (any group: q/k/v, o, gate/up, down).
DequantizedWrites DequantizedRowsBelow(const std::vector<const LinearLayer*>& layers, bool training);

// How SwigluThenForward's node keeps and gives back its tensors.
struct SwigluThenOptions {
  bool training = true;
  // A checkpointed layer's recomputation: the node keeps the product and writes the input
  // gradient over it; the output only carries the graph.
  bool value_unused = false;
  // gate and up are the caller's to give up (no one reads them after this node's backward,
  // which writes up's gradient over up).
  bool overwrite_inputs = false;
  // A plain layer's backward recomputes the product before the input gradient is allocated (one
  // pass more over gate and up, [tokens, intermediate] less at the layer's backward: for a model
  // that checkpoints layers to save memory, where that backward is the peak) instead of taking
  // it from SwiGLU's backward, which reads gate and up anyway.
  bool lean_backward = false;
  // SwiGLU writes its output into rows with spare columns, the adapter's x A^T goes into the
  // first of them, and the projection with its adapter (and the residual, where given) is one
  // GEMM over [x | x A^T] and [W | scale B] (no rank-r GEMM writing scale (x A^T) B^T for the
  // base GEMM to read back). The decoder sets it on CUDA, as its norms' spare columns.
  bool widened_rows = false;
  // As LinearLayer::owns_output_gradient_spare_columns, for down's output (h + down).
  bool owns_output_gradient_spare_columns = false;
};

// The spare columns a LoRA layer's backward uses after its output gradient's rows (for dh', so
// that its input gradient is one GEMM: owns_output_gradient_spare_columns,
// SwigluThenOptions::owns_output_gradient_spare_columns): the rank rounded up to aligned rows
// where the layer's node runs (an adapter, no dropout running), else 0.
int64_t OutputGradientSpareColumns(const LinearLayer& layer, bool training);

// down.Forward(silu(gate) * up, training, value_unused): with an adapter (and no dropout
// running) as one node whose backward writes SwiGLU's gate gradient over its own input gradient
// (see swiglu_lora_function.cc). Plain layers: it saves gate and up but not their product
// ([tokens, intermediate] less held from forward to backward), which backward gets again from
// SwiGLU's backward (or, lean_backward, recomputes first). Without grad the same computation
// without the node, gate and up let go once SwiGLU has read them (pass them over, std::move).
//
// With `residual` (the decoder's residual stream, [..., out]): residual + down(...), the add
// inside the node's GEMMs (the stream is the adapter GEMM's C: no pass of its own; its
// gradient is the output's), the same with and without grad; with value_unused, the output
// carries the graph to the residual as SumGraphOnly does.
at::Tensor SwigluThenForward(const LinearLayer& down, at::Tensor gate, at::Tensor up,
                             const SwigluThenOptions& options,
                             const at::Tensor& residual = at::Tensor());

}  // namespace qlora::engine
