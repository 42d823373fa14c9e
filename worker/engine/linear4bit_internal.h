// The internals that linear4bit.cc's autograd nodes share (no part of the engine's API): what a
// node keeps in autograd's saved data, the GEMMs (through the model's GemmTuner, the rank-r ones
// inside a profiler range), the rows with spare columns the widened GEMMs read and write, the
// blocks written into weights kept dequantized (dequantized_layers.h), and the LoRA branch's
// forward and backward (linear4bit_internal.cc). Each node lives in a file of its own and is
// reached through its entry function below (its forward's arguments, without the context):
//   linear4bit_function.cc       Linear4bitFunction     y = x W^T with a 4-bit W
//   swiglu_lora_function.cc      SwigluLoraFunction     SwiGLU then down with its adapter
//   lora_linear_function.cc      LoraLinearFunction     a LoRA layer as one node
//   lora_group_function.cc       LoraGroupFunction      layers that read one input, as one node
//   lora_wide_group_function.cc  LoraWideGroupFunction  the same over widened rows
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/quantize_4bit.h"
#include "kernels/tuned_gemm.h"
#include "worker/engine/adapter_copies.h"
#include "worker/engine/adapter_gradients.h"
#include "worker/engine/linear4bit.h"

namespace qlora::engine::linear4bit_internal {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The rank-r GEMMs (LoraAddmm, LoraMm, LoraGradientPair) run inside a profiler range of this name:
// their enclosing ops show the layer's shapes, not r, so bench/attribute_profile.py tells them
// from the base GEMMs by it. Without a profiler a range is a flag test.
inline constexpr const char* kLoraRange = "qlora::lora";

// ---- What the nodes keep in autograd's saved data ----

// Rebuilds the kernels' descriptor from what forward saved in the context.
// (`prefix` tells apart the weights of a node that keeps several.)
kernels::Quantized4bit FromSaved(AutogradContext* ctx, const std::string& prefix = "");

void Save(AutogradContext* ctx, const kernels::Quantized4bit& q, const std::string& prefix = "");

// The layers' GEMM tuner in autograd's saved data, as its address (see LinearLayer::gemm).
void SaveGemm(AutogradContext* ctx, kernels::GemmTuner* gemm);

kernels::GemmTuner* SavedGemm(AutogradContext* ctx);

// The layers' adapter copies in autograd's saved data, as their address (see
// LinearLayer::adapter_copies).
void SaveCopies(AutogradContext* ctx, AdapterCopies* copies);

AdapterCopies* SavedCopies(AutogradContext* ctx);

// The base weight of a LoRA layer as autograd's saved data: 4-bit (the kernels' descriptor, as
// Linear4bitFunction keeps it) or dense.
void SaveBase(AutogradContext* ctx, const FrozenWeight& base, const std::string& prefix = "");

// The weight SaveBase kept, in dtype (dequantized, or the dense weight cast).
at::Tensor SavedBase(AutogradContext* ctx, at::ScalarType dtype, const std::string& prefix = "");

// The frozen weights saved under `prefixes` (SaveBase), dequantized (or cast) into the rows of one
// [sum of out + rows of `below`, in] buffer, `below` (the As [sum of r, in] in the compute dtype,
// or undefined) under them: the right operand of an input-gradient GEMM over packed rows.
at::Tensor StackedWeights(AutogradContext* ctx, const std::vector<std::string>& prefixes,
                          const at::Tensor& below, int64_t in, const at::TensorOptions& options);

// ---- GEMMs ----

// An adapter tensor (or several, concatenated along dim 0) in the compute dtype: the scope's
// copy where the layers have AdapterCopies, else a cast.
at::Tensor InDtype(AdapterCopies* copies, at::TensorList params, at::ScalarType dtype);

// out = beta * out + alpha * (a b) through the tuner, or ATen's GEMM without one; with c,
// out = beta * c + alpha * (a b) (c read, never written: GemmTuner::Addmm).
void Addmm(kernels::GemmTuner* gemm, const at::Tensor& out, const at::Tensor& a,
           const at::Tensor& b, double beta = 1.0, double alpha = 1.0,
           const at::Tensor& c = at::Tensor());

// alpha * a [m, k] b [k, n] as a new [m, n] tensor (with the tuner alpha scales inside the
// GEMM, sparing a pass over the product).
at::Tensor Mm(kernels::GemmTuner* gemm, const at::Tensor& a, const at::Tensor& b,
              double alpha = 1.0);

// Addmm and Mm for the rank-r GEMMs, inside a kLoraRange profiler range.
void LoraAddmm(kernels::GemmTuner* gemm, const at::Tensor& out, const at::Tensor& a,
               const at::Tensor& b, double beta = 1.0, double alpha = 1.0,
               const at::Tensor& c = at::Tensor());

at::Tensor LoraMm(kernels::GemmTuner* gemm, const at::Tensor& a, const at::Tensor& b,
                  double alpha = 1.0);

// ---- Weights kept dequantized (dequantized_layers.h) ----

// Rows [sum of out + extra_rows, width] of the buffer the weights' dequantized views lie in
// (dequantized_layers.h), where each weight has one in `dtype`, adjacent in the given order, in
// rows at least `width` wide; with extra_rows, only where those rows end the buffer (its rows
// below the group's weights, which callers write: never another weight's). Else an undefined
// tensor (the caller dequantizes into a buffer of its own).
at::Tensor DequantizedRows(const std::vector<const FrozenWeight*>& weights, int64_t extra_rows,
                        int64_t width, at::ScalarType dtype);

// The adapter columns after rows [out_i, in] of a packed group's weights stacked in `stacked`
// [sum of out, in + sum of r]: [0 | scale_i B_i | 0] (each B float32, as ColumnsAfter takes it),
// noted in the adapters' scope where every B is the float32 adapter itself.
DequantizedWrites DequantizedPackedColumns(const at::Tensor& stacked,
                             const std::vector<const LinearLayer*>& group, at::TensorList b,
                             int64_t in);

// The As in the compute dtype (`below`) written into the rows under a held group's weights
// (`rows`), noted in the adapters' scope where `below` is their scope copy.
DequantizedWrites DequantizedAs(const at::Tensor& rows, const at::Tensor& below, AdapterCopies* copies);

// WidenedWeight's columns for a weight kept dequantized: [0 | scale B] after its rows in its
// buffer (noted in the adapters' scope where B is the float32 adapter itself), or none.
DequantizedWrites DequantizedWidened(const FrozenWeight& base, int64_t in, const at::Tensor& b, double scale,
                       int64_t offset, at::ScalarType dtype);

// ---- Rows with spare columns ----

// The rows [T, sum of widths] whose column blocks the tensors in `columns` are, side by side in
// order (PackedForward's outputs, or gradients written over them), or an undefined tensor.
at::Tensor PackedColumns(at::TensorList columns);

// Whether rows x [T, in] begin rows of in + spare values (x.stride(0) == in + spare, within
// x's storage): the spare columns a producer left for the widened GEMMs (ResidualRmsNorm's
// spare_columns).
bool HasSpareColumns(const at::Tensor& x, int64_t spare);

// x's rows with their spare columns, [T, in + spare], as a tensor of its own (its own version
// counter: writing the spare columns is not an in-place change of x for autograd).
at::Tensor WithSpareColumns(const at::Tensor& x, int64_t spare);

// rows [T, width] with the `count` columns after them, [T, width + count], as a tensor of its own
// (WithSpareColumns), where the rows lie as RowsWithColumnsAfter lays them out; else an undefined
// tensor.
at::Tensor WithColumnsAfter(const at::Tensor& rows, int64_t count);

// Layer i's weight widened for rows [x | h A_1^T | ... | h A_n^T]: [W_i | 0 | scale_i B_i], the
// base weight [out, in] (dequantized), zeros over the adapters before i (`offset` columns), then
// scale_i * B_i [out, r_i] rounded once to dtype. Rows [T, in + offset + r_i] times its transpose
// are x W_i^T + scale_i (x A_i^T) B_i^T in one GEMM, summed in float32 and rounded once.
at::Tensor WidenedWeight(const FrozenWeight& base, int64_t in, const at::Tensor& b, double scale,
                         int64_t offset, at::ScalarType dtype, AdapterCopies* copies);

// ---- The LoRA branch ----

// y = scale * (h A^T) B^T written by the rank-r GEMM from ha = h A^T (beta = 0), then
// y += x W^T accumulated by the base GEMM (beta = 1), for rows x [T, in]; unset with value_unused.
// With `residual` (rows [T, out] of the residual stream): y = residual + scale * (h A^T) B^T
// from the rank-r GEMM (the residual as its C), then the base GEMM: the decoder's residual add
// inside the GEMMs, with no pass of its own over the stream.
at::Tensor LoraOutput(const at::Tensor& x, const at::Tensor& ha, const at::Tensor& b,
                      const FrozenWeight& base, double scale, bool value_unused,
                      kernels::GemmTuner* gemm, AdapterCopies* copies,
                      const at::Tensor& residual = at::Tensor());

// The LoRA layer's forward for rows x [T, in] with the adapters' input h (x, or dropout(x)):
// {LoraOutput, h A^T}.
std::pair<at::Tensor, at::Tensor> LoraForward(const at::Tensor& x, const at::Tensor& h,
                                              const at::Tensor& a, const at::Tensor& b,
                                              const FrozenWeight& base, double scale,
                                              bool value_unused, kernels::GemmTuner* gemm,
                                              AdapterCopies* copies,
                                              const at::Tensor& residual = at::Tensor());

// dh' = (g B) * scale [T, r] and dB = g^T (h A^T) * scale [out, r] into dha and db: one pass
// over g where the kernel takes these tensors (kernels/lora_gradients.h), else two GEMMs.
void LoraGradientPair(kernels::GemmTuner* gemm, const at::Tensor& g, const at::Tensor& b,
                      const at::Tensor& ha, double scale, const at::Tensor& dha,
                      const at::Tensor& db);

struct LoraGradients {
  at::Tensor dha;      // dh' [T, r]
  at::Tensor lora_in;  // dh' A [T, in]: the adapters' part of the input gradient
  // dA [r, in] (slot 0) and dB [out, r] (slot 1) in the compute dtype, cast together (Cast).
  std::optional<AdapterGradients> ab;
  // {dA, dB} in the adapters' dtype.
  std::vector<at::Tensor> Cast(const at::Tensor& a) const { return ab->Cast(a.scalar_type()); }
};

// dh = dh' A [T, in], the adapters' part of the input gradient.
at::Tensor LoraInputGradient(const LoraGradients& d, const at::Tensor& a, at::ScalarType dtype,
                             kernels::GemmTuner* gemm, AdapterCopies* copies);

// dA = dh'^T h into its slot.
void LoraAGradient(const LoraGradients& d, const at::Tensor& h, kernels::GemmTuner* gemm);

// The adapters' gradients for g [T, out] (in ha's dtype), each GEMM writing its result's layout
// (no transposed copies; dh' and dB from one pass over g where LoraGradientPair's kernel runs):
//   dh' = (g B) * scale [T, r];  dh = dh' A;  dA = dh'^T h;  dB = g^T (h A^T) * scale
// Without `input_gradient`, dh is left to the caller (LoraInputGradient), who may free h first;
// without h (undefined), dA is left to the caller too (LoraAGradient), who makes h later.
// dh' goes into `dha_into` where given (the spare columns after g's rows: InputGradientOverRows).
LoraGradients LoraBackward(const at::Tensor& g, const at::Tensor& h, const at::Tensor& ha,
                           const at::Tensor& a, const at::Tensor& b, double scale,
                           kernels::GemmTuner* gemm, AdapterCopies* copies,
                           bool input_gradient = true, const at::Tensor& dha_into = {});

// The gradient g [T, out] with r columns after its rows for dh' (WithColumnsAfter), where the
// node owns its output gradient's spare columns (saved as "owns_gradient_spare_columns": the
// model knows that nothing else writes there) and g has them; else an undefined tensor.
at::Tensor OwnedColumnsAfter(AutogradContext* ctx, const at::Tensor& g, int64_t r);

// A LoRA layer's input gradient [T, in] from rows [g | dh'] [T, out + r] (g's rows with dh' in
// their spare columns: WithColumnsAfter) as one GEMM over the saved frozen weight with the
// adapter's A [r, in] under it: dx = g W + dh' A, summed in float32 and rounded once (the
// separate rank-r GEMM wrote dh' A [T, in] for the base GEMM to read back and add to). Into `dx`
// where given (rows [T, in]), else a new tensor.
at::Tensor InputGradientOverRows(AutogradContext* ctx, const at::Tensor& rows_with_dha,
                                 const at::Tensor& a, kernels::GemmTuner* gemm,
                                 at::Tensor dx = {});

// ---- linear4bit_function.cc ----

// Linear4bitFunction::apply: y = x W^T with the 4-bit W `weight`, differentiable in x only;
// dequantized: the weight kept dequantized (FrozenWeight::dequantized), or null / undefined;
// float8: the forward GEMM in FP8 (FrozenWeight::float8_forward; float8_forward.h).
at::Tensor ApplyLinear4bit(const at::Tensor& x, const kernels::Quantized4bit* weight,
                           bool value_unused, kernels::GemmTuner* gemm,
                           const at::Tensor* dequantized, bool float8 = false);

// ---- swiglu_lora_function.cc ----

// SwigluLoraFunction::apply: down's forward (its adapter `a`, `b`, its frozen `base`) over
// silu(gate) * up as one node; residual_or_empty: rows [T, out] of the residual stream, or an
// empty tensor for none (a node's inputs are never undefined).
at::Tensor ApplySwigluLora(const at::Tensor& gate, const at::Tensor& up,
                           const at::Tensor& residual_or_empty, const at::Tensor& a,
                           const at::Tensor& b, const FrozenWeight* base, double scale,
                           kernels::GemmTuner* gemm, AdapterCopies* copies,
                           const SwigluThenOptions* options);

// x = silu(gate) * up [T, I] written into rows of AlignedRow(I + r) values and ha = x A^T [T, r]
// into the first r of their spare columns (views of those rows): what the down projection's
// widened GEMM (DownOverWidenedRows) reads. A recomputation makes ha by the same call, so a
// checkpointed layer's adapter gradients have a plain layer's bits.
std::pair<at::Tensor, at::Tensor> SwigluIntoWidenedRows(const at::Tensor& gate,
                                                        const at::Tensor& up, const at::Tensor& a,
                                                        kernels::GemmTuner* gemm,
                                                        AdapterCopies* copies);

// y = [x | x A^T] [W | scale B]^T, plus the residual as the GEMM's C where there is one: the
// projection, its adapter and the decoder's residual add as one GEMM over SwigluIntoWidenedRows'
// rows (no rank-r GEMM writing scale (x A^T) B^T for the base GEMM to read back).
at::Tensor DownOverWidenedRows(const at::Tensor& x, const at::Tensor& b, const FrozenWeight& base,
                               double scale, kernels::GemmTuner* gemm, AdapterCopies* copies,
                               const at::Tensor& residual);

// ---- lora_linear_function.cc ----

// LoraLinearFunction::apply: y = x W^T + scale * (h A^T) B^T for rows of tokens x [T, in], with
// h = dropout(x), or x itself.
at::Tensor ApplyLoraLinear(const at::Tensor& x, const at::Tensor& h, const at::Tensor& a,
                           const at::Tensor& b, const FrozenWeight* base, double scale,
                           bool value_unused, kernels::GemmTuner* gemm, AdapterCopies* copies,
                           bool owns_gradient_spare_columns);

// ---- lora_group_function.cc ----

// LoraGroupFunction::apply: the outputs of the layers of `group` (each with an adapter, no
// dropout running) over rows x [T, in], with their As and Bs in `a` and `b`.
variable_list ApplyLoraGroup(const at::Tensor& x, at::TensorList a, at::TensorList b,
                             const std::vector<const LinearLayer*>* group, bool value_unused);

// What the group nodes keep for GroupBackward: `leading` (x, and ha where it is a tensor of its
// own), then the As and the Bs; and the layers' ranks and scales.
void SaveGroup(AutogradContext* ctx, variable_list leading, at::TensorList a, at::TensorList b,
               const std::vector<int64_t>& ranks, const std::vector<double>& scales);

// The backward of the layers that read x [T, in] as one node (LoraGroupFunction and
// LoraWideGroupFunction), from ha = x [A_1; ...; A_n]^T [T, sum of r] and `adapters` (the As,
// then the Bs): per layer dh'_i = (g_i B_i) * scale_i and dB_i (LoraGradientPair), then one GEMM
// for all the A gradients and x's gradient built in one buffer,
// dx = [dh'_1 ... dh'_n] [A_1; ...; A_n] then += g_i W_i for each i. Where the gradients lie
// packed in rows with sum(r_i) spare columns after them (PackedForward's gate/up rows, which
// SwiGLU's backward writes them over), dh' goes into those columns and x's gradient is one GEMM,
// dx = [g_1 ... g_n | dh'] [W_1; ...; W_n; A_1; ...; A_n], summed in float32 and rounded once
// (no [T, in] pass writing dh' A for the base GEMM to read back and add to).
// With `normed`, x is the source of the node's input rms_norm(x) * weight (linear4bit.h
// NormedInput; normed->source is not read): the As' gradient is ((rstd dh')^T x) diag(weight).
variable_list GroupBackward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& ha,
                            at::TensorList adapters, const variable_list& grad_outputs,
                            const NormedInput* normed = nullptr);

// ---- lora_wide_group_function.cc ----

// LoraWideGroupFunction::apply: ApplyLoraGroup's outputs for x whose rows have
// SharedInputSpareColumns spare columns, as GEMMs over the widened rows; packed: one GEMM for
// all the layers (equally wide, no biases), with `rotary` (or null) rotating the first two.
variable_list ApplyLoraWideGroup(const at::Tensor& x, at::TensorList a, at::TensorList b,
                                 const std::vector<const LinearLayer*>* group, bool value_unused,
                                 bool packed, const SharedInputRotary* rotary,
                                 const NormedInput* normed);

}  // namespace qlora::engine::linear4bit_internal
