// The autograd functions of fused_ops.h.
#include "worker/engine/fused_ops.h"

#include <torch/csrc/autograd/custom_function.h>

#include "kernels/fused_elementwise.h"

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
    ctx->save_for_backward({gate, up});
    return kernels::SwigluForward(gate, up);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const at::Tensor& grad = grad_outputs[0];
    if (!grad.defined()) return {at::Tensor(), at::Tensor()};
    const variable_list saved = ctx->get_saved_variables();
    auto [grad_gate, grad_up] = kernels::SwigluBackward(grad, saved[0], saved[1]);
    return {grad_gate, grad_up};
  }
};

struct SumGraphOnlyFunction : public torch::autograd::Function<SumGraphOnlyFunction> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& a, const at::Tensor& b) {
    return at::empty_like(a);
  }
  static variable_list backward(AutogradContext*, variable_list grad_outputs) {
    return {grad_outputs[0], grad_outputs[0]};
  }
};

}  // namespace

at::Tensor Rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return RotaryFunction::apply(x, cos, sin);
}

at::Tensor Swiglu(const at::Tensor& gate, const at::Tensor& up) {
  return SwigluFunction::apply(gate, up);
}

at::Tensor SumGraphOnly(const at::Tensor& a, const at::Tensor& b) {
  return SumGraphOnlyFunction::apply(a, b);
}

}  // namespace qlora::engine
