// Entry points of fused_elementwise.h: the ATen formulas (CPU, and the fallback) and dispatch to
// the CUDA kernels.
#include "kernels/fused_elementwise.h"

#include <vector>

#include <ATen/ATen.h>

#include "kernels/fused_elementwise_backend.h"
#include "kernels/quantize_4bit.h"

namespace qlora::kernels {
namespace {

at::Tensor RotateHalf(const at::Tensor& x) {  // cat(-x2, x1)
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

at::Tensor RotateHalfTransposed(const at::Tensor& z) {  // cat(z2, -z1): rotate_half's adjoint
  const int64_t half = z.size(-1) / 2;
  return at::cat({z.narrow(-1, half, half), -z.narrow(-1, 0, half)}, -1);
}

bool OnCuda(const at::Tensor& t) { return t.is_cuda() && HasCudaKernels(); }

// Whether the CUDA kernels may read t, or write over it, as it is: contiguous, or rows
// [rows, cols] of a wider buffer (unit column stride).
bool RowsInPlace(const at::Tensor& t) {
  return t.is_contiguous() || (t.dim() == 2 && t.stride(1) == 1 && t.stride(0) >= t.size(1));
}

// t as the CUDA kernels read it: itself where RowsInPlace, else a contiguous copy.
at::Tensor Rows(const at::Tensor& t) { return RowsInPlace(t) ? t : t.contiguous(); }

// out = the rotation of x (out may be x itself: each value is read before it is written).
void RotaryInto(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool backward,
                at::Tensor& out) {
  TORCH_CHECK(x.dim() == 4 && x.size(-1) % 2 == 0,
              "rotary: x must be [batch, heads, seq, even dim], got ", x.sizes());
  TORCH_CHECK(cos.scalar_type() == x.scalar_type() && sin.scalar_type() == x.scalar_type(),
              "rotary: cos and sin must have x's dtype");
  if (OnCuda(x)) {
#ifdef QLORA_HAVE_CUDA
    if (cuda::Rotary({{x, true}}, cos.expand(x.sizes()), sin.expand(x.sizes()), backward, out)) {
      return;
    }
#endif
  }
  out.copy_(backward ? x * cos + RotateHalfTransposed(x * sin) : x * cos + RotateHalf(x) * sin);
}

at::Tensor Rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                  bool backward) {
  at::Tensor out = at::empty_like(x);
  RotaryInto(x, cos, sin, backward, out);
  return out;
}

}  // namespace

at::Tensor RotaryForward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return Rotary(x, cos, sin, /*backward=*/false);
}

at::Tensor RotaryBackward(const at::Tensor& grad_out, const at::Tensor& cos,
                          const at::Tensor& sin) {
  return Rotary(grad_out, cos, sin, /*backward=*/true);
}

void RotaryBackwardInto(const at::Tensor& grad_out, const at::Tensor& cos, const at::Tensor& sin,
                        at::Tensor& out) {
  TORCH_CHECK(out.sizes() == grad_out.sizes() && out.scalar_type() == grad_out.scalar_type(),
              "rotary: out must have grad_out's shape and dtype");
  RotaryInto(grad_out, cos, sin, /*backward=*/true, out);
}

void RotaryForwardInPlace(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  RotaryInto(x, cos, sin, /*backward=*/false, x);
}

void RotaryBackwardAndCopyInto(at::TensorList rotated, const at::Tensor& copied,
                               const at::Tensor& cos, const at::Tensor& sin, at::Tensor& out) {
  TORCH_CHECK(out.dim() == 4, "rotary: out must be [batch, heads, seq, dim], got ", out.sizes());
  std::vector<at::Tensor> parts(rotated.begin(), rotated.end());
  if (copied.defined()) parts.push_back(copied);
  int64_t heads = 0;
  for (const at::Tensor& p : parts) {
    TORCH_CHECK(p.dim() == 4 && p.size(0) == out.size(0) && p.size(2) == out.size(2) &&
                    p.size(3) == out.size(3) && p.scalar_type() == out.scalar_type(),
                "rotary: each part must be [batch, heads_i, seq, dim] of out's ", out.sizes(),
                " and dtype, got ", p.sizes());
    heads += p.size(1);
  }
  TORCH_CHECK(heads == out.size(1), "rotary: the parts' heads (", heads, ") must be out's (",
              out.size(1), ")");
#ifdef QLORA_HAVE_CUDA
  if (OnCuda(out)) {  // cuda::Rotary takes up to three parts
    std::vector<cuda::RotaryPart> cuda_parts;
    for (size_t i = 0; i < parts.size(); ++i) cuda_parts.push_back({parts[i], i < rotated.size()});
    if (cuda::Rotary(cuda_parts, cos.expand(out.sizes()), sin.expand(out.sizes()),
                     /*backward=*/true, out)) {
      return;
    }
  }
#endif
  int64_t head = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    at::Tensor into = out.narrow(1, head, parts[i].size(1));
    if (i < rotated.size()) {
      RotaryBackwardInto(parts[i], cos, sin, into);
    } else {
      into.copy_(parts[i]);
    }
    head += parts[i].size(1);
  }
}

void CastScalingLeadingRows(const at::Tensor& in, const at::Tensor& out, int64_t rows,
                            const at::Tensor& scale) {
  const int64_t cols = scale.numel();
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.numel() == in.numel() &&
                  out.is_contiguous() && in.is_contiguous(),
              "cast scaling leading rows: contiguous in and float32 out of one numel expected");
  TORCH_CHECK(scale.dim() == 1 && scale.scalar_type() == in.scalar_type() && rows >= 0 &&
                  rows * cols <= in.numel(),
              "cast scaling leading rows: scale must be 1-D in in's dtype and [rows, ",
              cols, "] within in, got rows ", rows);
  if (OnCuda(in)) {
#ifdef QLORA_HAVE_CUDA
    if (cuda::CastScalingLeadingRows(in, out, rows * cols, scale)) return;
#endif
  }
  at::Tensor o = out;
  o.copy_(in);
  if (rows > 0) o.view({-1}).narrow(0, 0, rows * cols).view({rows, cols}).mul_(scale);
}

void ScaleInPlace(const at::Tensor& x, const at::Tensor& factor) {
  const at::ScalarType dtype = x.scalar_type();
  TORCH_CHECK(
      x.is_contiguous() && (dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16),
      "scale in place: contiguous float32, float16 or bfloat16 x expected");
  TORCH_CHECK(
      factor.numel() == 1 && factor.scalar_type() == at::kFloat && factor.device() == x.device(),
      "scale in place: the factor must be one float32 value on x's device");
  if (x.numel() == 0) return;
  if (OnCuda(x)) {
#ifdef QLORA_HAVE_CUDA
    if (cuda::ScaleInPlace(x, factor)) return;
#endif
  }
  x.copy_(x.to(at::kFloat).mul_(factor.reshape({})));
}

at::Tensor SwigluForward(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(gate.sizes() == up.sizes() && gate.scalar_type() == up.scalar_type(),
              "swiglu: gate and up must have one shape and dtype");
  if (OnCuda(gate)) {
#ifdef QLORA_HAVE_CUDA
    at::Tensor out = at::empty(gate.sizes(), gate.options());
    if (cuda::SwigluForward(Rows(gate), Rows(up), out)) return out;
#endif
  }
  return at::silu(gate) * up;
}

at::Tensor SwigluForwardWithSpareColumns(const at::Tensor& gate, const at::Tensor& up,
                                         int64_t spare) {
  TORCH_CHECK(gate.dim() == 2 && gate.sizes() == up.sizes() &&
                  gate.scalar_type() == up.scalar_type() && spare >= 0,
              "swiglu: gate and up must be [rows, cols] of one dtype, got ", gate.sizes(), " and ",
              up.sizes());
  at::Tensor out =
      at::empty({gate.size(0), gate.size(1) + spare}, gate.options()).narrow(1, 0, gate.size(1));
  if (OnCuda(gate)) {
#ifdef QLORA_HAVE_CUDA
    if (cuda::SwigluForward(Rows(gate), Rows(up), out)) return out;
#endif
  }
  out.copy_(at::silu(gate) * up);
  return out;
}

std::pair<at::Tensor, at::Tensor> SwigluBackward(const at::Tensor& grad_out,
                                                 const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(grad_out.sizes() == gate.sizes() && gate.sizes() == up.sizes(),
              "swiglu: the gradient, gate and up must have one shape");
  if (OnCuda(gate) && grad_out.scalar_type() == gate.scalar_type()) {
#ifdef QLORA_HAVE_CUDA
    // Rows of wider buffers (packed gate/up) are read where they lie.
    const at::Tensor g = Rows(grad_out), a = Rows(gate), b = Rows(up);
    at::Tensor grad_gate = at::empty(gate.sizes(), gate.options());
    at::Tensor grad_up = at::empty(up.sizes(), up.options());
    if (cuda::SwigluBackward(g, a, b, grad_gate, grad_up)) return {grad_gate, grad_up};
#endif
  }
  // What autograd computes for at::silu(gate) * up: MulBackward0, then SiluBackward0.
  const at::Tensor grad_up = grad_out * at::silu(gate);
  const at::Tensor grad_gate = at::silu_backward(grad_out * up, gate);
  return {grad_gate, grad_up};
}

namespace {

// SwiGLU's backward into grad_gate and grad_up (each any of grad_out, gate and up, written in
// place, or a buffer of its own: contiguous or rows), and the forward's output into `product`
// where asked: the CUDA kernel where it takes the tensors, else the formula (the product first,
// before anything is overwritten).
void SwigluBackwardInto(const at::Tensor& grad_out, const at::Tensor& gate, const at::Tensor& up,
                        at::Tensor& grad_gate, at::Tensor& grad_up, at::Tensor* product) {
  TORCH_CHECK(grad_out.sizes() == gate.sizes() && gate.sizes() == up.sizes(),
              "swiglu: the gradient, gate and up must have one shape");
  TORCH_CHECK(RowsInPlace(grad_gate) && RowsInPlace(grad_up),
              "swiglu: gradients written in place need contiguous buffers or rows of one");
  if (OnCuda(gate) && grad_out.scalar_type() == gate.scalar_type() &&
      up.scalar_type() == gate.scalar_type()) {
#ifdef QLORA_HAVE_CUDA
    at::Tensor x = product != nullptr ? at::empty(gate.sizes(), gate.options()) : at::Tensor();
    if (cuda::SwigluBackward(Rows(grad_out), Rows(gate), Rows(up), grad_gate, grad_up,
                             product != nullptr ? &x : nullptr)) {
      if (product != nullptr) *product = std::move(x);
      return;
    }
#endif
  }
  if (product != nullptr) *product = SwigluForward(gate, up);
  auto [dg, du] = SwigluBackward(grad_out, gate, up);
  grad_gate.copy_(dg);
  grad_up.copy_(du);
}

}  // namespace

at::Tensor SwigluBackwardInPlace(at::Tensor& grad_out, const at::Tensor& gate,
                                 const at::Tensor& up, at::Tensor* product) {
  at::Tensor grad_up = at::empty(up.sizes(), up.options());
  SwigluBackwardInto(grad_out, gate, up, grad_out, grad_up, product);
  return grad_up;
}

void SwigluBackwardOverInputs(at::Tensor& grad_out, const at::Tensor& gate, at::Tensor& up,
                              at::Tensor* product) {
  SwigluBackwardInto(grad_out, gate, up, grad_out, up, product);
}

void SwigluBackwardIntoInputs(const at::Tensor& grad_out, at::Tensor& gate, at::Tensor& up,
                              at::Tensor* product) {
  SwigluBackwardInto(grad_out, gate, up, gate, up, product);
}

}  // namespace qlora::kernels
