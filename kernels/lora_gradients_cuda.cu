// CUDA kernels of lora_gradients.h: both rank-r products from one read of g, then the sum of
// their per-chunk partials.
//
//   LoraGradientPairKernel    one block per (row chunk, column chunk) of g (the column chunks of
//                             up to kMaxAdapters adapters' gradients side by side in the grid:
//                             a grouped layer's in one launch), about two blocks an SM; 16 KB
//                             tiles of g (64 x 128 or 32 x 256 values, with ha's rows) stream
//                             through shared memory by cp.async, 3 stages deep; each of the 8
//                             warps takes a strip of the tile's rows for dh' and a slice of its
//                             columns for dB, on the tensor cores (ldmatrix + mma.sync m16n8k16,
//                             float32 sums in registers); a column chunk is 512 / 256 / 128
//                             columns (r 16 / 32 / 48-64), so that dB's sums for all of it stay
//                             in registers while the rows go by; per-chunk partial sums go to
//                             float32 workspaces.
//   LoraGradientReduceKernel  adds each value's partials in chunk order (the same bits every
//                             run), scales and rounds once, as a GEMM's epilogue does (and
//                             writes dh' times a row factor beside dh' where asked); one
//                             slice of the grid an adapter.
#include <algorithm>
#include <cstdint>
#include <vector>

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "kernels/cuda_vectors.cuh"
#include "kernels/dependent_launch.cuh"
#include "kernels/lora_gradients_backend.h"

namespace qlora::kernels::cuda {
namespace {

constexpr int kThreads = 256;  // 8 warps
constexpr int kTileValues = 8192;  // a tile of g: kRows x (8192 / kRows) values, 16 KB
constexpr int kMaxAdapters = kMaxLoraGradientPairs;  // one launch's adapters
constexpr int kStages = 3;

// A tile's columns, and its rows' length in shared memory, padded so that ldmatrix's 8 rows
// fall in distinct banks.
constexpr int TileCols(int rows) { return kTileValues / rows; }
constexpr int TileLd(int rows) { return TileCols(rows) + 8; }
// Row lengths (in 16-bit values) of B's and ha's shared copies, padded like TileLd.
constexpr int RankLd(int r) { return r + 8; }
// The columns of a block's chunk: dB's sums for the chunk, (chunk columns / 8 warps) x r float32
// a warp, stay at 32 registers a thread.
constexpr int ChunkCols(int r) { return r <= 16 ? 512 : r <= 32 ? 256 : 128; }

// The mma.sync operand type of a 16-bit dtype.
struct Bf16 {};
struct F16 {};
template <typename T>
struct MmaOperand;
template <>
struct MmaOperand<c10::BFloat16> {
  using type = Bf16;
};
template <>
struct MmaOperand<c10::Half> {
  using type = F16;
};

// d += a b for a 16x16 (row) and b 16x8 (col) fragment, float32 accumulators.
__device__ __forceinline__ void Mma(Bf16, float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void Mma(F16, float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 16-bit matrices from shared memory, lanes 8i..8i+7 giving matrix i's row addresses;
// transposed: each lane gets two values of one column.
__device__ __forceinline__ void LoadMatrices(uint32_t (&r)[4], const void* row) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ void LoadMatricesTransposed(uint32_t (&r)[4], const void* row) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

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

// One adapter's operands in the pair kernel's grid: its column chunks are blockIdx.x
// first_chunk .. the next adapter's first_chunk.
struct AdapterArgs {
  const void* g;
  int64_t g_stride;
  const void* b;  // [cols, r], contiguous
  const void* ha;
  int64_t ha_stride;
  int64_t cols;
  int first_chunk;
  float* dha_partial;  // [column chunks][rows_padded][r]
  float* db_partial;   // [row chunks][cols_padded][r]
  int64_t cols_padded;
};

struct PairArgs {
  AdapterArgs adapters[kMaxAdapters];
  int count;
  int64_t rows;
  int chunk_rows;  // a multiple of the tile's rows
  int64_t rows_padded;
};

template <int R, int kRows>
size_t SharedBytes() {
  constexpr int kParts = 8 / (kRows / 16);  // warps sharing a strip of rows for dh'
  return sizeof(uint16_t) * (kStages * kRows * (TileLd(kRows) + RankLd(R)) +
                             size_t{ChunkCols(R)} * RankLd(R)) +
         sizeof(float) * (kParts - 1) * kRows * R;
}

// Lane l's row and column in an x4 load of a 16x16 block whose four 8x8 matrices go rows first,
// (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15) (g's A fragments for dh', and
// the B fragments loaded transposed), or columns first (g's transposed A fragments for dB).
__device__ __forceinline__ int RowsFirstRow(int lane) { return (lane % 8) + ((lane / 8) % 2) * 8; }
__device__ __forceinline__ int RowsFirstCol(int lane) { return (lane / 16) * 8; }
__device__ __forceinline__ int ColsFirstRow(int lane) { return (lane % 8) + (lane / 16) * 8; }
__device__ __forceinline__ int ColsFirstCol(int lane) { return ((lane / 8) % 2) * 8; }

// Tiles of kRows x 8192 / kRows values (64 x 128 or 32 x 256: longer row pieces, fewer
// DRAM pages a tile). dh': warp w takes rows (w % strips) * 16 .. + 16 of a tile and its 64
// columns (w / strips) * 64 .. + 64, strips = kRows / 16; the parts of a strip add up through
// shared memory once a row tile's chunk is done. dB: warp w takes the tile's columns
// w * kCols / 8 .. + kCols / 8 over all its rows.
template <typename T, int R, int kRows>
__global__ void __launch_bounds__(kThreads, 2) LoraGradientPairKernel(PairArgs args) {
  BeginDependentKernel();
  using Op = typename MmaOperand<T>::type;
  constexpr int kCols = TileCols(kRows), kLd = TileLd(kRows);
  constexpr int kRankLd = RankLd(R), kPieces = R / 8;  // 16-byte pieces of a rank row
  constexpr int kChunkCols = ChunkCols(R), kColTiles = kChunkCols / kCols;
  static_assert(kColTiles >= 1 && kChunkCols % kCols == 0, "a chunk is whole tiles");
  constexpr int kBlocks = R / 8;  // n8 blocks of the rank dimension
  constexpr int kStrips = kRows / 16, kParts = 8 / kStrips, kSlices = kCols / 16 / 8;
  extern __shared__ __align__(128) unsigned char shared[];
  T* tiles = reinterpret_cast<T*>(shared);             // [kStages][kRows][kLd]
  T* ha_tiles = tiles + kStages * kRows * kLd;         // [kStages][kRows][kRankLd]
  T* b_chunk = ha_tiles + kStages * kRows * kRankLd;   // [kChunkCols][kRankLd]
  float* dha_parts = reinterpret_cast<float*>(b_chunk + kChunkCols * kRankLd);  // [parts-1][kRows][R]

  const int chunk = static_cast<int>(blockIdx.x);
  AdapterArgs op = args.adapters[0];  // this block's adapter (constant indices: no local copy)
#pragma unroll
  for (int i = 1; i < kMaxAdapters; ++i) {
    if (i < args.count && chunk >= args.adapters[i].first_chunk) op = args.adapters[i];
  }
  const T* g = static_cast<const T*>(op.g);
  const T* ha = static_cast<const T*>(op.ha);
  const T* b = static_cast<const T*>(op.b);
  const int col_chunk = chunk - op.first_chunk;
  const int64_t col0 = int64_t{col_chunk} * kChunkCols;
  const int64_t row0 = int64_t{blockIdx.y} * args.chunk_rows;
  const int row_tiles =
      static_cast<int>((min(args.rows - row0, int64_t{args.chunk_rows}) + kRows - 1) / kRows);
  const int tiles_total = row_tiles * kColTiles;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int part = warp / kStrips, dha_row = (warp % kStrips) * 16, dha_col = part * 64;
  const int db_col = warp * 16 * kSlices;

  // B's rows of this chunk (zeros past the last column) join the first tile's copies.
  for (int p = threadIdx.x; p < kChunkCols * kPieces; p += kThreads) {
    const int row = p / kPieces, piece = p % kPieces;
    const bool valid = col0 + row < op.cols;
    CopyAsync16(b_chunk + row * kRankLd + piece * 8,
                valid ? b + (col0 + row) * R + piece * 8 : b, valid);
  }
  // Tile t: row tile t / kColTiles, column tile t % kColTiles, into stage t % kStages.
  auto load_tile = [&](int t) {
    const int stage = t % kStages;
    const int64_t r0 = row0 + int64_t{t / kColTiles} * kRows;
    const int64_t c0 = col0 + int64_t{t % kColTiles} * kCols;
    T* dst = tiles + stage * kRows * kLd;
#pragma unroll
    for (int i = 0; i < kTileValues / 8 / kThreads; ++i) {
      const int p = threadIdx.x + i * kThreads;
      const int row = p / (kCols / 8), piece = p % (kCols / 8);
      const int64_t gr = r0 + row, gc = c0 + piece * 8;
      const bool valid = gr < args.rows && gc < op.cols;
      CopyAsync16(dst + row * kLd + piece * 8, valid ? g + gr * op.g_stride + gc : g, valid);
    }
    T* ha_dst = ha_tiles + stage * kRows * kRankLd;
    for (int p = threadIdx.x; p < kRows * kPieces; p += kThreads) {
      const int row = p / kPieces, piece = p % kPieces;
      const bool valid = r0 + row < args.rows;
      CopyAsync16(ha_dst + row * kRankLd + piece * 8,
                  valid ? ha + (r0 + row) * op.ha_stride + piece * 8 : ha, valid);
    }
  };
#pragma unroll
  for (int t = 0; t < kStages - 1; ++t) {
    if (t < tiles_total) load_tile(t);
    CommitCopies();
  }

  float dha_sums[kBlocks][4] = {};
  float db_sums[kColTiles][kSlices][kBlocks][4] = {};
  for (int row_tile = 0; row_tile < row_tiles; ++row_tile) {
#pragma unroll
    for (int ct = 0; ct < kColTiles; ++ct) {
      const int t = row_tile * kColTiles + ct;
      WaitCopies<kStages - 2>();  // tile t (and B with tile 0) has landed
      __syncthreads();            // ... for every thread; stage (t - 1) is read no more
      if (t + kStages - 1 < tiles_total) load_tile(t + kStages - 1);
      CommitCopies();
      const T* tile = tiles + (t % kStages) * kRows * kLd;
      const T* ha_tile = ha_tiles + (t % kStages) * kRows * kRankLd;
      const T* b_tile = b_chunk + ct * kCols * kRankLd;
#pragma unroll
      for (int k = 0; k < 64; k += 16) {  // dh' += g[rows, k..k+16] B[k..k+16, :]
        uint32_t a[4];
        LoadMatrices(a, tile + (dha_row + RowsFirstRow(lane)) * kLd + dha_col + k +
                            RowsFirstCol(lane));
#pragma unroll
        for (int j = 0; j < R / 16; ++j) {
          uint32_t bf[4];
          LoadMatricesTransposed(bf, b_tile + (dha_col + k + RowsFirstRow(lane)) * kRankLd +
                                         j * 16 + RowsFirstCol(lane));
          Mma(Op{}, dha_sums[2 * j], a, bf[0], bf[1]);
          Mma(Op{}, dha_sums[2 * j + 1], a, bf[2], bf[3]);
        }
      }
#pragma unroll
      for (int m = 0; m < kRows; m += 16) {  // dB += g[m..m+16, cols]^T ha[m..m+16, :]
        uint32_t hf[R / 16][4];
#pragma unroll
        for (int j = 0; j < R / 16; ++j) {
          LoadMatricesTransposed(hf[j], ha_tile + (m + RowsFirstRow(lane)) * kRankLd + j * 16 +
                                            RowsFirstCol(lane));
        }
#pragma unroll
        for (int sl = 0; sl < kSlices; ++sl) {
          uint32_t a[4];
          LoadMatricesTransposed(a, tile + (m + ColsFirstRow(lane)) * kLd + db_col + sl * 16 +
                                        ColsFirstCol(lane));
#pragma unroll
          for (int j = 0; j < R / 16; ++j) {
            Mma(Op{}, db_sums[ct][sl][2 * j], a, hf[j][0], hf[j][1]);
            Mma(Op{}, db_sums[ct][sl][2 * j + 1], a, hf[j][2], hf[j][3]);
          }
        }
      }
    }
    // The row tile's dh' over the chunk: the strip's other parts join part 0, in part order.
    const int r_lo = dha_row + lane / 4, c_lo = 2 * (lane % 4);
    if (part > 0) {
      float* mine = dha_parts + (part - 1) * kRows * R;
#pragma unroll
      for (int n = 0; n < kBlocks; ++n) {
        float* lo = mine + r_lo * R + n * 8 + c_lo;
        lo[0] = dha_sums[n][0], lo[1] = dha_sums[n][1];
        lo[8 * R] = dha_sums[n][2], lo[8 * R + 1] = dha_sums[n][3];
      }
    }
    __syncthreads();
    if (part == 0) {
      float* out =
          op.dha_partial + (int64_t{col_chunk} * args.rows_padded + row0 + row_tile * kRows) * R;
#pragma unroll
      for (int n = 0; n < kBlocks; ++n) {
        float v[4] = {dha_sums[n][0], dha_sums[n][1], dha_sums[n][2], dha_sums[n][3]};
#pragma unroll
        for (int q = 1; q < kParts; ++q) {
          const float* lo = dha_parts + (q - 1) * kRows * R + r_lo * R + n * 8 + c_lo;
          v[0] += lo[0], v[1] += lo[1], v[2] += lo[8 * R], v[3] += lo[8 * R + 1];
        }
        *reinterpret_cast<float2*>(out + r_lo * R + n * 8 + c_lo) = make_float2(v[0], v[1]);
        *reinterpret_cast<float2*>(out + (r_lo + 8) * R + n * 8 + c_lo) = make_float2(v[2], v[3]);
      }
    }
#pragma unroll
    for (int n = 0; n < kBlocks; ++n) {
#pragma unroll
      for (int i = 0; i < 4; ++i) dha_sums[n][i] = 0.0f;
    }
  }
  WaitCopies<0>();
  // dB's partial sums of this row chunk, straight from the registers.
  float* db_out = op.db_partial + (int64_t{blockIdx.y} * op.cols_padded + col0) * R;
  const int c_lo = 2 * (lane % 4);
#pragma unroll
  for (int ct = 0; ct < kColTiles; ++ct) {
#pragma unroll
    for (int sl = 0; sl < kSlices; ++sl) {
      const int n_lo = ct * kCols + db_col + sl * 16 + lane / 4;
#pragma unroll
      for (int n = 0; n < kBlocks; ++n) {
        float* lo = db_out + n_lo * R + n * 8 + c_lo;
        *reinterpret_cast<float2*>(lo) = make_float2(db_sums[ct][sl][n][0], db_sums[ct][sl][n][1]);
        *reinterpret_cast<float2*>(lo + 8 * R) =
            make_float2(db_sums[ct][sl][n][2], db_sums[ct][sl][n][3]);
      }
    }
  }
}

// One adapter's sums for LoraGradientReduceKernel.
struct AdapterReduceArgs {
  const float* dha_partial;
  int col_chunks;
  const float* db_partial;
  int64_t cols, cols_padded;
  float scale;
  void* dha;
  int64_t dha_stride;
  void* db;
  int64_t db_stride;
  const float* row_scale;  // null: no dha_scaled
  void* dha_scaled;
  int64_t dha_scaled_stride;
};

struct ReduceArgs {
  AdapterReduceArgs adapters[kMaxAdapters];
  int64_t rows, rows_padded;
  int row_chunks;
  int r;
};

// Each thread sums four consecutive values of a row (r is a multiple of 16), four chunks' loads
// in flight at a time, added in chunk order; blockIdx.y is the adapter.
template <typename T>
__global__ void LoraGradientReduceKernel(ReduceArgs args) {
  BeginDependentKernel();
  AdapterReduceArgs op = args.adapters[0];  // constant indices: no local copy of the arguments
#pragma unroll
  for (int i = 1; i < kMaxAdapters; ++i) {
    if (static_cast<int>(blockIdx.y) == i) op = args.adapters[i];
  }
  const int quads = args.r / 4;
  const int64_t dha_quads = args.rows * quads, total = dha_quads + op.cols * quads;
  for (int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const bool is_dha = e < dha_quads;
    const int64_t i = is_dha ? e : e - dha_quads;
    const int64_t row = i / quads;
    const int quad = static_cast<int>(i - row * quads);
    const float4* partial =
        reinterpret_cast<const float4*>(is_dha ? op.dha_partial : op.db_partial) +
        row * quads + quad;
    const int64_t step = (is_dha ? args.rows_padded : op.cols_padded) * quads;
    const int chunks = is_dha ? op.col_chunks : args.row_chunks;
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    auto add = [&](const float4& v) {
      sum[0] += v.x, sum[1] += v.y, sum[2] += v.z, sum[3] += v.w;
    };
    int c = 0;
    for (; c + 4 <= chunks; c += 4) {
      const float4 v0 = partial[c * step], v1 = partial[(c + 1) * step];
      const float4 v2 = partial[(c + 2) * step], v3 = partial[(c + 3) * step];
      add(v0), add(v1), add(v2), add(v3);
    }
    for (; c < chunks; ++c) add(partial[c * step]);
    T* out = static_cast<T*>(is_dha ? op.dha : op.db) +
             row * (is_dha ? op.dha_stride : op.db_stride) + quad * 4;
    T rounded[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) out[k] = rounded[k] = T(__fmul_rn(sum[k], op.scale));
    if (is_dha && op.row_scale != nullptr) {  // dh' (rounded) times the row's factor, rounded
      const float factor = op.row_scale[row];
      T* scaled = static_cast<T*>(op.dha_scaled) + row * op.dha_scaled_stride + quad * 4;
#pragma unroll
      for (int k = 0; k < 4; ++k) scaled[k] = T(__fmul_rn(static_cast<float>(rounded[k]), factor));
    }
  }
}

// The pair kernel at rank R with tiles of kRows rows over every adapter's column chunks, then
// the reduction, on the current stream: chunks of ChunkCols(R) columns by as many rows as make
// about blocks_per_sm blocks an SM.
template <typename T, int R, int kRows>
void Launch(const std::vector<PairOperands>& pairs, int blocks_per_sm) {
  const at::Tensor& first = pairs[0].g;
  const c10::cuda::CUDAGuard guard(first.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int64_t rows = first.size(0);
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int64_t chunk_cols = ChunkCols(R);
  int64_t col_chunks = 0, reduce_values = 0;
  for (const PairOperands& p : pairs) {
    col_chunks += CeilDiv(p.g.size(1), chunk_cols);
    reduce_values = std::max(reduce_values, (rows + p.g.size(1)) * R);
  }
  const int64_t wanted = std::max<int64_t>(1, CeilDiv(int64_t{sms} * blocks_per_sm, col_chunks));
  const int64_t chunk_rows = CeilDiv(CeilDiv(rows, wanted), kRows) * kRows;
  const int64_t row_chunks = CeilDiv(rows, chunk_rows);
  TORCH_CHECK(row_chunks < 65536 && col_chunks < (int64_t{1} << 31),
              "LoRA gradients kernel: g is too large");
  const auto floats = first.options().dtype(at::kFloat);
  PairArgs args{};
  ReduceArgs reduce{};
  std::vector<at::Tensor> workspaces;  // the partial sums, alive until both kernels are queued
  int chunk = 0;
  for (size_t i = 0; i < pairs.size(); ++i) {
    const PairOperands& p = pairs[i];
    const int64_t cols = p.g.size(1), chunks = CeilDiv(cols, chunk_cols);
    const at::Tensor dha_partial = at::empty({chunks, row_chunks * chunk_rows, R}, floats);
    const at::Tensor db_partial = at::empty({row_chunks, chunks * chunk_cols, R}, floats);
    workspaces.push_back(dha_partial);
    workspaces.push_back(db_partial);
    args.adapters[i] = AdapterArgs{p.g.const_data_ptr(), p.g.stride(0), p.b.const_data_ptr(),
                                   p.ha.const_data_ptr(), p.ha.stride(0), cols, chunk,
                                   dha_partial.mutable_data_ptr<float>(),
                                   db_partial.mutable_data_ptr<float>(), chunks * chunk_cols};
    reduce.adapters[i] = AdapterReduceArgs{
        dha_partial.const_data_ptr<float>(), static_cast<int>(chunks),
        db_partial.const_data_ptr<float>(), cols, chunks * chunk_cols, p.scale, p.dha.data_ptr(),
        p.dha.stride(0), p.db.data_ptr(), p.db.stride(0),
        p.row_scale.defined() ? p.row_scale.const_data_ptr<float>() : nullptr,
        p.row_scale.defined() ? p.dha_scaled.data_ptr() : nullptr,
        p.row_scale.defined() ? p.dha_scaled.stride(0) : 0};
    chunk += static_cast<int>(chunks);
  }
  args.count = static_cast<int>(pairs.size());
  args.rows = rows;
  args.chunk_rows = static_cast<int>(chunk_rows);
  args.rows_padded = row_chunks * chunk_rows;
  auto kernel = LoraGradientPairKernel<T, R, kRows>;
  const size_t shared = SharedBytes<R, kRows>();
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(shared)));
  LaunchDependent(kernel,
                  dim3(static_cast<unsigned>(col_chunks), static_cast<unsigned>(row_chunks)),
                  kThreads, shared, stream, args);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  reduce.rows = rows;
  reduce.rows_padded = row_chunks * chunk_rows;
  reduce.row_chunks = static_cast<int>(row_chunks);
  reduce.r = R;
  const unsigned reduce_blocks = static_cast<unsigned>(
      std::min<int64_t>(CeilDiv(reduce_values / 4, kThreads), int64_t{sms} * 16));
  LaunchDependent(LoraGradientReduceKernel<T>,
                  dim3(reduce_blocks, static_cast<unsigned>(pairs.size())), kThreads, 0, stream,
                  reduce);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T>
void LaunchOfRank(const std::vector<PairOperands>& pairs, int blocks_per_sm, int tile_rows) {
  const bool short_tiles = tile_rows == 32;  // ranks 16 and 32 only: dB's sums would not fit
  switch (pairs[0].b.size(1)) {
    case 16:
      if (short_tiles) return Launch<T, 16, 32>(pairs, blocks_per_sm);
      return Launch<T, 16, 64>(pairs, blocks_per_sm);
    case 32:
      if (short_tiles) return Launch<T, 32, 32>(pairs, blocks_per_sm);
      return Launch<T, 32, 64>(pairs, blocks_per_sm);
    case 48: return Launch<T, 48, 64>(pairs, blocks_per_sm);
    case 64: return Launch<T, 64, 64>(pairs, blocks_per_sm);
    default:
      TORCH_CHECK(false, "LoRA gradients kernel: rank ", pairs[0].b.size(1),
                  " is not 16, 32, 48 or 64");
  }
}

}  // namespace

void LoraGradientPairs(const std::vector<PairOperands>& pairs, int blocks_per_sm, int tile_rows) {
  TORCH_CHECK(!pairs.empty() && pairs.size() <= static_cast<size_t>(kMaxAdapters),
              "LoRA gradients kernel: 1 to ", kMaxAdapters, " adapters a launch");
  if (pairs[0].g.scalar_type() == at::kBFloat16) {
    LaunchOfRank<c10::BFloat16>(pairs, blocks_per_sm, tile_rows);
  } else {
    LaunchOfRank<c10::Half>(pairs, blocks_per_sm, tile_rows);
  }
}

}  // namespace qlora::kernels::cuda
