// The CUDA side of float8.h: FP8 rows of activations and of 4-bit weights, one block per row
// (the row's maximum first, then its values; the second read of an activation row mostly hits
// L2). Values and scales equal float8.cc's CPU path bit for bit: the same float32 products
// (codes times absmax with subnormals flushed, as dequantization computes them), an IEEE
// division by the scale, and a saturating round-to-nearest-even conversion.
#include <cuda_fp8.h>

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "kernels/cuda_vectors.cuh"
#include "kernels/float8.h"
#include "kernels/float8_backend.h"
#include "kernels/quantize_4bit_math.h"

namespace qlora::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// The largest of every thread's v, in every thread.
__device__ __forceinline__ float BlockMax(float v) {
  __shared__ float warp_max[kThreads / 32];
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  const int lane = threadIdx.x & 31;
  if (lane == 0) warp_max[threadIdx.x >> 5] = v;
  __syncthreads();
  v = lane < kThreads / 32 ? warp_max[lane] : 0.0f;
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

__device__ __forceinline__ float ScaleOf(float amax) {
  return amax > 0.0f ? amax / kFloat8E4m3Max : 1.0f;
}

__device__ __forceinline__ uint8_t ToE4m3(float v) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

// Eight bytes as one 8-byte store.
__device__ __forceinline__ void Store8(uint8_t* out, const uint8_t (&b)[8]) {
  uint2 word;
  word.x = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
  word.y = b[4] | (b[5] << 8) | (b[6] << 16) | (static_cast<uint32_t>(b[7]) << 24);
  *reinterpret_cast<uint2*>(out) = word;
}

// 16-bit rows read 8 values (16 bytes) at a time: cols % 8 == 0, rows 16-byte aligned.
template <typename T>
__global__ void QuantizeRowsVectorKernel(const T* __restrict__ x, int64_t row_stride,
                                         int64_t cols, uint8_t* __restrict__ values,
                                         float* __restrict__ scales) {
  const T* in = x + blockIdx.x * row_stride;
  const int64_t chunks = cols / 8;
  float m = 0.0f;
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
    const Vec<T, 8> v = Load<T, 8>(in + c * 8);
#pragma unroll
    for (int k = 0; k < 8; ++k) m = fmaxf(m, fabsf(static_cast<float>(v.v[k])));
  }
  const float scale = ScaleOf(BlockMax(m));
  if (threadIdx.x == 0) scales[blockIdx.x] = scale;
  uint8_t* out = values + blockIdx.x * cols;
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
    const Vec<T, 8> v = Load<T, 8>(in + c * 8);
    uint8_t b[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) b[k] = ToE4m3(static_cast<float>(v.v[k]) / scale);
    Store8(out + c * 8, b);
  }
}

// Any other rows (float32, or unaligned): one value at a time.
template <typename T>
__global__ void QuantizeRowsScalarKernel(const T* __restrict__ x, int64_t row_stride,
                                         int64_t cols, uint8_t* __restrict__ values,
                                         float* __restrict__ scales) {
  const T* in = x + blockIdx.x * row_stride;
  float m = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    m = fmaxf(m, fabsf(static_cast<float>(in[c])));
  }
  const float scale = ScaleOf(BlockMax(m));
  if (threadIdx.x == 0) scales[blockIdx.x] = scale;
  uint8_t* out = values + blockIdx.x * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    out[c] = ToE4m3(static_cast<float>(in[c]) / scale);
  }
}

// A row of 4-bit codes (8 to a 32-bit word, the even element in a byte's high nibble) with its
// blocks' absmax.
__global__ void WeightRowsKernel(const uint32_t* __restrict__ words,
                                 const float* __restrict__ absmax, Codebook16 table,
                                 float table_max, int64_t cols, int64_t blocksize,
                                 uint8_t* __restrict__ values, float* __restrict__ scales) {
  __shared__ float lut[16];
  if (threadIdx.x < 16) lut[threadIdx.x] = table.v[threadIdx.x];
  const int64_t blocks = cols / blocksize, chunks = cols / 8;
  const float* a = absmax + blockIdx.x * blocks;
  float m = 0.0f;
  for (int64_t b = threadIdx.x; b < blocks; b += blockDim.x) m = fmaxf(m, a[b]);
  const float scale = ScaleOf(BlockMax(m) * table_max);  // BlockMax synchronizes: lut is set
  if (threadIdx.x == 0) scales[blockIdx.x] = scale;
  const uint32_t* row = words + blockIdx.x * chunks;
  uint8_t* out = values + blockIdx.x * cols;
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
    const uint32_t word = __ldg(row + c);
    const float block_absmax = __ldg(a + c * 8 / blocksize);
    uint8_t b[8];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t byte = (word >> (8 * k)) & 0xFFu;
      b[2 * k] = ToE4m3(math::MulFtz(lut[byte >> 4], block_absmax) / scale);
      b[2 * k + 1] = ToE4m3(math::MulFtz(lut[byte & 0xFu], block_absmax) / scale);
    }
    Store8(out + c * 8, b);
  }
}

}  // namespace

void QuantizeRowsFloat8(const at::Tensor& x, const at::Tensor& values, const at::Tensor& scales) {
  const int64_t rows = x.size(0), cols = x.size(1);
  if (rows == 0 || cols == 0) {
    scales.fill_(1.0f);
    return;
  }
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  auto* out = reinterpret_cast<uint8_t*>(values.data_ptr());
  float* s = scales.data_ptr<float>();
  const bool launched = DispatchFloating(x.scalar_type(), [&](auto zero) {
    using T = decltype(zero);
    const T* in = static_cast<const T*>(x.data_ptr());
    const bool vector = sizeof(T) == 2 && cols % 8 == 0 && x.stride(0) % 8 == 0 && Aligned16(in);
    if (vector) {
      QuantizeRowsVectorKernel<T><<<rows, kThreads, 0, stream>>>(in, x.stride(0), cols, out, s);
    } else {
      QuantizeRowsScalarKernel<T><<<rows, kThreads, 0, stream>>>(in, x.stride(0), cols, out, s);
    }
    return true;
  });
  TORCH_CHECK(launched, "QuantizeRowsFloat8: unsupported dtype ", x.scalar_type());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void WeightRowsFloat8(const at::Tensor& packed, const at::Tensor& block_absmax,
                      const Codebook16& table, float table_max, int64_t blocksize,
                      const at::Tensor& values, const at::Tensor& scales) {
  const int64_t rows = values.size(0), cols = values.size(1);
  if (rows == 0 || cols == 0) return;
  TORCH_CHECK(reinterpret_cast<uintptr_t>(packed.data_ptr()) % 4 == 0,
              "WeightRowsFloat8: the packed codes must be 4-byte aligned");
  const c10::cuda::CUDAGuard guard(values.device());
  WeightRowsKernel<<<rows, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
      static_cast<const uint32_t*>(packed.data_ptr()), block_absmax.data_ptr<float>(), table,
      table_max, cols, blocksize, reinterpret_cast<uint8_t*>(values.data_ptr()),
      scales.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

bool DeviceHasFloat8(int index) {
  const cudaDeviceProp* props =
      at::cuda::getDeviceProperties(index < 0 ? at::cuda::current_device() : index);
  return props->major == 9;
}

}  // namespace qlora::kernels::cuda
