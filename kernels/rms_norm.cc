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

// Uninitialized [rows, dim] like `rows`, as the first dim columns of [rows, dim + spare].
at::Tensor WideRows(const at::Tensor& rows, int64_t spare) {
  const int64_t dim = rows.size(1);
  return at::empty({rows.size(0), dim + spare}, rows.options()).narrow(1, 0, dim);
}

// [rows, dim] (row-strided) viewed in like's shape [..., dim].
at::Tensor InShapeOf(const at::Tensor& rows, const at::Tensor& like) {
  std::vector<int64_t> strides(like.dim(), 1);
  if (like.dim() >= 2) strides[like.dim() - 2] = rows.stride(0);
  for (int64_t d = like.dim() - 3; d >= 0; --d) strides[d] = strides[d + 1] * like.size(d + 1);
  return rows.as_strided(like.sizes(), strides);
}

// [rows, dim] of t: a view where t's rows have unit column stride and evenly spaced rows (the
// kernel takes a row stride), else a contiguous copy.
at::Tensor RowsInPlace(const at::Tensor& t) {
  if (t.dim() >= 1 && t.stride(-1) == 1) {
    bool even = true;
    for (int64_t d = t.dim() - 2; d >= 1; --d) {
      even = even && (t.size(d) == 1 || t.stride(d - 1) == t.stride(d) * t.size(d));
    }
    if (even) return t.view({-1, t.size(-1)});
  }
  return Rows(t).contiguous();
}

}  // namespace

ResidualRmsNormResult ResidualRmsNormForward(const at::Tensor& x, const at::Tensor& delta,
                                             const at::Tensor& weight, double eps,
                                             int64_t spare_columns) {
  TORCH_CHECK(spare_columns >= 0, "residual rms_norm: spare_columns must be >= 0");
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
    ResidualRmsNormResult r{delta.defined() ? at::empty_like(xr) : xr, WideRows(xr, spare_columns),
                            at::empty({xr.size(0)}, xr.options().dtype(at::kFloat))};
    if (cuda::ResidualRmsNormForward(xr, dr, weight.contiguous(), static_cast<float>(eps), r.h,
                                     r.n, r.rstd)) {
      return {delta.defined() ? r.h.view(x.sizes()) : x, InShapeOf(r.n, x),
              r.rstd.view(row_shape)};
    }
#endif
  }
  ResidualRmsNormResult r;
  r.h = delta.defined() ? x + delta : x;
  r.n = at::rms_norm(r.h, {r.h.size(-1)}, weight, eps);
  r.rstd = at::rsqrt(r.h.to(at::kFloat).pow(2).mean(-1) + eps);
  if (spare_columns > 0) {
    const at::Tensor rows = WideRows(Rows(r.n), spare_columns);
    rows.copy_(Rows(r.n));
    r.n = InShapeOf(rows, x);
  }
  return r;
}

at::Tensor RmsNormBackward(const at::Tensor& grad_n, const at::Tensor& h, const at::Tensor& rstd,
                           const at::Tensor& weight, const at::Tensor& grad_h,
                           int64_t dx_spare_columns) {
  TORCH_CHECK(dx_spare_columns >= 0, "rms_norm backward: dx_spare_columns must be >= 0");
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
    at::Tensor dx = WideRows(hr, dx_spare_columns);
    if (cuda::RmsNormBackward(RowsInPlace(grad_n), hr, rstd.reshape({-1}).contiguous(),
                              weight.contiguous(),
                              grad_h.defined() ? RowsInPlace(grad_h) : at::Tensor(), dx)) {
      return InShapeOf(dx, h);
    }
#endif
  }
  const at::Tensor hf = h.to(at::kFloat), r = rstd.unsqueeze(-1);
  const at::Tensor wdn = grad_n.to(at::kFloat) * weight.to(at::kFloat);
  at::Tensor dx = r * wdn - hf * r.pow(3) * (wdn * hf).mean(-1, /*keepdim=*/true);
  if (grad_h.defined()) dx = dx + grad_h.to(at::kFloat);
  dx = dx.to(h.scalar_type());
  if (dx_spare_columns == 0) return dx;
  const at::Tensor rows = WideRows(Rows(dx), dx_spare_columns);
  rows.copy_(Rows(dx));
  return InShapeOf(rows, h);
}

}  // namespace qlora::kernels
