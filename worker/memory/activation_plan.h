// How many decoder layers to activation-checkpoint so that a training step fits a memory budget
// (trainer.enable_gradient_checkpointing: auto). Torch-free: a model of what this engine keeps
// alive during a step, in bytes, from the model's shape and the step's size.
//
// Which layers: the first `checkpointed_layers` are checkpointed, the last ones run plainly
// (LlamaForCausalLM::SetCheckpointedLayers). Backward visits the layers last to first, so the
// plain layers' saved activations are freed before the first recomputation starts: the
// recomputed layer's activations then come on top of the checkpointed layers' inputs only. With
// the plain layers first instead, every one of them would still be held while the top
// checkpointed layer is recomputed, one layer's activations more at the peak.
//
// Per token, with d the compute dtype's bytes, H hidden, I intermediate, Q = heads * head_dim,
// K = kv_heads * head_dim (what LayerForward, the LoRA nodes, fused_ops.cc and
// causal_lm_loss.cc save for backward):
//   plain layer        input_layernorm: x (H d) + rstd (4); q, k, v, attention output (2Q + 2K)
//                      d and its logsumexp (4 heads) (flash SDPA); post_attention_layernorm: h
//                      (H d) + rstd (4); SwiGLU: gate and up (2 I d); the 4-bit GEMMs save only
//                      their (frozen) weight. LoRA: each adapted module saves its input (shared:
//                      n = norm(x) for q/k/v, the attention output for o, m = norm(h) for
//                      gate/up; counted once each) and h A^T (r d); down's input, the SwiGLU
//                      output, is not saved: its backward gets it again (SwigluThenForward).
//                      With fused norms (CUDA), the q/k/v and gate/up nodes keep the norms'
//                      sources x and h and their rstd instead of n and m (linear4bit.h
//                      NormedInput): n and m are not counted.
//                      With LoRA dropout each adapted module keeps its own dropped input
//                      (in d) and the dropout mask (in bytes of `dropout_mask_bytes`) instead.
//   checkpointed layer its input only (H d); its recomputation saves what a plain layer does
//                      and the SwiGLU output (I d) for an adapted down_proj
//   one layer's backward  (recompute +) gradients: max of the MLP's (2H + 2I) d (SwiGLU's gate
//                      gradient written over the down projection's input gradient) and the
//                      attention's (2H + 2Q + 2K) d + 4Q (the flash kernel's float32 dq)
//   around the layers  final norm input, its output and the loss's row-major copy (3 H d + 4),
//                      the rotary tables (2 head_dim d); the loss (computed with its gradient
//                      in forward) adds grad_hidden (H d per token) and one chunk of logits in
//                      the compute dtype (chunk x vocab x d), which become their own gradient
// and, besides tokens: what is allocated once the model, the adapters and the optimizer are
// built (measured by the caller), the parameters' gradients (4 bytes per trainable element), the
// adapters' copies in the compute dtype (d per trainable element, and per element of the q/k/v
// and gate/up As again: their concatenations; adapter_copies.h), and one dequantized weight (the
// largest, out x in x d) in backward.
//
// The peak is the largest of: the loss with every layer's saved tensors held; the
// top layer's backward; the top checkpointed layer's recompute-and-backward once the plain
// layers are freed. (So the top layer runs plainly for free when the recomputation sets the
// peak: backward would recompute it first thing, with every other layer's input still held.) The plan keeps it under (1 - margin_fraction) x budget; the margin is for
// the caching allocator's fragmentation and what the model leaves out (cuBLAS workspaces,
// kernels' scratch). The packed rows' block-diagonal attention mask path is modelled as the
// causal one; the worker's measurement of the first steps corrects what the model misses.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/llama_config.h"

namespace qlora::memory {

// The model's shape is common/model's (config.json as the engine reads it).
using engine::LlamaConfig;
using engine::kProjectionNames;

struct ActivationPlanRequest {
  LlamaConfig model;                  // the shape: hidden, intermediate, heads, layers, vocab
  int64_t micro_batch = 1;
  int64_t sequence_length = 512;      // the longest row a micro-batch may have
  int64_t dtype_bytes = 2;            // compute dtype
  int64_t lora_r = 0;                 // 0: no adapters
  std::vector<std::string> lora_targets;  // module names (q_proj, ...), already expanded
  bool lora_dropout = false;          // dropout > 0 while training
  int64_t dropout_mask_bytes = 1;     // per element: a bool mask on CUDA, d on the CPU
  bool fused_norms = false;           // the decoder's norms are fused nodes (CUDA: fused_ops.h)
  int64_t trainable_elements = 0;     // their gradients (float32) exist during backward
  // Allocated once the model, adapters and optimizer are built (weights, NF4 blocks, adapters,
  // fp32 master copy, AdamW state, gradient buffers).
  int64_t built_bytes = 0;
  // Measured minus planned of an earlier step (the worker's correction; 0 at first).
  int64_t correction_bytes = 0;
  int64_t offloaded_layers = 0;
  int64_t loss_chunk = 1024;          // positions per loss chunk (causal_lm_loss.h)
  // Layers whose saved tensors wait in host memory (LlamaForCausalLM::SetOffloadedLayers),
  // taken from the checkpointed ones first: they hold no device memory between forward and
  // backward; one layer's worth waits for its copy in forward, and in backward an offloaded
  // layer's tensors are back on the device with the next one's on their way (two layers). The
  // other checkpointed layers' inputs are offloaded as well: two of them on the device at most.
  // Inputs of checkpointed layers (neither offloaded layers nor the top one) waiting in host
  // memory, the highest first: -1 = every one of them while any layer is offloaded, none
  // otherwise (OffloadedInputs). A count offloads inputs alone, with no layer offloaded: the
  // longest rows, whose every input the host cannot hold, nor the device beside one layer's
  // recomputation.
  int64_t offloaded_inputs = -1;
  // Checkpointed layers' MLPs over tiles of this many rows (LlamaForCausalLM::SetMlpTileRows;
  // 0: whole): their recomputation holds one tile's MLP tensors, not every row's.
  int64_t mlp_tile_rows = 0;
  int64_t budget_bytes = 0;
  double margin_fraction = 0.08;      // of the budget, kept free
  // Where the base weights are sharded or streamed (base_weight_plan.h), the bytes of one
  // decoder layer made whole on the device: two are in flight at any time (the layer in use and
  // the one prefetched), and a plain layer's autograd graph keeps its own until its backward (a
  // checkpointed layer's is gathered again for its recomputation). 0: weights whole on the device,
  // counted in built_bytes.
  int64_t gathered_layer_bytes = 0;
};

// Of `offloaded` layers with the first `checkpointed` of `layers` checkpointed, how many are
// checkpointed ones (LlamaForCausalLM::SetOffloadedLayers takes those first, never the top layer).
int64_t OffloadedCheckpointedLayers(int64_t layers, int64_t checkpointed, int64_t offloaded);

// Which layers `offloaded` offloaded layers (clamped to [0, layers - 1]) take with the first
// `checkpointed` checkpointed: never the top one; first the checkpointed layers, spread evenly
// over them, then plain ones, spread evenly over theirs (PlaceOffloads adds where each comes back).
std::vector<bool> OffloadedLayerSet(int64_t layers, int64_t checkpointed, int64_t offloaded);

// Whether two of those layers are neighbours: in forward the lower one's tensors are still on
// their way to host memory when the upper one saves (the offloader waits only for layer g - 2's
// copies when layer g first saves), so two layers' tensors are in transit, not one.
bool OffloadedNeighbours(int64_t layers, int64_t checkpointed, int64_t offloaded);

// Of the checkpointed layers' inputs (offloaded layers' and the top layer's aside), how many wait
// in host memory with the first `checkpointed` of `layers` checkpointed, `offloaded` layers
// offloaded and `requested` inputs asked for (ActivationPlanRequest::offloaded_inputs).
int64_t OffloadedInputCount(int64_t layers, int64_t checkpointed, int64_t offloaded, int64_t requested);
// The same for the request's layers and offloaded_inputs.
int64_t OffloadedInputs(const ActivationPlanRequest& request, int64_t checkpointed, int64_t offloaded);

// Bytes per token of one decoder layer.
struct LayerActivationBytes {
  int64_t plain = 0;         // saved for backward by a layer that is not checkpointed
  int64_t checkpointed = 0;  // kept by a checkpointed layer (its input)
  int64_t recomputed = 0;    // saved by a checkpointed layer's recomputation, its input aside
  int64_t backward = 0;      // transient of one layer's backward (gradients, workspaces)
  // More at a layer's backward where no layer is checkpointed: q/k/v's gradients packed into
  // rows for one input-gradient GEMM (linear4bit.h SharedInputRotary::packed_gradients).
  int64_t packed_gradients = 0;
  // A checkpointed layer recomputed with its MLP in tiles (mlp_tile_rows): what the
  // recomputation saves per token (the attention's and h), what its
  // backward takes per token (the attention's gradients), and per row of a tile (the tile's MLP
  // saves and gradients, one tile at a time).
  int64_t recomputed_tiled = 0;
  int64_t backward_tiled = 0;
  int64_t tile_row = 0;
};

// Rows a tile when the plan tiles the MLPs: about where a tile's GEMMs (8192 x hidden x
// intermediate) still run at the full rate, while its tensors take ~1.3 GiB at the 7B shape.
inline constexpr int64_t kMlpTileRows = 8192;

// Whether a micro-batch of the request has more rows than one tile (tiles could lower its peak).
bool MoreRowsThanATile(const ActivationPlanRequest& request);

// What the plan may fill of `budget_bytes`: the budget less its margin.
int64_t UsableBytes(const ActivationPlanRequest& request, int64_t budget_bytes);

LayerActivationBytes PerTokenLayerBytes(const ActivationPlanRequest& request);

// The planned peak allocation of a step with the first `checkpointed_layers` checkpointed.
int64_t PlannedPeakBytes(const ActivationPlanRequest& request, int64_t checkpointed_layers);

struct ActivationPlan {
  int64_t checkpointed_layers = 0;
  int64_t mlp_tile_rows = 0;       // the request's, or kMlpTileRows where only tiles fit
  int64_t layers = 0;
  int64_t planned_peak_bytes = 0;  // PlannedPeakBytes of the choice
  int64_t budget_bytes = 0;
};

// The split with the least memory and, at that, the least recomputation: every layer
// checkpointed, or all but the top one when keeping the top layer's activations costs no more
// than recomputing it (backward recomputes it first thing). trainer.enable_gradient_checkpointing:
// true runs this split; auto never checkpoints more.
int64_t LeanestCheckpointedLayers(const ActivationPlanRequest& request);

// enable_gradient_checkpointing: true: kMlpTileRows where the planned peak with `checkpointed`
// layers checkpointed and whole MLPs exceeds `device_bytes` less the margin and a micro-batch
// has more rows than a tile, else 0.
int64_t MlpTileRowsFor(const ActivationPlanRequest& request, int64_t checkpointed,
                       int64_t device_bytes);

// The fewest checkpointed layers whose planned peak stays under the budget less its margin;
// where even the leanest split does not fit with whole MLPs and a micro-batch has more than
// kMlpTileRows rows, the same with the MLPs in tiles of that many.
// InvalidArgument for a budget <= 0 or a shape without layers or tokens; FailedPrecondition
// when even every layer checkpointed does not fit (the message names both numbers).
absl::StatusOr<ActivationPlan> PlanCheckpointing(const ActivationPlanRequest& request);

// "activation checkpointing: 20 of 32 layers checkpointed, planned peak 21.3 GiB of a 24.0 GiB
// budget".
std::string DescribePlan(const ActivationPlan& plan);

// "21.3 GiB", or "412.0 MiB" under one GiB.
std::string FormatMemory(int64_t bytes);

}  // namespace qlora::memory
