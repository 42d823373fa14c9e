// Shared by the kernels' CUDA files: the float32 arithmetic of SwiGLU as ATen rounds it (silu and
// silu_backward of ActivationSiluKernel.cu, each op's result stored in the tensor dtype), so that
// every kernel computing SwiGLU or its gradient gives the same bits.
#pragma once

namespace qlora::kernels::cuda {

// A float32 value stored as T: what ATen keeps between two ops.
template <typename T>
__device__ __forceinline__ float Round(float x) {
  return static_cast<float>(static_cast<T>(x));
}

// ATen's silu and silu_backward (ActivationSiluKernel.cu), in float32.
__device__ __forceinline__ float Silu(float x) { return x / (1.0f + ::expf(-x)); }
__device__ __forceinline__ float SiluBackward(float dy, float x) {
  const float s = 1.0f / (1.0f + ::expf(-x));
  return dy * s * (1.0f + x * (1.0f - s));
}

// dg, du for the output gradient dy; and x = silu(g) * u as SwigluForwardKernel rounds it.
template <typename T>
__device__ __forceinline__ void SwigluBackwardOne(T dy, T g, T u, T& dg, T& du, T& x) {
  const float fdy = static_cast<float>(dy), fg = static_cast<float>(g);
  const float silu = Round<T>(Silu(fg));
  du = static_cast<T>(__fmul_rn(fdy, silu));
  x = static_cast<T>(__fmul_rn(silu, static_cast<float>(u)));
  const float dsilu = Round<T>(__fmul_rn(fdy, static_cast<float>(u)));
  dg = static_cast<T>(SiluBackward(dsilu, fg));
}

}  // namespace qlora::kernels::cuda
