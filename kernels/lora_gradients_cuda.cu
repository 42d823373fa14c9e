// CUDA kernels of lora_gradients.h: both rank-r products from one read of g, then the sum of
// their per-chunk partials.
//
//   LoraGradientPairKernel    one block per (row chunk, column chunk) of g, chunks chosen so that
//                             about one block runs per SM; 64 x 128 tiles of g (with ha's 64
//                             rows) stream through shared memory by cp.async, 4 stages deep;
//                             warps 0-3 accumulate dh' for the tile's rows over the chunk's
//                             columns (in registers), warps 4-7 dB for the tile's columns over
//                             the chunk's rows (in shared memory), both on the tensor cores (wmma
//                             16x16x16, float32 sums); per-chunk partial sums go to float32
//                             workspaces.
//   LoraGradientReduceKernel  adds each value's partials in chunk order (the same bits every
//                             run), scales and rounds once, as a GEMM's epilogue does.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include "kernels/lora_gradients_backend.h"

namespace qlora::kernels::cuda {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kThreads = 256;          // 8 warps: 0-3 dh', 4-7 dB
constexpr int kTileRows = 64;          // rows of g a tile (4 fragments: one a dh' warp)
constexpr int kTileCols = 128;         // columns of g a tile (8 fragments: two a dB warp)
constexpr int kTileLd = kTileCols + 8; // padded rows: ldmatrix's 8 rows fall in distinct banks
constexpr int kStages = 4;
constexpr int kChunkValues = 8192;     // a column chunk's width times r: B and the dB sums
constexpr int kF = 16;                 // the wmma fragment's side

// Row lengths (in values) of the small shared matrices, padded like kTileLd.
constexpr int RankLd(int r) { return r + 8; }   // B's and ha's rows (16-bit values)
constexpr int SumLd(int r) { return r + 4; }    // the dB sums' rows (float32)

template <typename T>
struct CudaType;
template <>
struct CudaType<c10::BFloat16> {
  using type = __nv_bfloat16;
};
template <>
struct CudaType<c10::Half> {
  using type = __half;
};

__device__ __forceinline__ void CopyAsync16(void* shared, const void* global, bool valid) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  // src-size 0 reads nothing and fills the 16 bytes with zeros (rows or columns past the end).
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(global),
               "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void CommitCopies() { asm volatile("cp.async.commit_group;\n" ::); }

template <int kPending>
__device__ __forceinline__ void WaitCopies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

struct PairArgs {
  const void* g;
  int64_t g_stride;
  const void* b;  // [cols, r], contiguous
  const void* ha;
  int64_t ha_stride;
  int64_t rows, cols;
  int chunk_rows, chunk_cols;  // multiples of kTileRows and kTileCols
  float* dha_partial;          // [column chunks][rows_padded][r]
  float* db_partial;           // [row chunks][cols_padded][r]
  int64_t rows_padded, cols_padded;
};

template <int R>
size_t SharedBytes(int chunk_cols) {
  return sizeof(uint16_t) * (kStages * kTileRows * (kTileLd + RankLd(R)) +
                             size_t(chunk_cols) * RankLd(R)) +
         sizeof(float) * size_t(chunk_cols) * SumLd(R);
}

template <typename T, int R>
__global__ void __launch_bounds__(kThreads) LoraGradientPairKernel(PairArgs args) {
  constexpr int kRankLd = RankLd(R), kSumLd = SumLd(R), kPieces = R / 8;  // 16-byte pieces a row
  extern __shared__ __align__(128) unsigned char shared[];
  T* tiles = reinterpret_cast<T*>(shared);             // [kStages][kTileRows][kTileLd]
  T* ha_tiles = tiles + kStages * kTileRows * kTileLd;  // [kStages][kTileRows][kRankLd]
  T* b_chunk = ha_tiles + kStages * kTileRows * kRankLd;  // [chunk_cols][kRankLd]
  float* db_sums = reinterpret_cast<float*>(b_chunk + args.chunk_cols * kRankLd);

  const T* g = static_cast<const T*>(args.g);
  const T* ha = static_cast<const T*>(args.ha);
  const T* b = static_cast<const T*>(args.b);
  const int64_t col0 = int64_t{blockIdx.x} * args.chunk_cols;
  const int64_t row0 = int64_t{blockIdx.y} * args.chunk_rows;
  const int col_tiles =
      static_cast<int>((min(args.cols - col0, int64_t{args.chunk_cols}) + kTileCols - 1) / kTileCols);
  const int row_tiles =
      static_cast<int>((min(args.rows - row0, int64_t{args.chunk_rows}) + kTileRows - 1) / kTileRows);
  const int tiles_total = row_tiles * col_tiles;
  const int chunk_width = col_tiles * kTileCols;
  const int warp = threadIdx.x / 32;

  // B's rows of this chunk (zeros past the last column) join the first tile's copies.
  for (int p = threadIdx.x; p < chunk_width * kPieces; p += kThreads) {
    const int row = p / kPieces, piece = p % kPieces;
    const bool valid = col0 + row < args.cols;
    CopyAsync16(b_chunk + row * kRankLd + piece * 8,
                valid ? b + (col0 + row) * R + piece * 8 : b, valid);
  }
  for (int i = threadIdx.x; i < chunk_width * kSumLd; i += kThreads) db_sums[i] = 0.0f;

  // Tile t: row tile t / col_tiles, column tile t % col_tiles (rows outer: dh' sums one row tile
  // at a time), into stage t % kStages.
  auto load_tile = [&](int t) {
    const int stage = t % kStages;
    const int64_t r0 = row0 + int64_t{t / col_tiles} * kTileRows;
    const int64_t c0 = col0 + int64_t{t % col_tiles} * kTileCols;
    T* dst = tiles + stage * kTileRows * kTileLd;
    for (int p = threadIdx.x; p < kTileRows * (kTileCols / 8); p += kThreads) {
      const int row = p / (kTileCols / 8), piece = p % (kTileCols / 8);
      const int64_t gr = r0 + row, gc = c0 + piece * 8;
      const bool valid = gr < args.rows && gc < args.cols;
      CopyAsync16(dst + row * kTileLd + piece * 8, valid ? g + gr * args.g_stride + gc : g, valid);
    }
    T* ha_dst = ha_tiles + stage * kTileRows * kRankLd;
    for (int p = threadIdx.x; p < kTileRows * kPieces; p += kThreads) {
      const int row = p / kPieces, piece = p % kPieces;
      const bool valid = r0 + row < args.rows;
      CopyAsync16(ha_dst + row * kRankLd + piece * 8,
                  valid ? ha + (r0 + row) * args.ha_stride + piece * 8 : ha, valid);
    }
  };
  for (int t = 0; t < kStages - 1; ++t) {
    if (t < tiles_total) load_tile(t);
    CommitCopies();
  }

  wmma::fragment<wmma::accumulator, kF, kF, kF, float> dha_sums[R / kF];
#pragma unroll
  for (int j = 0; j < R / kF; ++j) wmma::fill_fragment(dha_sums[j], 0.0f);

  for (int t = 0; t < tiles_total; ++t) {
    WaitCopies<kStages - 2>();  // tile t (and B with tile 0) has landed
    __syncthreads();            // ... for every thread, and stage (t - 1) is no longer read
    if (t + kStages - 1 < tiles_total) load_tile(t + kStages - 1);
    CommitCopies();
    const int row_tile = t / col_tiles, col_tile = t % col_tiles;
    const T* tile = tiles + (t % kStages) * kTileRows * kTileLd;
    const T* ha_tile = ha_tiles + (t % kStages) * kTileRows * kRankLd;
    if (warp < 4) {
      // dh'[16 rows of warp, :] += g[those rows, 128 columns] B[those columns, :]
      wmma::fragment<wmma::matrix_a, kF, kF, kF, T, wmma::row_major> gf;
      wmma::fragment<wmma::matrix_b, kF, kF, kF, T, wmma::row_major> bf;
#pragma unroll
      for (int k = 0; k < kTileCols / kF; ++k) {
        wmma::load_matrix_sync(gf, tile + warp * kF * kTileLd + k * kF, kTileLd);
#pragma unroll
        for (int j = 0; j < R / kF; ++j) {
          wmma::load_matrix_sync(bf, b_chunk + (col_tile * kTileCols + k * kF) * kRankLd + j * kF,
                                 kRankLd);
          wmma::mma_sync(dha_sums[j], gf, bf, dha_sums[j]);
        }
      }
      if (col_tile == col_tiles - 1) {  // the chunk's columns are summed: out with this row tile
        float* dst = args.dha_partial +
                     (int64_t{blockIdx.x} * args.rows_padded + row0 + row_tile * kTileRows +
                      warp * kF) * R;
#pragma unroll
        for (int j = 0; j < R / kF; ++j) {
          wmma::store_matrix_sync(dst + j * kF, dha_sums[j], R, wmma::mem_row_major);
          wmma::fill_fragment(dha_sums[j], 0.0f);
        }
      }
    } else {
      // dB[16 columns, :] += g[64 rows, those columns]^T ha[64 rows, :], two column slices a warp
      wmma::fragment<wmma::matrix_a, kF, kF, kF, T, wmma::col_major> gtf;
      wmma::fragment<wmma::matrix_b, kF, kF, kF, T, wmma::row_major> hf;
      wmma::fragment<wmma::accumulator, kF, kF, kF, float> sums;
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        const int slice = (warp - 4) * 2 + s;
#pragma unroll
        for (int j = 0; j < R / kF; ++j) {
          float* slot = db_sums + (col_tile * kTileCols + slice * kF) * kSumLd + j * kF;
          wmma::load_matrix_sync(sums, slot, kSumLd, wmma::mem_row_major);
#pragma unroll
          for (int k = 0; k < kTileRows / kF; ++k) {
            wmma::load_matrix_sync(gtf, tile + k * kF * kTileLd + slice * kF, kTileLd);
            wmma::load_matrix_sync(hf, ha_tile + k * kF * kRankLd + j * kF, kRankLd);
            wmma::mma_sync(sums, gtf, hf, sums);
          }
          wmma::store_matrix_sync(slot, sums, kSumLd, wmma::mem_row_major);
        }
      }
    }
  }
  WaitCopies<0>();
  __syncthreads();
  float* db_dst = args.db_partial + (int64_t{blockIdx.y} * args.cols_padded + col0) * R;
  for (int i = threadIdx.x; i < chunk_width * (R / 4); i += kThreads) {
    const int row = i / (R / 4), quad = i % (R / 4);
    reinterpret_cast<float4*>(db_dst + row * R)[quad] =
        reinterpret_cast<const float4*>(db_sums + row * kSumLd)[quad];
  }
}

struct ReduceArgs {
  const float* dha_partial;
  int col_chunks;
  int64_t rows_padded;
  const float* db_partial;
  int row_chunks;
  int64_t cols_padded;
  int64_t rows, cols;
  int r;
  float scale;
  void* dha;
  int64_t dha_stride;
  void* db;
  int64_t db_stride;
};

template <typename T>
__global__ void LoraGradientReduceKernel(ReduceArgs args) {
  const int64_t dha_values = args.rows * args.r, total = dha_values + args.cols * args.r;
  for (int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const bool is_dha = e < dha_values;
    const int64_t i = is_dha ? e : e - dha_values;
    const int64_t row = i / args.r;
    const int j = static_cast<int>(i - row * args.r);
    const float* partial = is_dha ? args.dha_partial : args.db_partial;
    const int64_t chunk_stride = (is_dha ? args.rows_padded : args.cols_padded) * args.r;
    const int chunks = is_dha ? args.col_chunks : args.row_chunks;
    float sum = 0.0f;
    for (int c = 0; c < chunks; ++c) sum += partial[c * chunk_stride + row * args.r + j];
    T* out = static_cast<T*>(is_dha ? args.dha : args.db);
    out[row * (is_dha ? args.dha_stride : args.db_stride) + j] = T(__fmul_rn(sum, args.scale));
  }
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t RoundUp(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }

template <typename T, int R>
void LaunchPair(const PairArgs& args, dim3 grid, cudaStream_t stream) {
  auto kernel = LoraGradientPairKernel<typename CudaType<T>::type, R>;
  const size_t shared = SharedBytes<R>(args.chunk_cols);
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(shared)));
  kernel<<<grid, kThreads, shared, stream>>>(args);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T>
void LaunchPairOfRank(int r, const PairArgs& args, dim3 grid, cudaStream_t stream) {
  switch (r) {
    case 16: return LaunchPair<T, 16>(args, grid, stream);
    case 32: return LaunchPair<T, 32>(args, grid, stream);
    case 48: return LaunchPair<T, 48>(args, grid, stream);
    case 64: return LaunchPair<T, 64>(args, grid, stream);
    default: TORCH_CHECK(false, "LoRA gradients kernel: rank ", r, " is not 16, 32, 48 or 64");
  }
}

}  // namespace

void LoraGradientPair(const at::Tensor& g, const at::Tensor& b, const at::Tensor& ha, float scale,
                      const at::Tensor& dha, const at::Tensor& db) {
  const c10::cuda::CUDAGuard guard(g.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int64_t rows = g.size(0), cols = g.size(1);
  const int r = static_cast<int>(b.size(1));
  // Chunks: about one block per SM, the grid's shape following g's (the partial sums it writes,
  // col_chunks * rows + row_chunks * cols values of r, are then fewest).
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int64_t widest = std::max<int64_t>(kTileCols, kChunkValues / r / kTileCols * kTileCols);
  int64_t col_chunks = std::max<int64_t>(1, std::llround(std::sqrt(sms * double(cols) / rows)));
  const int64_t chunk_cols = std::min(widest, RoundUp(CeilDiv(cols, col_chunks), kTileCols));
  col_chunks = CeilDiv(cols, chunk_cols);
  const int64_t chunk_rows =
      RoundUp(CeilDiv(rows, std::max<int64_t>(1, sms / col_chunks)), kTileRows);
  const int64_t row_chunks = CeilDiv(rows, chunk_rows);
  TORCH_CHECK(row_chunks < 65536, "LoRA gradients kernel: too many rows");

  const auto floats = g.options().dtype(at::kFloat);
  const at::Tensor dha_partial = at::empty({col_chunks, row_chunks * chunk_rows, r}, floats);
  const at::Tensor db_partial = at::empty({row_chunks, col_chunks * chunk_cols, r}, floats);
  PairArgs args{g.const_data_ptr(), g.stride(0), b.const_data_ptr(), ha.const_data_ptr(),
                ha.stride(0), rows, cols, static_cast<int>(chunk_rows),
                static_cast<int>(chunk_cols), dha_partial.mutable_data_ptr<float>(),
                db_partial.mutable_data_ptr<float>(), row_chunks * chunk_rows,
                col_chunks * chunk_cols};
  const dim3 grid(static_cast<unsigned>(col_chunks), static_cast<unsigned>(row_chunks));
  ReduceArgs reduce{dha_partial.const_data_ptr<float>(), static_cast<int>(col_chunks),
                    row_chunks * chunk_rows, db_partial.const_data_ptr<float>(),
                    static_cast<int>(row_chunks), col_chunks * chunk_cols, rows, cols, r, scale,
                    dha.data_ptr(), dha.stride(0), db.data_ptr(), db.stride(0)};
  const int64_t values = (rows + cols) * r;
  const unsigned reduce_blocks =
      static_cast<unsigned>(std::min<int64_t>(CeilDiv(values, kThreads), int64_t{sms} * 16));
  if (g.scalar_type() == at::kBFloat16) {
    LaunchPairOfRank<c10::BFloat16>(r, args, grid, stream);
    LoraGradientReduceKernel<c10::BFloat16><<<reduce_blocks, kThreads, 0, stream>>>(reduce);
  } else {
    LaunchPairOfRank<c10::Half>(r, args, grid, stream);
    LoraGradientReduceKernel<c10::Half><<<reduce_blocks, kThreads, 0, stream>>>(reduce);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace qlora::kernels::cuda
