// The LLaMA causal language model in LibTorch, with frozen (dense or 4-bit) base weights and
// optional LoRA adapters: the HF `LlamaForCausalLM` computation (modeling_llama.py), and with
// the family fields of the config (model_family.h) `MistralForCausalLM` (sliding-window
// attention) and `Qwen2ForCausalLM` (q/k/v biases, tied embeddings, windowed layers).
//
//   h   = x + o_proj(attn(rope(q_proj(n)), rope(k_proj(n)), v_proj(n)))      n = RMSNorm(x)
//   out = h + down_proj(silu(gate_proj(m)) * up_proj(m))                     m = RMSNorm(h)
//
// RMSNorm computes in float32 and casts back before the weight; rotary embeddings pair dim i with
// i + d/2 (HF convention) with default, linear or llama3 frequencies. Attention is
// at::scaled_dot_product_attention (causal, GQA) for unpacked rows; a sliding layer drops keys at
// or beyond `sliding_window` positions back (transformers: key > query - window) through a mask
// built only when a row is longer than the window. Packed rows (ForwardOptions::block_diagonal)
// attend within their documents through varlen_attention.h: flash-attention's varlen kernels on
// CUDA in bf16/fp16 (no mask: memory and time as unpacked rows), the dense block-diagonal mask
// elsewhere; the document layout is computed once per Forward. Each decoder layer is
// activation-checkpointed while training (all by default; SetCheckpointedLayers picks the first
// n); its recomputation stops at what backward reads (the down projection's frozen GEMM and the
// last residual add, whose values nothing reads, are skipped).
//
// Thread-safety: Forward may run concurrently with itself; setters and AddLora may not.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "worker/engine/activation_offload.h"
#include "worker/engine/causal_lm_loss.h"
#include "worker/engine/kv_cache.h"
#include "worker/engine/linear4bit.h"
#include "worker/engine/varlen_attention.h"
#include "common/model/llama_config.h"

namespace qlora::engine {

// The seven projections of a decoder layer, by their HF module names (common/model).
inline constexpr const auto& kLinearModuleNames = kProjectionNames;

struct LoraOptions {
  int64_t r = 8;
  double alpha = 8.0;
  double dropout = 0.0;
  // HF module names (matched like PEFT: a name or its last component), or {"all-linear"}.
  std::vector<std::string> target_modules = {"q_proj", "v_proj"};
  bool use_rslora = false;  // scale alpha / sqrt(r) instead of alpha / r
  uint64_t seed = 0;        // A's kaiming-uniform draw (on CPU, so identical on every device)
};

struct ForwardOptions {
  // [batch, seq] int64; default arange(seq) per row. Any device: packed rows read them on the
  // host (documents' offsets and lengths), so host tensors spare a device synchronization.
  at::Tensor position_ids;
  // Packed rows: attention is causal within the runs that start where position_ids == 0 (and at
  // each row's start), and never crosses into another run (needs position_ids).
  bool block_diagonal = false;
  // input_ids on the host (pinned, int64), where the caller has them: an input embedding table
  // kept in host memory (LlamaForCausalLM::embed_tokens) gathers its rows from them without
  // reading the ids back from the device.
  at::Tensor host_input_ids;
};

// One decoder layer's weights. Shapes: norms [hidden]; linears as in HF ([out, in]).
struct DecoderLayer {
  at::Tensor input_layernorm;           // [hidden]
  at::Tensor post_attention_layernorm;  // [hidden]
  LinearLayer q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;

  LinearLayer& Linear(const std::string& name);
  const LinearLayer& Linear(const std::string& name) const;
};

class BaseWeightStore;

class LlamaForCausalLM {
 public:
  // An empty model of `config` whose weights the loader (hf_loader.h) fills in.
  LlamaForCausalLM(LlamaConfig config, at::ScalarType compute_dtype, at::Device device);

  const LlamaConfig& config() const { return config_; }
  // The layers' GEMM tuner (on CUDA; null elsewhere): shapes tuned so far, for logs and tests.
  const kernels::GemmTuner* gemm_tuner() const { return gemm_tuner_.get(); }
  at::ScalarType compute_dtype() const { return compute_dtype_; }
  // The adapters' compute-dtype copies: open an AdapterCopyScope on them over work during which
  // no adapter changes (an optimizer step's forwards and backwards) to cast each adapter once.
  AdapterCopies& adapter_copies() const { return *adapter_copies_; }
  at::Device device() const { return device_; }

  // Weights (filled by the loader).
  // [vocab, hidden], compute dtype; on the device, or (untied, LoadOptions::
  // input_embedding_in_host_memory) in pinned host memory, its rows gathered there (EmbedTokens).
  at::Tensor embed_tokens;
  std::vector<DecoderLayer> layers;
  at::Tensor norm;          // [hidden]
  at::Tensor lm_head;       // [vocab, hidden]; the same tensor as embed_tokens when tied

  // Adds fresh adapters (PEFT init: A ~ kaiming_uniform(a=sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)),
  // B = 0) to the target modules. InvalidArgument for an unknown module name or r < 1;
  // FailedPrecondition when adapters exist already.
  absl::Status AddLora(const LoraOptions& options);
  bool has_lora() const { return lora_.has_value(); }
  // Swaps the layers' adapters with `adapters` (per layer, per module in kLinearModuleNames
  // order, layers x 7 entries; an empty entry is no adapter: that projection computes its base
  // alone); a second swap with the same vector restores them. For a reference forward under no
  // grad (the preference objectives: the base with the adapter disabled, or the adapter the job
  // started from). InvalidArgument for a vector of another size; FailedPrecondition while an
  // AdapterCopyScope is open (its copies are of the adapters that would be swapped out).
  absl::Status SwapAdapters(std::vector<std::optional<LoraWeights>>* adapters);
  const LoraOptions& lora_options() const { return *lora_; }

  // Training mode enables LoRA dropout and activation checkpointing (if on).
  void SetTraining(bool training) { training_ = training; }
  bool training() const { return training_; }
  // While training, the first `n` decoder layers (clamped to [0, layers]) are activation-
  // checkpointed and the others keep their activations for backward; all by default. The last
  // layers are the plain ones because backward frees their activations before the first
  // recomputation (activation_plan.h). Every split computes the same values and gradients.
  void SetCheckpointedLayers(int64_t n);
  int64_t checkpointed_layers() const { return checkpointed_layers_; }
  void SetGradientCheckpointing(bool on) {
    SetCheckpointedLayers(on ? static_cast<int64_t>(layers.size()) : 0);
  }
  bool gradient_checkpointing() const { return checkpointed_layers_ > 0; }
  // While training, `n` layers (clamped to [0, layers]) keep what they save for backward in
  // pinned host memory (activation_offload.h) instead of on the device, and are neither
  // recomputed nor hold device memory between their forward and backward. They are taken from
  // the checkpointed layers, spread evenly over them, then (n larger than those) from the plain
  // ones below the top layer, spread evenly over those (activation_offload_plan.h: PlaceOffloads, which also
  // says where backward fetches them back); 0 (the default) turns offloading off. With
  // offloading on, the checkpointed layers' inputs wait in host memory too (but the top layer's);
  // `inputs` >= 0 says how many (the highest), and with n = 0 offloads those inputs alone
  // (memory::ActivationPlanRequest::offloaded_inputs). Same values and gradients as any split.
  // (The offloader's groups are two a layer: OffloadLateGroup, OffloadEarlyGroup.)
  void SetOffloadedLayers(int64_t n, ActivationOffloadOptions options = {}, int64_t inputs = -1);
  int64_t offloaded_layers() const;
  int64_t offloaded_inputs() const;  // checkpointed layers whose input waits in host memory
  // Checkpointed layers run their MLP (post-attention norm, gate/up, SwiGLU, down) over tiles of
  // `rows` rows (0, the default: whole) when a micro-batch has more: the first forward a tile at a
  // time, the recomputation one checkpoint per tile, so that backward holds one tile's MLP
  // tensors instead of every row's (at rows of hundreds of thousands of tokens, the step's
  // peak). Without LoRA dropout no MLP runs more often than untiled; with it the recomputation
  // runs each tile's forward once more, to draw its masks again in order. The same values; the
  // adapters' gradients up to their summation order over tiles (and LoRA dropout draws its masks
  // a tile at a time). Any forward without grad (evaluation too) runs its MLPs in tiles.
  void SetMlpTileRows(int64_t rows) { mlp_tile_rows_ = std::max<int64_t>(rows, 0); }
  int64_t mlp_tile_rows() const { return mlp_tile_rows_; }
  // Layer i's groups in the offloader. Late: what its attention saves, fetched only once the
  // layer above has done its MLP backward, so that it is not on the device through that layer's
  // peak (its MLP's backward; 320 MiB at the 7B shape and micro-batch 4), and still arrives
  // during that layer's attention backward and this layer's MLP backward. Early: what its MLP
  // saves, and a checkpointed layer's input, fetched a layer or two ahead (PlaceOffloads).
  static int64_t OffloadLateGroup(int64_t layer) { return 2 * layer; }
  static int64_t OffloadEarlyGroup(int64_t layer) { return 2 * layer + 1; }
  // The first `n` decoder layers (clamped to [0, layers]) hold their 4-bit weights dequantized
  // in the compute dtype for as long as this stays set (dequantized_layers.h: no dequantization in
  // their forward or backward, DequantizedLayerBytes each); 0 (the default) drops them. The
  // bottom layers, for two reasons: a step's forward starts with them, where the host has queued
  // nothing ahead of the GPU yet, and a layer's big GEMMs let the host get ahead where a
  // dequantizing layer's many short kernels keep the GPU waiting for each launch (held at the
  // top instead, the GPU idled in the first layers' dequantization); and checkpointed layers
  // are the first ones, whose recomputation dequantizes once more. The same values and gradients
  // with any n.
  void SetDequantizedLayers(int64_t n);
  int64_t dequantized_layers() const { return dequantized_layers_; }
  // Device bytes one more dequantized layer takes (the largest layer's; 0 without 4-bit weights):
  // its buffers less its codes, which wait in host memory while it is held (on CUDA).
  int64_t DequantizedLayerBytes() const;
  // The decoder layers' frozen weights live in `store` (base_weight_store.h: partitioned across
  // ranks, or in host memory) from now on, and `layers` keep the rest (the loader hands each
  // layer's weights to the store as it reads them). Kept dequantized layers are dropped and
  // none are held again: their weights would be whole on the device for the whole job.
  void UseBaseWeightStore(std::shared_ptr<BaseWeightStore> store);
  const BaseWeightStore* base_weight_store() const { return base_weights_.get(); }
  // Layer i with its frozen weights whole (from the store, or layers[i] itself without one).
  // With a partitioned store a collective: every rank asks for the same layers in order.
  std::shared_ptr<const DecoderLayer> WholeLayer(int64_t i) const;
  // The offloader (null until SetOffloadedLayers > 0): bytes moved, for logs and tests.
  const ActivationOffloader* activation_offloader() const { return offloader_.get(); }
  // Bytes of the model's tensors: weights (4-bit blocks and their scales), norms, biases and
  // adapters (tied embeddings counted once) that are on the model's device.
  int64_t BuiltBytes() const;
  // input_ids [batch, seq] -> their rows of embed_tokens [batch, seq, hidden] on the model's
  // device. A table in host memory gathers them there, from `host_input_ids` where given (else
  // input_ids read back), into pinned rows copied without blocking the host: a gather is exact,
  // and the copy (T x hidden, 64 MiB at 8192 tokens of hidden 4096) spares the device the whole
  // table (250 MiB at the 7B shape, 1 GiB at a 128k vocabulary).
  at::Tensor EmbedTokens(const at::Tensor& input_ids,
                         const at::Tensor& host_input_ids = at::Tensor()) const;
  // Whether embed_tokens waits in host memory while the model is on a GPU (by placement:
  // device() may name no index where the table's names one).
  bool InputEmbeddingOnHost() const {
    return embed_tokens.defined() && embed_tokens.is_cpu() && !device_.is_cpu();
  }

  // input_ids [batch, seq] int64 -> final hidden states [batch, seq, hidden] (after the last
  // RMSNorm), in the compute dtype. Throws c10::Error on bad shapes.
  at::Tensor Forward(const at::Tensor& input_ids, const ForwardOptions& options = {}) const;
  // Incremental inference (generation, llama_decode.cc): input_ids [batch, seq] at positions
  // cache->length() onward, attending to the cached positions before them and causally among
  // themselves (sliding layers: within their window). Appends the new keys and values to
  // `cache` and returns the final hidden states [batch, seq, hidden]. Needs no grad; the same
  // values as Forward over the whole sequence up to the attention's summation order.
  at::Tensor ForwardCached(const at::Tensor& input_ids, KvCache* cache) const;
  // A cache with room for `capacity` positions of `batch` rows, on the model's device.
  KvCache NewKvCache(int64_t batch, int64_t capacity) const;
  // hidden [..., hidden] -> logits [..., vocab] in the compute dtype (all positions at once; for
  // inference and tests; training uses CausalLmLoss).
  at::Tensor Logits(const at::Tensor& hidden) const;
  // Summed causal-LM cross-entropy of Forward's output against unshifted labels (-100 =
  // ignored) and the number of target tokens; chunked, see causal_lm_loss.h.
  CausalLmLoss Loss(const at::Tensor& hidden, const at::Tensor& labels,
                    const LossOptions& options = {}) const;

  // The LoRA parameters as (PEFT state-dict name, tensor) in a fixed order: layer, then module
  // (q, k, v, o, gate, up, down), then lora_A before lora_B. E.g.
  // "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight".
  std::vector<std::pair<std::string, at::Tensor>> TrainableParameters() const;

 private:
  // One layer's attention: plain causal SDPA (nothing set), SDPA with a dense mask (unpacked
  // rows of a sliding layer longer than its window), or within documents (packed rows; window 0
  // for full layers).
  struct LayerAttention {
    at::Tensor mask;  // [1, 1, seq, seq] bool, true = attend
    std::optional<DocumentLayout> documents;
    int64_t window = 0;
  };

  // One layer of ForwardCached.
  at::Tensor LayerForwardCached(const DecoderLayer& layer, int64_t index, const at::Tensor& x,
                                const at::Tensor& cos, const at::Tensor& sin,
                                KvCache* cache) const;
  // What a layer's forward does for activation offloading (all off by default): `offloader`
  // with `mlp_group` >= 0 (an offloaded layer, whose attention saves go to its late group under
  // the caller's OffloadScope): the MLP's saves go to `mlp_group` (its early group);
  // `prefetch_after_mlp` >= 0: once the layer's MLP backward is done (a hook on the gradient of
  // the residual stream between attention and MLP), that group is fetched (the late group of an
  // offloaded layer just below).
  struct LayerOffloading {
    std::shared_ptr<ActivationOffloader> offloader;
    int64_t mlp_group = -1;
    int64_t prefetch_after_mlp = -1;
  };
  // The offloading of layer i's forward (null offloader: none).
  LayerOffloading OffloadingOf(int64_t i,
                               const std::shared_ptr<ActivationOffloader>& offloader) const;
  // value_unused: the checkpoint's recomputation (the output carries the graph only).
  at::Tensor LayerForward(const DecoderLayer& layer, const at::Tensor& x, const at::Tensor& cos,
                          const at::Tensor& sin, const LayerAttention& attention,
                          bool value_unused, const LayerOffloading& offloading) const;
  // The MLP half of a layer: residual + o (o undefined: residual alone) through the
  // post-attention norm, gate/up, SwiGLU and down, with the residual added.
  at::Tensor MlpForward(const DecoderLayer& layer, const at::Tensor& residual, at::Tensor o,
                        bool value_unused, const LayerOffloading& offloading) const;
  // MlpForward over tiles of mlp_tile_rows_ rows (SetMlpTileRows), in a checkpointed layer's
  // first forward (no grad) or its recomputation (value_unused).
  at::Tensor TiledMlpForward(const DecoderLayer& layer, const at::Tensor& residual, at::Tensor o,
                             bool value_unused, const LayerOffloading& offloading) const;

  LlamaConfig config_;
  at::ScalarType compute_dtype_;
  at::Device device_;
  at::Tensor inv_freq_;  // [head_dim / 2] float32, with the config's rope scaling
  std::optional<LoraOptions> lora_;
  bool training_ = false;
  int64_t checkpointed_layers_ = 0;  // the constructor: every layer
  int64_t offload_request_ = 0;      // SetOffloadedLayers' n, re-applied when the split changes
  int64_t offload_inputs_request_ = -1;  // SetOffloadedLayers' inputs, likewise
  int64_t dequantized_layers_ = 0;   // SetDequantizedLayers' n (clamped)
  int64_t mlp_tile_rows_ = 0;        // SetMlpTileRows
  std::vector<bool> offloaded_;      // per layer
  std::vector<bool> input_offloaded_;  // per layer
  // Per layer: the groups (layers) whose offloaded tensors its output's hook fetches.
  std::vector<std::vector<int64_t>> prefetch_at_;
  std::shared_ptr<ActivationOffloader> offloader_;
  std::shared_ptr<BaseWeightStore> base_weights_;  // null: every layer's weights in `layers`
  void PlaceOffloadedLayers();
  std::shared_ptr<kernels::GemmTuner> gemm_tuner_;  // shared by every LinearLayer::gemm
  std::shared_ptr<AdapterCopies> adapter_copies_;   // every LinearLayer::adapter_copies
  // cos/sin [batch, 1, seq, head_dim] for positions [batch, seq].
  std::pair<at::Tensor, at::Tensor> RotaryTables(const at::Tensor& positions) const;
  // The same for positions 0..seq-1 of every row ([1, 1, seq, head_dim]), kept from one forward
  // to the next: unpacked rows ask for the same tables every step (eight small kernels, and
  // their launches at each step's start, where the GPU waits for the host).
  std::pair<at::Tensor, at::Tensor> DefaultRotaryTables(int64_t seq) const;
  struct RotaryTableCache;
  std::shared_ptr<RotaryTableCache> rotary_tables_;
};

// RMSNorm: x * rsqrt(mean(x^2) + eps) * weight, computed in float32 with one rounding to x's
// dtype at the end (ATen's rms_norm; a fused kernel on CUDA). HF rounds the normalized value to
// the input dtype before the weight product: in bf16 the two agree within one ulp.
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);

// HF module path of a projection: "self_attn.q_proj" or "mlp.gate_proj".
std::string ModulePath(const std::string& module_name);

// Rotary inverse frequencies [head_dim / 2] (float32) for a config, as transformers'
// ROPE_INIT_FUNCTIONS compute them.
at::Tensor RopeInverseFrequencies(const LlamaConfig& config);

// The model in evaluation mode (no dropout, no checkpointing) until the scope ends, on every
// way out (an evaluation that fails half-way leaves the model training as it was).
class EvalModeScope {
 public:
  explicit EvalModeScope(LlamaForCausalLM& model) : model_(model), was_training_(model.training()) {
    model_.SetTraining(false);
  }
  ~EvalModeScope() { model_.SetTraining(was_training_); }
  EvalModeScope(const EvalModeScope&) = delete;
  EvalModeScope& operator=(const EvalModeScope&) = delete;

 private:
  LlamaForCausalLM& model_;
  const bool was_training_;
};

}  // namespace qlora::engine
