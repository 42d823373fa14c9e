// Linear4bit's autograd function, frozen weights and the LoRA branch.
#include "worker/engine/linear4bit.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <vector>

namespace qlora::engine {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Rebuilds the kernels' descriptor from what forward saved in the context.
kernels::Quantized4bit FromSaved(AutogradContext* ctx) {
  const auto& s = ctx->saved_data;
  kernels::Quantized4bit q;
  q.packed = s.at("packed").toTensor();
  q.absmax = s.at("absmax").toTensor();
  q.double_quant = s.at("double_quant").toBool();
  if (q.double_quant) {
    q.nested_absmax = s.at("nested_absmax").toTensor();
    q.nested_code = s.at("nested_code").toTensor();
    q.nested_offset = static_cast<float>(s.at("nested_offset").toDouble());
    q.nested_blocksize = s.at("nested_blocksize").toInt();
  }
  q.type = static_cast<kernels::QuantType>(s.at("type").toInt());
  q.blocksize = s.at("blocksize").toInt();
  q.shape = s.at("shape").toIntVector();
  q.dtype = static_cast<at::ScalarType>(s.at("dtype").toInt());
  return q;
}

void Save(AutogradContext* ctx, const kernels::Quantized4bit& q) {
  auto& s = ctx->saved_data;
  // Frozen tensors: saving them in saved_data keeps a reference, not a copy.
  s["packed"] = q.packed;
  s["absmax"] = q.absmax;
  s["double_quant"] = q.double_quant;
  if (q.double_quant) {
    s["nested_absmax"] = q.nested_absmax;
    s["nested_code"] = q.nested_code;
    s["nested_offset"] = static_cast<double>(q.nested_offset);
    s["nested_blocksize"] = q.nested_blocksize;
  }
  s["type"] = static_cast<int64_t>(q.type);
  s["blocksize"] = q.blocksize;
  s["shape"] = q.shape;
  s["dtype"] = static_cast<int64_t>(q.dtype);
}

struct Linear4bitFunction : public torch::autograd::Function<Linear4bitFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const kernels::Quantized4bit* weight) {
    Save(ctx, *weight);
    ctx->saved_data["compute_dtype"] = static_cast<int64_t>(x.scalar_type());
    // The dequantized weight is a temporary: freed when this scope ends.
    return at::linear(x, DequantizeWeight(*weight, x.scalar_type()));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["compute_dtype"].toInt());
    const at::Tensor& grad = grad_outputs[0];
    at::Tensor grad_x;
    if (grad.defined()) grad_x = at::matmul(grad.to(dtype), DequantizeWeight(FromSaved(ctx), dtype));
    return {grad_x, at::Tensor()};
  }
};

}  // namespace

kernels::Quantized4bit QuantizeWeight(const at::Tensor& weight,
                                      const kernels::Quantize4bitOptions& options) {
  return kernels::Quantize4bit(weight, options);
}

at::Tensor DequantizeWeight(const kernels::Quantized4bit& q, at::ScalarType dtype) {
  return kernels::Dequantize4bit(q, dtype);
}

at::Tensor BitsandbytesQuantMap(kernels::QuantType type) { return kernels::SerializedQuantMap(type); }

at::Tensor Linear4bit(const at::Tensor& x, const kernels::Quantized4bit& weight) {
  return Linear4bitFunction::apply(x, &weight);
}

at::Tensor FrozenWeight::Materialize(at::ScalarType dtype) const {
  return quantized ? DequantizeWeight(*quantized, dtype) : dense.to(dtype);
}

at::Tensor FrozenWeight::Apply(const at::Tensor& x) const {
  if (quantized) return Linear4bit(x, *quantized);
  return at::linear(x, dense.scalar_type() == x.scalar_type() ? dense : dense.to(x.scalar_type()));
}

at::Tensor LinearLayer::Forward(const at::Tensor& x, bool training) const {
  if (!lora) return base.Apply(x);
  const at::ScalarType dtype = x.scalar_type();
  std::vector<int64_t> out_sizes = x.sizes().vec();
  out_sizes.back() = base.out_features;
  // Rows of tokens: the base output is then a fresh 2-D tensor that the LoRA GEMM may update in
  // place.
  const at::Tensor x2 = x.reshape({-1, x.size(-1)});
  at::Tensor y = base.Apply(x2);
  const at::Tensor h = lora->dropout > 0 ? at::dropout(x2, lora->dropout, training) : x2;
  // y += scale * (h A^T) B^T as one GEMM accumulating into y in place (beta = 1, alpha = scale):
  // no separate scale and add passes over the [tokens, out] activations, forward or backward,
  // and no copy of y (out-of-place addmm copies its addend into the result first). Neither the
  // base's node nor the GEMM's saves y, so updating it in place leaves every gradient as is.
  const at::Tensor ha = at::linear(h, lora->a.to(dtype));
  y.addmm_(ha, lora->b.to(dtype).t(), 1, lora->scale);
  return y.view(out_sizes);
}

at::Tensor LinearLayer::MergedWeight() const {
  at::Tensor w = base.Materialize(at::kFloat);
  if (lora) w = w + at::matmul(lora->b.detach().to(at::kFloat), lora->a.detach().to(at::kFloat)) * lora->scale;
  return w;
}

}  // namespace qlora::engine
