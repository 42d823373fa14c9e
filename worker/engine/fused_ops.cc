// The autograd functions of fused_ops.h.
#include "worker/engine/fused_ops.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <c10/core/WrapDimMinimal.h>
#include <torch/csrc/autograd/custom_function.h>

#include "kernels/fused_elementwise.h"
#include "kernels/rms_norm.h"
#include "worker/engine/activation_offload.h"

namespace qlora::engine {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct RotaryFunction : public torch::autograd::Function<RotaryFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& sin) {
    ctx->saved_data["cos"] = cos;  // constants: kept by reference, never differentiated
    ctx->saved_data["sin"] = sin;
    return kernels::RotaryForward(x, cos, sin);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const at::Tensor& grad = grad_outputs[0];
    at::Tensor grad_x;
    if (grad.defined()) {
      grad_x = kernels::RotaryBackward(grad, ctx->saved_data["cos"].toTensor(),
                                       ctx->saved_data["sin"].toTensor());
    }
    return {grad_x, at::Tensor(), at::Tensor()};
  }
};

struct SwigluFunction : public torch::autograd::Function<SwigluFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    SaveForBackward(ctx, {gate, up});
    return kernels::SwigluForward(gate, up);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const at::Tensor& grad = grad_outputs[0];
    const variable_list saved = SavedForBackward(ctx);
    if (!grad.defined()) return {at::Tensor(), at::Tensor()};
    auto [grad_gate, grad_up] = kernels::SwigluBackward(grad, saved[0], saved[1]);
    return {grad_gate, grad_up};
  }
};

struct SumGraphOnlyFunction : public torch::autograd::Function<SumGraphOnlyFunction> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& a, const at::Tensor& b) {
    return ValueUnused(a.sizes(), a.options());
  }
  static variable_list backward(AutogradContext*, variable_list grad_outputs) {
    return {grad_outputs[0], grad_outputs[0]};
  }
};

struct CatGraphOnlyFunction : public torch::autograd::Function<CatGraphOnlyFunction> {
  static at::Tensor forward(AutogradContext* ctx, at::TensorList parts, int64_t dim) {
    dim = c10::maybe_wrap_dim(dim, parts.front().dim());
    std::vector<int64_t> sizes;
    sizes.reserve(parts.size());
    for (const at::Tensor& part : parts) sizes.push_back(part.size(dim));
    ctx->saved_data["sizes"] = sizes;
    ctx->saved_data["dim"] = dim;
    std::vector<int64_t> joined = parts.front().sizes().vec();
    joined[dim] = 0;
    for (int64_t size : sizes) joined[dim] += size;
    return ValueUnused(joined, parts.front().options());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const std::vector<int64_t> sizes = ctx->saved_data["sizes"].toIntVector();
    variable_list grads(sizes.size() + 1);  // the last: dim's, none
    if (!grad_outputs[0].defined()) return grads;
    const variable_list split =
        grad_outputs[0].split_with_sizes(sizes, ctx->saved_data["dim"].toInt());
    std::copy(split.begin(), split.end(), grads.begin());
    return grads;
  }
};

// The gradient reaching x (and delta) of {h, rms_norm(h) * w}: the norm's plus h's own (either
// may be undefined: no gradient; both: an undefined result).
at::Tensor ResidualRmsNormGradient(AutogradContext* ctx, const variable_list& grad_outputs) {
  const at::Tensor &grad_h = grad_outputs[0], &grad_n = grad_outputs[1];
  const variable_list saved = SavedForBackward(ctx);
  if (!grad_n.defined()) return grad_h;
  return kernels::RmsNormBackward(grad_n, saved[0], saved[1], ctx->saved_data["weight"].toTensor(),
                                  grad_h, ctx->saved_data["grad_spare_columns"].toInt());
}

variable_list ResidualRmsNormOutputs(AutogradContext* ctx, const at::Tensor& x,
                                     const at::Tensor& delta, const at::Tensor& weight,
                                     double eps, int64_t spare_columns,
                                     int64_t grad_spare_columns) {
  kernels::ResidualRmsNormResult r =
      kernels::ResidualRmsNormForward(x, delta, weight, eps, spare_columns);
  ctx->saved_data["weight"] = weight;  // frozen: kept by reference, never differentiated
  ctx->saved_data["grad_spare_columns"] = grad_spare_columns;
  SaveForBackward(ctx, {r.h, r.rstd});
  ctx->mark_non_differentiable({r.rstd});
  // Outputs without a gradient (rstd's, always) reach backward undefined, not as zeros that
  // autograd fills a kernel each (one a layer, for nothing).
  ctx->set_materialize_grads(false);
  return {r.h, r.n, r.rstd};
}

struct ResidualRmsNormFunction : public torch::autograd::Function<ResidualRmsNormFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& delta,
                               const at::Tensor& weight, double eps, int64_t spare_columns,
                               int64_t grad_spare_columns) {
    return ResidualRmsNormOutputs(ctx, x, delta, weight, eps, spare_columns, grad_spare_columns);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const at::Tensor dx = ResidualRmsNormGradient(ctx, grad_outputs);  // rstd's is none
    return {dx, dx, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The same without delta: h is x itself (autograd returns it as a view of x).
struct RmsNormPassThroughFunction : public torch::autograd::Function<RmsNormPassThroughFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                               double eps, int64_t spare_columns, int64_t grad_spare_columns) {
    return ResidualRmsNormOutputs(ctx, x, at::Tensor(), weight, eps, spare_columns,
                                  grad_spare_columns);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    return {ResidualRmsNormGradient(ctx, grad_outputs), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor Rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return RotaryFunction::apply(x, cos, sin);
}

at::Tensor Swiglu(const at::Tensor& gate, const at::Tensor& up) {
  return SwigluFunction::apply(gate, up);
}

at::Tensor ValueUnused(at::IntArrayRef sizes, const at::TensorOptions& options) {
  return at::empty({1}, options).expand(sizes);
}

at::Tensor SumGraphOnly(const at::Tensor& a, const at::Tensor& b) {
  return SumGraphOnlyFunction::apply(a, b);
}

at::Tensor CatGraphOnly(const std::vector<at::Tensor>& parts, int64_t dim) {
  TORCH_CHECK(!parts.empty(), "CatGraphOnly needs a part");
  // As a TensorList: apply() takes each part as an input (a std::vector would be a constant).
  return CatGraphOnlyFunction::apply(at::TensorList(parts), dim);
}

NormedResidual ResidualRmsNorm(const at::Tensor& x, const at::Tensor& delta,
                               const at::Tensor& weight, double eps, int64_t spare_columns,
                               int64_t grad_spare_columns) {
  TORCH_CHECK(!weight.requires_grad(), "ResidualRmsNorm: the norm weight must be frozen");
  TORCH_CHECK(grad_spare_columns >= 0, "ResidualRmsNorm: grad_spare_columns must be >= 0");
  const variable_list out =
      delta.defined()
          ? ResidualRmsNormFunction::apply(x, delta, weight, eps, spare_columns, grad_spare_columns)
          : RmsNormPassThroughFunction::apply(x, weight, eps, spare_columns, grad_spare_columns);
  return {out[0], out[1], out[2]};
}

}  // namespace qlora::engine
