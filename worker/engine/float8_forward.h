// The frozen base's forward GEMMs in FP8 (quantization.float8_base_forward, opt-in): where a
// 4-bit weight is marked (FrozenWeight::float8_forward), the forward of its layer computes
// x W^T from FP8 rows of x and of W with one scale per row (kernels/float8.h) on FP8 tensor
// cores, then, where the layer has an adapter, adds scale (x A^T) B^T in the compute dtype.
// Everything else stays as it was: the adapters, their gradients, the input gradient's GEMM over
// the bf16 weight (the forward's rounding is not differentiated: the gradient is the bf16 path's
// at the FP8 forward's activations), norms, attention and the loss. The widened GEMMs
// ([x | x A^T][W | s B]^T) run as these two GEMMs instead.
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>

#include "kernels/float8.h"
#include "worker/engine/linear4bit.h"

namespace qlora::engine {

// Whether w's forward over x runs in FP8: marked, bfloat16 rows, shapes the FP8 GEMM takes.
bool RunsFloat8(const FrozenWeight& w, const at::Tensor& x);
// The same for the codes q of a weight marked `float8` (a layer without an adapter: its node
// has the codes alone).
bool RunsFloat8(const kernels::Quantized4bit& q, bool float8, const at::Tensor& x);

// x [..., in] W^T [..., out] in x's dtype for the 4-bit W `q` in FP8 (from `held`'s rows where
// defined: its dequantized view).
at::Tensor Float8Linear(const at::Tensor& x, const kernels::Quantized4bit& q,
                        const at::Tensor& held);

// The FP8 rows of the 4-bit weight q [out, in]: from `held` (its dequantized view, whose first
// `in` columns they are) where defined, else from its codes.
kernels::Float8Rows Float8WeightRows(const kernels::Quantized4bit& q, const at::Tensor& held);

// The FP8 rows of weights stacked [sum of out, in] (one weight: its own): from the held
// dequantized rows where `held` is defined (DequantizedRows' buffer, whose first `in` columns
// they are), else from each weight's codes.
kernels::Float8Rows Float8Weights(const std::vector<const FrozenWeight*>& weights,
                                  const at::Tensor& held = at::Tensor());

// x W^T [T, sum of out] in x's dtype for rows x [T, in] (any row stride): the weights' FP8
// GEMM, one for all of them; into `into` where given (rows of a wider buffer: Float8Matmul).
at::Tensor Float8Forward(const at::Tensor& x, const std::vector<const FrozenWeight*>& weights,
                         const at::Tensor& held = at::Tensor(),
                         const at::Tensor& into = at::Tensor());
// The same from x's FP8 rows (one quantization for the several layers that read x).
at::Tensor Float8Forward(const kernels::Float8Rows& x8, at::ScalarType dtype,
                         const std::vector<const FrozenWeight*>& weights,
                         const at::Tensor& held = at::Tensor(),
                         const at::Tensor& into = at::Tensor());

// A weight's dequantized view (FrozenWeight::dequantized) where it is held in `dtype`
// (dequantized_layers.h), else undefined.
at::Tensor HeldRows(const at::Tensor& dequantized, at::ScalarType dtype);

}  // namespace qlora::engine
