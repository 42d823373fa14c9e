// Shared by the kernels' CUDA files: 16-byte vectors of a floating dtype (loads and stores of V
// elements at once), the dispatch over the floating dtypes those kernels take, where an element
// of rows that lie in a wider buffer is (RowLayout), and CeilDiv.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

namespace qlora::kernels::cuda {

template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

template <typename T, int V>
__device__ __forceinline__ Vec<T, V> Load(const T* p) {
  return *reinterpret_cast<const Vec<T, V>*>(p);
}

template <typename T, int V>
__device__ __forceinline__ void Store(T* p, const Vec<T, V>& v) {
  *reinterpret_cast<Vec<T, V>*>(p) = v;
}

inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Where element i (row-major over [n / cols, cols]) of a tensor lies: i itself where its rows are
// contiguous, else row * stride + column (rows of a wider buffer, with spare columns after each).
// 32-bit row arithmetic: callers take strided layouts only for n < 2^32.
struct RowLayout {
  bool strided = false;
  uint32_t cols = 0;
  int64_t stride = 0;
};

__device__ __forceinline__ int64_t RowOffset(int64_t i, const RowLayout& rows) {
  if (!rows.strided) return i;
  const uint32_t row = static_cast<uint32_t>(i) / rows.cols;
  return int64_t{row} * rows.stride + (static_cast<uint32_t>(i) - row * rows.cols);
}

// f(T{}) for T the C++ type of `type` (float32, float16, bfloat16); false for any other dtype.
template <typename F>
bool DispatchFloating(at::ScalarType type, F&& f) {
  switch (type) {
    case at::kFloat: return f(float{});
    case at::kHalf: return f(c10::Half{});
    case at::kBFloat16: return f(c10::BFloat16{});
    default: return false;
  }
}

}  // namespace qlora::kernels::cuda
