// Internal: the CUDA side of fused_elementwise.h (compiled only with QLORA_HAVE_CUDA). Each
// function returns false, touching nothing, when it does not take these tensors (dtype, device,
// layout), and the caller falls back to the ATen formula.
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>

namespace qlora::kernels::cuda {

// out [B, H, S, D] from up to three parts x_i [B, H_i, S, D] (H = the sum of H_i), side by side
// over the heads, each rotated or copied; unit last strides; cos, sin expanded to out's
// [B, H, S, D] (stride 0 where broadcast). backward: the x_i are the output's gradients and out
// the input's. One launch.
struct RotaryPart {
  at::Tensor x;
  bool rotate = true;
};
bool Rotary(const std::vector<RotaryPart>& parts, const at::Tensor& cos, const at::Tensor& sin,
            bool backward, at::Tensor& out);
// gate, up and out of one shape and dtype, each contiguous or 2-D rows [rows, cols] of a wider
// buffer (unit column stride, cols and the row stride multiples of 16 bytes: gate and up side by
// side in one packed buffer, out with spare columns).
bool SwigluForward(const at::Tensor& gate, const at::Tensor& up, at::Tensor& out);
// grad_gate and grad_up may be any of grad, gate and up themselves (written in place); each of
// the five is contiguous or rows as above; `product` (a contiguous buffer of its own, or null)
// gets SwigluForward's output.
bool SwigluBackward(const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up,
                    at::Tensor& grad_gate, at::Tensor& grad_up, at::Tensor* product = nullptr);


// CastScalingLeadingRows for contiguous in (bfloat16 or float16) and out (float32), scale in in's
// dtype (contiguous), scaled = rows * scale.numel() <= in.numel().
bool CastScalingLeadingRows(const at::Tensor& in, const at::Tensor& out, int64_t scaled,
                            const at::Tensor& scale);

// ScaleInPlace for contiguous x (float32, float16 or bfloat16), factor a float32 scalar on x's
// device.
bool ScaleInPlace(const at::Tensor& x, const at::Tensor& factor);

}  // namespace qlora::kernels::cuda
