// Linear4bitFunction: y = x W^T with a 4-bit W, dequantized in forward and again in backward
// (linear4bit.h's Linear4bit; reached through linear4bit_internal.h's ApplyLinear4bit).
#include <ATen/core/Tensor.h>
#include <ATen/ops/matmul.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <vector>

#include "kernels/quantize_4bit.h"
#include "kernels/tuned_gemm.h"
#include "worker/engine/float8_forward.h"
#include "worker/engine/fused_ops.h"
#include "worker/engine/linear4bit.h"
#include "worker/engine/linear4bit_internal.h"

namespace qlora::engine::linear4bit_internal {
namespace {

// x [..., k] b [k, n] as [..., n], through the tuner when there is one.
at::Tensor Matmul(kernels::GemmTuner* gemm, const at::Tensor& x, const at::Tensor& b) {
  if (gemm == nullptr) return at::matmul(x, b);
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = b.size(1);
  return Mm(gemm, x.reshape({-1, x.size(-1)}), b).view(sizes);
}

// The weight in dtype: `dequantized` where it is one of that dtype (dequantized_layers.h), else
// dequantized (a temporary).
at::Tensor KeptOrDequantized(const at::Tensor& dequantized, const kernels::Quantized4bit& q,
                                 at::ScalarType dtype) {
  const at::Tensor held = HeldRows(dequantized, dtype);
  return held.defined() ? held : DequantizeWeight(q, dtype);
}

// dequantized: the weight kept dequantized (FrozenWeight::dequantized), or null / undefined;
// float8: its forward GEMM in FP8 where it can run so (float8_forward.h).
struct Linear4bitFunction : public torch::autograd::Function<Linear4bitFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const kernels::Quantized4bit* weight, bool value_unused,
                            kernels::GemmTuner* gemm, const at::Tensor* dequantized, bool float8) {
    Save(ctx, *weight);
    SaveGemm(ctx, gemm);
    const at::Tensor held = dequantized != nullptr ? *dequantized : at::Tensor();
    if (held.defined()) ctx->saved_data["dequantized"] = held;
    ctx->saved_data["compute_dtype"] = static_cast<int64_t>(x.scalar_type());
    if (value_unused) {  // only the graph is used: backward needs W alone
      std::vector<int64_t> sizes = x.sizes().vec();
      sizes.back() = weight->shape[0];
      return ValueUnused(sizes, x.options());
    }
    if (RunsFloat8(*weight, float8, x)) {
      return Float8Linear(x, *weight, HeldRows(held, x.scalar_type()));
    }
    return Matmul(gemm, x, KeptOrDequantized(held, *weight, x.scalar_type()).t());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["compute_dtype"].toInt());
    const at::Tensor& grad = grad_outputs[0];
    at::Tensor grad_x;
    if (grad.defined() && ctx->needs_input_grad(0)) {
      auto held = ctx->saved_data.find("dequantized");
      grad_x = Matmul(SavedGemm(ctx), grad.to(dtype),
                      KeptOrDequantized(
                          held != ctx->saved_data.end() ? held->second.toTensor() : at::Tensor(),
                          FromSaved(ctx), dtype));
    }
    return {grad_x, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor ApplyLinear4bit(const at::Tensor& x, const kernels::Quantized4bit* weight,
                           bool value_unused, kernels::GemmTuner* gemm,
                           const at::Tensor* dequantized, bool float8) {
  return Linear4bitFunction::apply(x, weight, value_unused, gemm, dequantized, float8);
}

}  // namespace qlora::engine::linear4bit_internal
