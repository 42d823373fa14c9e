// Entry points of rms_norm.h: the ATen formulas (CPU, and the fallback) and dispatch to the CUDA
// kernels.
#include "kernels/rms_norm.h"

#include <ATen/ATen.h>

#include "kernels/quantize_4bit.h"
#include "kernels/rms_norm_backend.h"

namespace qlora::kernels {
namespace {

bool OnCuda(const at::Tensor& t) { return t.is_cuda() && HasCudaKernels(); }

at::Tensor Rows(const at::Tensor& t) { return t.reshape({-1, t.size(-1)}); }

}  // namespace

ResidualRmsNormResult ResidualRmsNormForward(const at::Tensor& x, const at::Tensor& delta,
                                             const at::Tensor& weight, double eps) {
  TORCH_CHECK(!delta.defined() ||
                  (x.sizes() == delta.sizes() && x.scalar_type() == delta.scalar_type()),
              "residual rms_norm: x and delta must have one shape and dtype");
  TORCH_CHECK(weight.dim() == 1 && x.dim() >= 1 && weight.size(0) == x.size(-1) &&
                  weight.scalar_type() == x.scalar_type(),
              "residual rms_norm: weight must be [", x.size(-1), "] in x's dtype");
  std::vector<int64_t> row_shape = x.sizes().vec();
  row_shape.pop_back();
  if (OnCuda(x)) {
#ifdef QLORA_HAVE_CUDA
    const at::Tensor xr = Rows(x).contiguous();
    const at::Tensor dr = delta.defined() ? Rows(delta).contiguous() : at::Tensor();
    ResidualRmsNormResult r{delta.defined() ? at::empty_like(xr) : xr, at::empty_like(xr),
                            at::empty({xr.size(0)}, xr.options().dtype(at::kFloat))};
    if (cuda::ResidualRmsNormForward(xr, dr, weight.contiguous(), static_cast<float>(eps), r.h,
                                     r.n, r.rstd)) {
      return {delta.defined() ? r.h.view(x.sizes()) : x, r.n.view(x.sizes()),
              r.rstd.view(row_shape)};
    }
#endif
  }
  ResidualRmsNormResult r;
  r.h = delta.defined() ? x + delta : x;
  r.n = at::rms_norm(r.h, {r.h.size(-1)}, weight, eps);
  r.rstd = at::rsqrt(r.h.to(at::kFloat).pow(2).mean(-1) + eps);
  return r;
}

at::Tensor RmsNormBackward(const at::Tensor& grad_n, const at::Tensor& h, const at::Tensor& rstd,
                           const at::Tensor& weight, const at::Tensor& grad_h) {
  TORCH_CHECK(grad_n.sizes() == h.sizes() && (!grad_h.defined() || grad_h.sizes() == h.sizes()),
              "rms_norm backward: the gradients must have h's shape");
  TORCH_CHECK(rstd.numel() * h.size(-1) == h.numel() && rstd.scalar_type() == at::kFloat,
              "rms_norm backward: rstd must be float32, one per row");
  const bool same_dtype = grad_n.scalar_type() == h.scalar_type() &&
                          weight.scalar_type() == h.scalar_type() &&
                          (!grad_h.defined() || grad_h.scalar_type() == h.scalar_type());
  if (OnCuda(h) && same_dtype) {
#ifdef QLORA_HAVE_CUDA
    const at::Tensor hr = Rows(h).contiguous();
    at::Tensor dx = at::empty_like(hr);
    if (cuda::RmsNormBackward(Rows(grad_n).contiguous(), hr, rstd.reshape({-1}).contiguous(),
                              weight.contiguous(),
                              grad_h.defined() ? Rows(grad_h).contiguous() : at::Tensor(), dx)) {
      return dx.view(h.sizes());
    }
#endif
  }
  const at::Tensor hf = h.to(at::kFloat), r = rstd.unsqueeze(-1);
  const at::Tensor wdn = grad_n.to(at::kFloat) * weight.to(at::kFloat);
  at::Tensor dx = r * wdn - hf * r.pow(3) * (wdn * hf).mean(-1, /*keepdim=*/true);
  if (grad_h.defined()) dx = dx + grad_h.to(at::kFloat);
  return dx.to(h.scalar_type());
}

}  // namespace qlora::kernels
