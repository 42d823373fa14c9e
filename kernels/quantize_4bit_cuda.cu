// CUDA implementation of the 4-bit kernels, bit-exact with bitsandbytes' CUDA library: the same
// decision trees (quantize_4bit_math.h), its fast-math reciprocal and flush-to-zero multiplies
// issued explicitly, and double-dequantization fused into the 4-bit dequantize kernel with the
// multiply and the offset add rounded separately. Built without --use_fast_math and with
// --fmad=false, so nothing else is approximated or contracted.
//
// Kernels:
//   Quantize4bitKernel          one warp per quantization block: absmax, then codes, packed pairs
//   QuantizeBlockwise8bitKernel one warp per block of absmax values, dynamic map in shared memory
//   Dequantize4bitKernel        4 packed words (32 outputs) a thread, loads first, 16-byte stores;
//                               blocks past the weight's write the columns after its rows
//   DequantizeBlockwise8bitKernel  absmax = code[q] * absmax2 + offset, one thread per value
#include <cstdint>

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "kernels/codebooks_4bit.h"
#include "kernels/cuda_vectors.cuh"
#include "kernels/dependent_launch.cuh"
#include "kernels/quantize_4bit_backend.h"
#include "kernels/quantize_4bit_math.h"

namespace qlora::kernels::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kThreads = 256;
constexpr int kPackedPerThread = 4;  // one 4-byte load of packed codes -> 8 outputs

int Log2(int64_t power_of_two) {
  int s = 0;
  while ((int64_t{1} << s) < power_of_two) ++s;
  return s;
}

// Max over the warp; every lane gets the result. fmaxf ignores NaN like bitsandbytes' reduction.
__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// Max |x| over [begin, end) by one warp, subnormals flushed (abs.ftz under fast math).
template <typename T>
__device__ __forceinline__ float WarpBlockMax(const T* x, int64_t begin, int64_t end, int lane) {
  float m = 0.0f;
  for (int64_t i = begin + lane; i < end; i += kWarp) {
    m = fmaxf(m, fabsf(math::FlushSubnormal(static_cast<float>(x[i]))));
  }
  return WarpMax(m);
}

template <typename T, QuantType kType>
__global__ void Quantize4bitKernel(const T* __restrict__ x, int64_t n, int64_t blocksize,
                                   int64_t blocks, uint8_t* __restrict__ packed,
                                   float* __restrict__ absmax, Nf4ThresholdTable nf4,
                                   Fp4Pivots fp4) {
  const int64_t block = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (block >= blocks) return;  // whole warps leave together
  const int64_t begin = block * blocksize;
  const int64_t end = min(n, begin + blocksize);
  const float m = WarpBlockMax(x, begin, end, lane);
  if (lane == 0) absmax[block] = m;
  const float scale = math::Reciprocal(m);  // rcp.approx.ftz, inf for an all-zero block
  for (int64_t pair = begin / 2 + lane; 2 * pair < end; pair += kWarp) {
    const float hi = static_cast<float>(x[2 * pair]);
    const float lo = 2 * pair + 1 < n ? static_cast<float>(x[2 * pair + 1]) : 0.0f;
    const float shi = math::MulFtz(hi, scale);
    const float slo = math::MulFtz(lo, scale);
    const uint8_t chi = kType == QuantType::kNF4 ? math::Nf4Code(shi, nf4) : math::Fp4Code(shi, fp4);
    const uint8_t clo = kType == QuantType::kNF4 ? math::Nf4Code(slo, nf4) : math::Fp4Code(slo, fp4);
    packed[pair] = static_cast<uint8_t>(chi << 4 | clo);
  }
}

__global__ void QuantizeBlockwise8bitKernel(const float* __restrict__ x, int64_t n,
                                            int64_t blocksize, int64_t blocks,
                                            uint8_t* __restrict__ codes,
                                            float* __restrict__ absmax, Codebook256 table) {
  __shared__ float code[256];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) code[i] = table.v[i];
  __syncthreads();
  const int64_t block = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (block >= blocks) return;
  const int64_t begin = block * blocksize;
  const int64_t end = min(n, begin + blocksize);
  const float m = WarpBlockMax(x, begin, end, lane);
  if (lane == 0) absmax[block] = m;
  const float scale = math::Reciprocal(m);
  for (int64_t i = begin + lane; i < end; i += kWarp) {
    codes[i] = math::DynamicCode(code, math::MulFtz(x[i], scale));
  }
}

// Per-block absmax: plain, or resolved from double quantization exactly as bitsandbytes'
// dequantize_blockwise (ftz multiply) followed by torch's separate add of the offset.
struct AbsmaxArgs {
  const float* absmax;     // plain float32 absmax, or nullptr when nested
  const uint8_t* qabsmax;
  const float* absmax2;
  const float* code;
  float offset;
  int log2_nested_blocksize;
};

__device__ __forceinline__ float LoadAbsmax(const AbsmaxArgs& a, int64_t block) {
  if (a.absmax != nullptr) return __ldg(a.absmax + block);
  const float scaled = math::MulFtz(__ldg(a.code + __ldg(a.qabsmax + block)),
                                    __ldg(a.absmax2 + (block >> a.log2_nested_blocksize)));
  return math::AddRn(scaled, a.offset);
}

template <typename T>
__device__ __forceinline__ T ToOutput(float v) {
  return static_cast<T>(v);  // c10::Half / c10::BFloat16 convert with round-to-nearest-even
}

// A chunk is 4 packed bytes (one 4-byte word) -> 8 outputs; blocksizes are powers of two >= 32,
// so a chunk's 8 outputs share one absmax. Thread t of a CUDA block decodes chunks
// tile + u * blockDim + t for u < kChunksPerThread: for each u a warp loads 128 contiguous
// bytes and stores 512 contiguous bytes of bf16 (16 bytes a lane). The kernel is bound by the
// latency of its loads (the packed word, then the nested absmax's dependent pair), so all of a
// thread's loads are issued before any decode: four words in flight per thread instead of one
// (eight do not help: the stores bound it now, its bf16 writes as fast as a bf16 fill's in
// kernels/dequantize_bench); 8- and 16-byte chunks a thread were slower
// (bench/reports/kernels_h200_2026-12-01_04.md, "NF4 dequantize").
// The last, partial tile (and unaligned views) take the chunk-by-chunk path, byte by byte at
// the tail.
constexpr int kChunksPerThread = 4;

template <typename T>
__device__ __forceinline__ void DecodeChunk(unsigned int word, float a, const float* lut, T* dst) {
  alignas(4) uint8_t bytes[kPackedPerThread];
  *reinterpret_cast<unsigned int*>(bytes) = word;
  alignas(16) T vals[2 * kPackedPerThread];
#pragma unroll
  for (int j = 0; j < kPackedPerThread; ++j) {
    vals[2 * j] = ToOutput<T>(math::MulFtz(lut[bytes[j] >> 4], a));
    vals[2 * j + 1] = ToOutput<T>(math::MulFtz(lut[bytes[j] & 0x0F], a));
  }
  constexpr int kStores = sizeof(vals) / sizeof(uint4);
  uint4* out = reinterpret_cast<uint4*>(dst);
#pragma unroll
  for (int s = 0; s < kStores; ++s) out[s] = reinterpret_cast<const uint4*>(vals)[s];
}

// The columns after each output row (ColumnsAfter), written by the blocks past the weight's:
// element e of [rows, zeros + r + trailing] is 0 in the first `zeros` columns, then
// scale * values, then 0.
struct AfterArgs {
  unsigned weight_blocks = 0;  // blocks before these
  const float* values = nullptr;
  int64_t values_stride = 0;
  uint32_t zeros = 0, r = 0, width = 0;  // width = zeros + r + trailing
  int64_t elements = 0;           // rows * width
  float scale = 1.0f;
};

template <typename T>
__device__ __forceinline__ void WriteAfterColumns(const AfterArgs& after, RowLayout rows,
                                                  uint32_t cols, T* __restrict__ out) {
  const int64_t e = int64_t{blockIdx.x - after.weight_blocks} * blockDim.x + threadIdx.x;
  if (e >= after.elements) return;
  const uint32_t row = static_cast<uint32_t>(e) / after.width;
  const uint32_t col = static_cast<uint32_t>(e) - row * after.width;
  const float v = col < after.zeros || col - after.zeros >= after.r
                      ? 0.0f
                      : __fmul_rn(after.values[int64_t{row} * after.values_stride + col -
                                               after.zeros],
                                  after.scale);
  out[int64_t{row} * rows.stride + cols + col] = ToOutput<T>(v);
}

template <typename T>
__global__ void Dequantize4bitKernel(const uint8_t* __restrict__ packed, int64_t n,
                                     int log2_blocksize, AbsmaxArgs absmax_args, Codebook16 table,
                                     bool vector_io, RowLayout rows, AfterArgs after,
                                     T* __restrict__ out) {
  BeginDependentKernel();
  if (after.elements > 0 && blockIdx.x >= after.weight_blocks) {  // the whole block
    WriteAfterColumns(after, rows, rows.cols, out);
    return;
  }
  __shared__ float lut[16];
  if (threadIdx.x < 16) lut[threadIdx.x] = table.v[threadIdx.x];
  __syncthreads();
  constexpr int64_t kOutputsPerChunk = 2 * kPackedPerThread;
  const int64_t tile = int64_t{blockIdx.x} * blockDim.x * kChunksPerThread;
  const int64_t last_chunk = tile + (kChunksPerThread - 1) * blockDim.x + threadIdx.x;
  const auto* words = reinterpret_cast<const unsigned int*>(packed);
  if (vector_io && (last_chunk + 1) * kOutputsPerChunk <= n) {
    unsigned int word[kChunksPerThread];
    float a[kChunksPerThread];
#pragma unroll
    for (int u = 0; u < kChunksPerThread; ++u) {
      const int64_t chunk = tile + u * blockDim.x + threadIdx.x;
      word[u] = __ldg(words + chunk);
      a[u] = LoadAbsmax(absmax_args, (chunk * kOutputsPerChunk) >> log2_blocksize);
    }
    // Where the chunks go: one division for the first, then a step of blockDim.x chunks at a
    // time, carried into the next rows (a division a chunk cost the strided writes ~7 %).
    const int64_t first = (tile + threadIdx.x) * kOutputsPerChunk;
    int64_t offset = first;
    uint32_t col = 0;
    if (rows.strided) {
      const uint32_t row = static_cast<uint32_t>(first) / rows.cols;
      col = static_cast<uint32_t>(first) - row * rows.cols;
      offset = int64_t{row} * rows.stride + col;
    }
#pragma unroll
    for (int u = 0; u < kChunksPerThread; ++u) {
      DecodeChunk(word[u], a[u], lut, out + offset);
      const uint32_t step = blockDim.x * kOutputsPerChunk;
      if (!rows.strided) {
        offset += step;
        continue;
      }
      col += step;
      offset += step;
      while (col >= rows.cols) {  // into the next row: skip the columns after this one
        col -= rows.cols;
        offset += rows.stride - rows.cols;
      }
    }
    return;
  }
  for (int u = 0; u < kChunksPerThread; ++u) {
    const int64_t chunk = tile + u * blockDim.x + threadIdx.x;
    const int64_t first = chunk * kOutputsPerChunk;
    if (first >= n) return;
    const float a = LoadAbsmax(absmax_args, first >> log2_blocksize);
    if (vector_io && first + kOutputsPerChunk <= n) {
      DecodeChunk(__ldg(words + chunk), a, lut, out + RowOffset(first, rows));
      continue;
    }
    const int64_t last = min(n, first + kOutputsPerChunk);
    for (int64_t i = first; i < last; ++i) {
      const uint8_t byte = packed[i / 2];
      const uint8_t nibble = (i & 1) ? (byte & 0x0F) : (byte >> 4);
      out[RowOffset(i, rows)] = ToOutput<T>(math::MulFtz(lut[nibble], a));
    }
  }
}

__global__ void DequantizeBlockwise8bitKernel(const uint8_t* __restrict__ codes,
                                              const float* __restrict__ absmax,
                                              const float* __restrict__ code, float offset,
                                              int log2_blocksize, int64_t n,
                                              float* __restrict__ out) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = math::AddRn(math::MulFtz(__ldg(code + codes[i]), __ldg(absmax + (i >> log2_blocksize))),
                       offset);
}

// f(T{}) for `type`'s C++ type (DispatchFloating), or a clear error for any other dtype.
template <typename F>
void DispatchFloatingOrFail(at::ScalarType type, F&& f) {
  const bool taken = DispatchFloating(type, [&](auto tag) {
    f(tag);
    return true;
  });
  TORCH_CHECK(taken, "4-bit kernels support float32, float16 and bfloat16, not ", type);
}

unsigned Grid(int64_t threads) {
  const int64_t grid = CeilDiv(threads, kThreads);
  TORCH_CHECK(grid < (int64_t{1} << 31), "tensor too large for the 4-bit kernels");
  return static_cast<unsigned>(grid);
}

// after's columns of a weight of `rows` rows as the kernels take them (weight_blocks left 0).
AfterArgs AfterArgsOf(const ColumnsAfter& after, int64_t rows) {
  AfterArgs a;
  a.values = after.values.const_data_ptr<float>();
  a.values_stride = after.values.stride(0);
  a.zeros = static_cast<uint32_t>(after.zeros);
  a.r = static_cast<uint32_t>(after.values.size(1));
  a.width = static_cast<uint32_t>(after.zeros + after.values.size(1) + after.trailing_zeros);
  a.elements = rows * int64_t{a.width};
  a.scale = static_cast<float>(after.scale);
  return a;
}

}  // namespace

void Quantize4bit(const at::Tensor& x, QuantType type, int64_t blocksize, at::Tensor& packed,
                  at::Tensor& absmax) {
  const c10::cuda::CUDAGuard guard(x.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int64_t n = x.numel();
  const int64_t blocks = CeilDiv(n, blocksize);
  DispatchFloatingOrFail(x.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    auto kernel = type == QuantType::kNF4 ? Quantize4bitKernel<T, QuantType::kNF4>
                                          : Quantize4bitKernel<T, QuantType::kFP4>;
    kernel<<<Grid(blocks * kWarp), kThreads, 0, stream>>>(
        x.const_data_ptr<T>(), n, blocksize, blocks, packed.mutable_data_ptr<uint8_t>(),
        absmax.mutable_data_ptr<float>(), kNf4Thresholds, kFp4Pivots);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void QuantizeBlockwise8bit(const at::Tensor& x, int64_t blocksize, at::Tensor& codes,
                           at::Tensor& absmax) {
  const c10::cuda::CUDAGuard guard(x.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int64_t n = x.numel();
  const int64_t blocks = CeilDiv(n, blocksize);
  QuantizeBlockwise8bitKernel<<<Grid(blocks * kWarp), kThreads, 0, stream>>>(
      x.const_data_ptr<float>(), n, blocksize, blocks, codes.mutable_data_ptr<uint8_t>(),
      absmax.mutable_data_ptr<float>(), kDynamicMap);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void DequantizeBlockwise8bit(const at::Tensor& codes, const at::Tensor& absmax,
                             const at::Tensor& code, int64_t blocksize, float offset,
                             at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(codes.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int64_t n = codes.numel();
  DequantizeBlockwise8bitKernel<<<Grid(n), kThreads, 0, stream>>>(
      codes.const_data_ptr<uint8_t>(), absmax.const_data_ptr<float>(),
      code.const_data_ptr<float>(), offset, Log2(blocksize), n, out.mutable_data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void Dequantize4bit(const at::Tensor& packed, const AbsmaxSource& source, QuantType type,
                    int64_t blocksize, at::Tensor& out, const ColumnsAfter* after) {
  const c10::cuda::CUDAGuard guard(packed.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int64_t n = out.numel();
  AbsmaxArgs args{};
  if (source.absmax != nullptr) {
    args.absmax = source.absmax->const_data_ptr<float>();
  } else {
    args.qabsmax = source.qabsmax->const_data_ptr<uint8_t>();
    args.absmax2 = source.absmax2->const_data_ptr<float>();
    args.code = source.code->const_data_ptr<float>();
    args.offset = source.offset;
    args.log2_nested_blocksize = Log2(source.nested_blocksize);
  }
  const Codebook16 table = type == QuantType::kNF4 ? kNf4Values : kFp4Values;
  const uint8_t* in = packed.const_data_ptr<uint8_t>();
  RowLayout rows;
  if (out.dim() == 2 && out.stride(0) != out.size(1)) {
    TORCH_CHECK(n < (int64_t{1} << 32), "Dequantize4bit: a row-strided output takes < 2^32 values");
    rows = {true, static_cast<uint32_t>(out.size(1)), out.stride(0)};
  }
  AfterArgs after_args;
  if (after != nullptr) {
    TORCH_CHECK(rows.strided, "Dequantize4bit: columns after the rows need a row-strided output");
    after_args = AfterArgsOf(*after, out.size(0));
  }
  // 8 outputs a chunk stay in one row, 16-byte aligned, when rows are multiples of 8 values.
  const bool rows_in_chunks = !rows.strided || (rows.cols % 8 == 0 && rows.stride % 8 == 0);
  DispatchFloatingOrFail(out.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    T* dst = out.mutable_data_ptr<T>();
    const bool vector_io = rows_in_chunks && reinterpret_cast<uintptr_t>(in) % 4 == 0 &&
                           reinterpret_cast<uintptr_t>(dst) % 16 == 0;
    const int64_t chunks = CeilDiv(n, 2 * kPackedPerThread);
    const unsigned weight_blocks = Grid(CeilDiv(chunks, kChunksPerThread));
    after_args.weight_blocks = weight_blocks;
    const unsigned blocks = weight_blocks + Grid(after_args.elements);
    LaunchDependent(Dequantize4bitKernel<T>, blocks, kThreads, 0, stream, in, n, Log2(blocksize),
                    args, table, vector_io, rows, after_args, dst);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace qlora::kernels::cuda
