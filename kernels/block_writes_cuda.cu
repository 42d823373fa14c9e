// CUDA kernel of block_writes.h: one launch over a table of blocks in device memory.
//
//   WriteBlocksKernel  each CUDA block finds its block of the table (a binary search over the
//                      table's first CUDA block of each), then each thread writes
//                      kUnitsPerThread units of it: 16 bytes of the output (zeros, a copy, or
//                      float32 values times the scale, rounded once) where the block's columns,
//                      pointers and row strides allow, else one element
#include <cstdint>
#include <cstring>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "kernels/block_writes_backend.h"
#include "kernels/cuda_vectors.cuh"

namespace qlora::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kUnitsPerThread = 2;
constexpr int64_t kUnitsPerBlock = int64_t{kThreads} * kUnitsPerThread;

enum BlockKind : int32_t { kZeros = 0, kScaledFloat = 1, kCopy = 2 };

// One block of the table (plain data: copied to the device as bytes).
struct BlockArgs {
  void* out;
  const void* source;
  int64_t out_stride, source_stride;
  uint32_t rows, cols;
  uint32_t first_block;  // CUDA blocks before this one's
  uint32_t width;        // elements a unit: 16 bytes of the output, or 1
  float scale;
  int32_t kind;
};

template <typename T>
__device__ __forceinline__ T Scaled(float v, float scale) {
  return static_cast<T>(__fmul_rn(v, scale));  // c10's conversions round to nearest even
}

template <typename T>
__global__ void __launch_bounds__(kThreads) WriteBlocksKernel(const BlockArgs* __restrict__ table,
                                                              int count) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (table[mid].first_block <= blockIdx.x) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const BlockArgs a = table[lo];
  constexpr int V = 16 / sizeof(T);
  const uint32_t per_row = a.cols / a.width;
  const uint32_t units = a.rows * per_row;
#pragma unroll
  for (int k = 0; k < kUnitsPerThread; ++k) {
    const uint32_t u =
        (blockIdx.x - a.first_block) * static_cast<uint32_t>(kUnitsPerBlock) + k * kThreads +
        threadIdx.x;
    if (u >= units) return;
    const uint32_t row = u / per_row;
    const uint32_t col = (u - row * per_row) * a.width;
    T* out = static_cast<T*>(a.out) + int64_t{row} * a.out_stride + col;
    const int64_t from = int64_t{row} * a.source_stride + col;
    if (a.width == V) {
      Vec<T, V> v;
      if (a.kind == kCopy) {
        v = Load<T, V>(static_cast<const T*>(a.source) + from);
      } else if (a.kind == kScaledFloat) {
#pragma unroll
        for (int i = 0; i < V; i += 4) {
          const float4 f =
              *reinterpret_cast<const float4*>(static_cast<const float*>(a.source) + from + i);
          v.v[i] = Scaled<T>(f.x, a.scale), v.v[i + 1] = Scaled<T>(f.y, a.scale);
          v.v[i + 2] = Scaled<T>(f.z, a.scale), v.v[i + 3] = Scaled<T>(f.w, a.scale);
        }
      } else {
#pragma unroll
        for (int i = 0; i < V; ++i) v.v[i] = static_cast<T>(0.0f);
      }
      Store<T, V>(out, v);
    } else if (a.kind == kCopy) {
      *out = static_cast<const T*>(a.source)[from];
    } else if (a.kind == kScaledFloat) {
      *out = Scaled<T>(static_cast<const float*>(a.source)[from], a.scale);
    } else {
      *out = static_cast<T>(0.0f);
    }
  }
}

// Whether a block's units can be 16 bytes of output: whole vectors a row, aligned rows.
bool Vectorizable(const BlockWrite& w, int64_t v) {
  auto aligned = [&](const at::Tensor& t) {
    return Aligned16(t.const_data_ptr()) && (t.stride(0) * t.element_size()) % 16 == 0;
  };
  return w.out.size(1) % v == 0 && aligned(w.out) && (!w.source.defined() || aligned(w.source));
}

}  // namespace

bool WriteBlocks(const std::vector<BlockWrite>& writes) {
  const at::Tensor& first = writes[0].out;
  return DispatchFloating(first.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    constexpr int64_t V = 16 / sizeof(T);
    std::vector<BlockArgs> table;
    int64_t blocks = 0;
    for (const BlockWrite& w : writes) {
      if (w.out.numel() == 0) continue;
      BlockArgs a{};
      a.out = w.out.data_ptr();
      a.out_stride = w.out.stride(0);
      a.rows = static_cast<uint32_t>(w.out.size(0));
      a.cols = static_cast<uint32_t>(w.out.size(1));
      a.first_block = static_cast<uint32_t>(blocks);
      a.width = Vectorizable(w, V) ? static_cast<uint32_t>(V) : 1;
      a.scale = static_cast<float>(w.scale);
      a.kind = kZeros;
      if (w.source.defined()) {
        a.source = w.source.const_data_ptr();
        a.source_stride = w.source.stride(0);
        a.kind = w.source.scalar_type() == first.scalar_type() && w.scale == 1.0 ? kCopy
                                                                                : kScaledFloat;
      }
      const int64_t units = w.out.numel() / a.width;
      TORCH_CHECK(units < (int64_t{1} << 32) && w.out.size(0) < (int64_t{1} << 32),
                  "WriteBlocks: a block takes < 2^32 units");
      blocks += CeilDiv(units, kUnitsPerBlock);
      table.push_back(a);
    }
    if (table.empty()) return true;
    TORCH_CHECK(blocks < (int64_t{1} << 31), "WriteBlocks: too many blocks for one launch");
    const c10::cuda::CUDAGuard guard(first.device());
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    // The table through pinned memory (the caching host allocator keeps the block until the
    // copy has run) into device memory the stream's later work may reuse once the kernel ran.
    const int64_t bytes = static_cast<int64_t>(table.size() * sizeof(BlockArgs));
    at::Tensor host = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
    std::memcpy(host.mutable_data_ptr(), table.data(), static_cast<size_t>(bytes));
    const at::Tensor device = host.to(first.device(), /*non_blocking=*/true);
    WriteBlocksKernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        static_cast<const BlockArgs*>(device.const_data_ptr()), static_cast<int>(table.size()));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return true;
  });
}

}  // namespace qlora::kernels::cuda
