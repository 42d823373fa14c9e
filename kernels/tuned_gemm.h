// Half-precision GEMMs (bf16/fp16 on CUDA) through cuBLASLt with, for each shape, the fastest of
// the library's candidate algorithms, timed once on first use. ATen's matmul runs cuBLAS's first
// heuristic pick, which for some of the engine's shapes is several percent slower than the best
// kernel the library has. Everywhere else (CPU, float32, strides cuBLASLt cannot take) it is
// at::addmm_out, so callers need no second path.
//
// Tuning: the first call of a shape class (the operations, beta == 0, and the octave of m, n and
// k, a side under 64 by its own value: rows that vary from step to step, as packed or padded
// batches do, fall in one or two octaves and are tuned once or twice) times ATen's call, up to
// `candidates` algorithms of cuBLASLt's heuristic and up to `variants` of them (the other custom
// options and CTA swizzling of the same tiles, which the heuristic does not offer; more than
// `finalists` are first timed once each and the fastest go on) (each the median of three
// batches, taken in turns across the candidates after the GPU has been heated to its power
// limit: what wins on a cool GPU is not always what wins in a training step, ~20 % lower
// clocked) on scratch memory taken from the driver, outside ATen's caching allocator (its peaks,
// which the memory plan reads, do not move; where the driver has no memory left the class stays
// on ATen's call). The fastest
// candidate is kept only when it beats ATen's call by 1.5 %, so that timing noise rarely moves a
// shape off ATen's choice; other shapes of the class run it where cuBLASLt accepts it for them
// (cublasLtMatmulAlgoCheck), else ATen's call.
//
// Numerics: every candidate accumulates in float32. None splits K (sums K in parts across
// blocks) except for thin outputs (GemmTunerOptions::split_k_max_output_side), and there only
// with the parts kept in float32 and added in a fixed order, as ATen's own pick for such shapes
// does; results may differ from ATen's in the last bit where tile shapes differ. The choice is
// fixed per tuner: one process's steps are reproducible, and a resumed process equal up to
// those last bits where it chose otherwise.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace qlora::kernels {

struct GemmTunerOptions {
  int candidates = 16;           // heuristic results asked of cuBLASLt per shape
  // Variants of the heuristic's configurations (their algorithm's other custom options and CTA
  // swizzling) timed as well, at most this many per shape; 0: the heuristic's only. Off by
  // default: they found kernels a little faster than the heuristic's best in
  // kernels/tuned_gemm_bench, but no faster 7B step, and they cost seconds of tuning at a job's
  // start (bench/reports/kernels_h200_2026-12-01_04.md, "GEMMs").
  int variants = 0;
  // Past this many candidates, each is timed once first and only the fastest this many (and
  // ATen's call) go on to the three batches that decide.
  int finalists = 16;
  int timing_repetitions = 8;    // runs per timed batch (three batches; the median counts)
  // ATen's call runs back to back this long before a shape's timing, so that the candidates are
  // timed at the GPU's power limit, where a training step keeps it (see Time in the .cc).
  double heat_ms = 50;
  int64_t workspace_bytes = 32 << 20;
  // Outputs with a side at most this (the adapters' weight gradients dA = dh'^T x, [r, in] over
  // K = the step's tokens) may take split-K candidates, float32 parts only (see Numerics): on
  // a few dozen output tiles a kernel that does not split K reads x at a fraction of the memory
  // bandwidth. 0: never split K.
  int64_t split_k_max_output_side = 64;
  // Shape classes tuned at most; calls of further classes run ATen's GEMM.
  int64_t max_shapes = 256;
  // Steady-state timing: where the fastest contender's call takes at least steady_min_call_ms,
  // the `steady_finalists` fastest of the three batches (and ATen's call) each run back to back
  // for steady_ms, twice in turns, and their time a call over the second half of those runs
  // decides. A batch of a few calls is too short for the GPU's power controller to answer a
  // kernel's own draw (the clock it runs at is the one the kernels before it left), so the
  // batches rank kernels by speed at a given clock; in a training step at the power limit a kernel
  // that draws more lowers the clock for itself and everything after it. 0: off. The default
  // costs a job seconds of tuning at its start (about ten large shape classes at 7B).
  double steady_ms = 150;
  int steady_finalists = 3;
  double steady_min_call_ms = 0.2;
};

// One candidate of a shape, as the benchmark prints it.
struct GemmCandidateTiming {
  std::string algorithm;  // "algo=6 tile=... stages=..." (cuBLASLt's configuration ids)
  double milliseconds = 0;         // a call, median of the three batches
  double steady_milliseconds = 0;  // a call in steady state (GemmTunerOptions::steady_ms); 0: not timed so
};

class GemmTuner {
 public:
  explicit GemmTuner(GemmTunerOptions options = {});
  ~GemmTuner();
  GemmTuner(const GemmTuner&) = delete;
  GemmTuner& operator=(const GemmTuner&) = delete;

  // out = beta * out + alpha * (a @ b), for a [m, k] and b [k, n] (contiguous, or transposed
  // views of contiguous matrices) and out [m, n] with unit column stride. beta = 0 never reads
  // out. Tunes the shape first when it is new. With c (defined; out's shape): out = beta * c +
  // alpha * (a @ b), c read in the GEMM's epilogue (cuBLASLt's C apart from D, where c has out's
  // strides: the tuned kernel, or cuBLASLt's first pick where ATen's call won the tuning; else c
  // is copied into out first, as at::addmm_out does) and never written.
  void Addmm(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, double beta,
             double alpha = 1.0, const at::Tensor& c = at::Tensor());

  // Every candidate's time for this call's shape, fastest first, without writing out; empty
  // where the call would not go through cuBLASLt.
  std::vector<GemmCandidateTiming> TimeCandidates(const at::Tensor& out, const at::Tensor& a,
                                                  const at::Tensor& b, double beta);

  // Shape classes tuned so far.
  int64_t tuned_shapes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace qlora::kernels
