// LlamaForCausalLM: rotary tables, RMSNorm, attention, SwiGLU, LoRA set-up and names.
#include "worker/engine/llama_model.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "worker/engine/base_weight_store.h"
#include "worker/engine/checkpoint.h"
#include "worker/engine/cudnn_attention.h"
#include "worker/engine/fused_ops.h"
#include "worker/memory/activation_offload_plan.h"
#include "worker/engine/dequantized_layers.h"

namespace qlora::engine {
namespace {

// Offloader group `group` (>= 0) starts back to the GPU when h's gradient is complete: before the
// post-attention norm's backward, once down, SwiGLU and gate/up have given h theirs (the norm's
// own is elementwise and short).
void PrefetchOnGradient(const at::Tensor& h, const std::shared_ptr<ActivationOffloader>& offloader,
                        int64_t group) {
  if (group < 0 || !h.requires_grad()) return;
  h.register_hook([offloader, group](const at::TensorBase&) { offloader->Prefetch(group); });
}

std::vector<at::Tensor> LayerParameters(const DecoderLayer& layer) {
  std::vector<at::Tensor> params;
  for (const char* name : kLinearModuleNames) {
    const LinearLayer& linear = layer.Linear(name);
    if (linear.lora) {
      params.push_back(linear.lora->a);
      params.push_back(linear.lora->b);
    }
  }
  return params;
}

}  // namespace

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  // ATen's rms_norm: float32 inside, the weight product in float32 and one rounding to the
  // compute dtype at the end (a fused kernel on CUDA: one pass instead of six, forward and
  // backward). HF rounds the normalized value to the input dtype before the weight product, so
  // in bf16 the two differ by at most one ulp; in float32 they are the same computation. The
  // same formula on every device keeps CPU and CUDA results comparable.
  if (weight.scalar_type() == x.scalar_type()) return at::rms_norm(x, {x.size(-1)}, weight, eps);
  at::Tensor h = x.to(at::kFloat);
  const at::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
  h = h * at::rsqrt(variance + eps);
  return weight * h.to(x.scalar_type());
}

std::string ModulePath(const std::string& module_name) {
  const bool attention = module_name == "q_proj" || module_name == "k_proj" ||
                         module_name == "v_proj" || module_name == "o_proj";
  return absl::StrCat(attention ? "self_attn." : "mlp.", module_name);
}

LinearLayer& DecoderLayer::Linear(const std::string& name) {
  return const_cast<LinearLayer&>(static_cast<const DecoderLayer*>(this)->Linear(name));
}

const LinearLayer& DecoderLayer::Linear(const std::string& name) const {
  if (name == "q_proj") return q_proj;
  if (name == "k_proj") return k_proj;
  if (name == "v_proj") return v_proj;
  if (name == "o_proj") return o_proj;
  if (name == "gate_proj") return gate_proj;
  if (name == "up_proj") return up_proj;
  TORCH_CHECK(name == "down_proj", "unknown linear module ", name);
  return down_proj;
}

at::Tensor RopeInverseFrequencies(const LlamaConfig& config) {
  // Mirrors transformers' _compute_default_rope_parameters / _compute_llama3_parameters op by
  // op (float32), so the tables agree to the bit.
  const int64_t dim = config.head_dim;
  const RopeConfig& rope = config.rope;
  at::Tensor exponent = at::arange(0, dim, 2, at::kLong).to(at::kFloat) / dim;
  at::Tensor inv_freq = at::pow(rope.theta, exponent).reciprocal() * 1.0;
  if (rope.type == RopeType::kLinear) return inv_freq / rope.factor;
  if (rope.type != RopeType::kLlama3) return inv_freq;

  const double old_context = static_cast<double>(rope.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / rope.low_freq_factor;
  const double high_freq_wavelen = old_context / rope.high_freq_factor;
  const at::Tensor wavelen = inv_freq.reciprocal() * (2 * M_PI);
  at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq);
  const at::Tensor smooth = (wavelen.reciprocal() * old_context - rope.low_freq_factor) /
                            (rope.high_freq_factor - rope.low_freq_factor);
  const at::Tensor smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled;
  const at::Tensor medium = (wavelen < high_freq_wavelen).logical_not() *
                            (wavelen > low_freq_wavelen).logical_not();
  return at::where(medium, smoothed, scaled);
}

struct LlamaForCausalLM::RotaryTableCache {
  std::mutex mu;
  int64_t seq = -1;  // none yet
  at::Tensor cos, sin;
};

std::pair<at::Tensor, at::Tensor> LlamaForCausalLM::RotaryTables(const at::Tensor& positions) const {
  // Computed in float32 then cast (as HF does).
  const at::Tensor freqs = positions.unsqueeze(-1).to(at::kFloat) * inv_freq_.view({1, 1, -1});
  const at::Tensor emb = at::cat({freqs, freqs}, -1);
  return {emb.cos().to(compute_dtype_).unsqueeze(1), emb.sin().to(compute_dtype_).unsqueeze(1)};
}

std::pair<at::Tensor, at::Tensor> LlamaForCausalLM::DefaultRotaryTables(int64_t seq) const {
  RotaryTableCache& cache = *rotary_tables_;
  std::lock_guard<std::mutex> lock(cache.mu);
  if (cache.seq != seq) {
    std::tie(cache.cos, cache.sin) =
        RotaryTables(at::arange(seq, at::dtype(at::kLong).device(device_)).unsqueeze(0));
    cache.seq = seq;
  }
  return {cache.cos, cache.sin};
}

LlamaForCausalLM::LlamaForCausalLM(LlamaConfig config, at::ScalarType compute_dtype,
                                   at::Device device)
    : config_(std::move(config)),
      compute_dtype_(compute_dtype),
      device_(device),
      inv_freq_(RopeInverseFrequencies(config_).to(device)) {
  layers.resize(config_.num_hidden_layers);
  checkpointed_layers_ = config_.num_hidden_layers;
  adapter_copies_ = std::make_shared<AdapterCopies>();
  rotary_tables_ = std::make_shared<RotaryTableCache>();
  if (device_.is_cuda()) gemm_tuner_ = std::make_shared<kernels::GemmTuner>();
  for (DecoderLayer& layer : layers) {
    for (const char* name : kLinearModuleNames) {
      layer.Linear(name).gemm = gemm_tuner_.get();
      layer.Linear(name).adapter_copies = adapter_copies_.get();
    }
    // o's output gradient comes from the post-attention norm alone, which leaves o's spare
    // columns on CUDA (LayerForward).
    layer.o_proj.owns_output_gradient_spare_columns = true;
  }
}

void LlamaForCausalLM::SetCheckpointedLayers(int64_t n) {
  checkpointed_layers_ = std::clamp<int64_t>(n, 0, static_cast<int64_t>(layers.size()));
  PlaceOffloadedLayers();
}

void LlamaForCausalLM::SetOffloadedLayers(int64_t n, ActivationOffloadOptions options, int64_t inputs) {
  offload_request_ = std::clamp<int64_t>(n, 0, static_cast<int64_t>(layers.size()));
  offload_inputs_request_ = std::max<int64_t>(inputs, -1);
  options.groups_per_layer = 2;  // a layer's late and early groups
  offloader_ = offload_request_ > 0 || offload_inputs_request_ > 0
                   ? std::make_shared<ActivationOffloader>(device_, options)
                   : nullptr;
  PlaceOffloadedLayers();
}

int64_t LlamaForCausalLM::offloaded_layers() const {
  return std::count(offloaded_.begin(), offloaded_.end(), true);
}

int64_t LlamaForCausalLM::offloaded_inputs() const {
  return std::count(input_offloaded_.begin(), input_offloaded_.end(), true);
}

void LlamaForCausalLM::PlaceOffloadedLayers() {
  memory::OffloadPlacement placement = memory::PlaceOffloads(static_cast<int64_t>(layers.size()),
                                             checkpointed_layers_, offload_request_,
                                             offload_inputs_request_);
  offloaded_ = std::move(placement.offloaded);
  input_offloaded_ = std::move(placement.input_offloaded);
  prefetch_at_ = std::move(placement.prefetch_at);
}

LlamaForCausalLM::LayerOffloading LlamaForCausalLM::OffloadingOf(
    int64_t i, const std::shared_ptr<ActivationOffloader>& offloader) const {
  LayerOffloading o;
  if (offloader == nullptr) return o;
  o.offloader = offloader;
  if (offloaded_[i]) o.mlp_group = OffloadEarlyGroup(i);
  if (i > 0 && offloaded_[i - 1]) o.prefetch_after_mlp = OffloadLateGroup(i - 1);
  return o;
}

void LlamaForCausalLM::UseBaseWeightStore(std::shared_ptr<BaseWeightStore> store) {
  SetDequantizedLayers(0);
  base_weights_ = std::move(store);
}

absl::Status LlamaForCausalLM::SwapAdapters(std::vector<std::optional<LoraWeights>>* adapters) {
  const size_t modules = std::size(kLinearModuleNames);
  if (adapter_copies_->in_scope()) {
    return absl::FailedPreconditionError("SwapAdapters: an AdapterCopyScope is open (its copies are of these adapters)");
  }
  if (adapters->size() != layers.size() * modules) {
    return absl::InvalidArgumentError(absl::StrCat("SwapAdapters: ", adapters->size(), " adapters for ",
                                                   layers.size(), " layers of ", modules, " projections"));
  }
  size_t k = 0;
  for (DecoderLayer& layer : layers) {
    for (const auto& name : kLinearModuleNames) std::swap(layer.Linear(name).lora, (*adapters)[k++]);
  }
  return absl::OkStatus();
}

std::shared_ptr<const DecoderLayer> LlamaForCausalLM::WholeLayer(int64_t i) const {
  if (base_weights_ != nullptr) return base_weights_->Whole(i, layers[i]);
  return std::shared_ptr<const DecoderLayer>(std::shared_ptr<void>(), &layers[i]);  // not owned
}

void LlamaForCausalLM::SetDequantizedLayers(int64_t n) {
  const int64_t count = static_cast<int64_t>(layers.size());
  dequantized_layers_ = base_weights_ != nullptr ? 0 : std::clamp<int64_t>(n, 0, count);
  adapter_copies_->ForgetWrites();  // notes of buffers that may go below
  for (int64_t i = 0; i < count; ++i) {
    if (i < dequantized_layers_) {
      KeepDequantized(layers[i], compute_dtype_);
    } else {
      DropDequantized(layers[i]);
    }
  }
}

int64_t LlamaForCausalLM::DequantizedLayerBytes() const {
  if (base_weights_ != nullptr) return 0;  // none are held (UseBaseWeightStore)
  int64_t most = 0;
  for (const DecoderLayer& layer : layers) {
    // Its buffers less its codes, which move to host memory.
    most = std::max(most, DequantizedBufferBytes(layer, compute_dtype_) - MovedCodeBytes(layer));
  }
  return most;
}

int64_t LlamaForCausalLM::BuiltBytes() const {
  auto bytes = [](const at::Tensor& t) -> int64_t { return t.defined() ? t.nbytes() : 0; };
  int64_t total = (InputEmbeddingOnHost() ? 0 : bytes(embed_tokens)) + bytes(norm) +
                  (lm_head.is_same(embed_tokens) ? 0 : bytes(lm_head));
  for (const DecoderLayer& layer : layers) {
    total += bytes(layer.input_layernorm) + bytes(layer.post_attention_layernorm);
    for (const char* name : kLinearModuleNames) {
      const LinearLayer& linear = layer.Linear(name);
      total += bytes(linear.base.dense) + bytes(linear.base.bias);
      if (linear.base.quantized) {
        const kernels::Quantized4bit& q = *linear.base.quantized;
        // A dequantized layer's codes wait in host memory (dequantized_layers.h).
        total += (q.packed.device() == q.absmax.device() ? bytes(q.packed) : 0) + bytes(q.absmax) +
                 bytes(q.nested_absmax);
      }
      if (linear.lora) total += bytes(linear.lora->a) + bytes(linear.lora->b);
    }
    if (layer.q_proj.base.dequantized.defined()) total += DequantizedBufferBytes(layer, compute_dtype_);
  }
  if (base_weights_ != nullptr) total += base_weights_->device_bytes();
  return total;
}

at::Tensor LlamaForCausalLM::EmbedTokens(const at::Tensor& input_ids,
                                         const at::Tensor& host_input_ids) const {
  if (!InputEmbeddingOnHost()) {
    return at::embedding(embed_tokens, input_ids.to(device_, at::kLong));
  }
  TORCH_CHECK(!host_input_ids.defined() || host_input_ids.sizes() == input_ids.sizes(),
              "host_input_ids must have input_ids' shape");
  const at::Tensor ids =
      (host_input_ids.defined() ? host_input_ids : input_ids).to(at::kCPU, at::kLong).reshape({-1});
  // Pinned, so that the copy does not block the host; the caching host allocator keeps the block
  // until the copy has run.
  at::Tensor rows = at::empty({ids.numel(), embed_tokens.size(1)},
                              embed_tokens.options().pinned_memory(true));
  at::index_select_out(rows, embed_tokens, 0, ids);
  std::vector<int64_t> shape = input_ids.sizes().vec();
  shape.push_back(embed_tokens.size(1));
  return rows.to(device_, /*non_blocking=*/true).view(shape);
}

absl::Status LlamaForCausalLM::AddLora(const LoraOptions& options) {
  if (lora_) return absl::FailedPreconditionError("the model already has LoRA adapters");
  if (options.r < 1) return absl::InvalidArgumentError("lora r must be at least 1");
  if (options.dropout < 0 || options.dropout >= 1) {
    return absl::InvalidArgumentError("lora dropout must be in [0, 1)");
  }
  const bool all_linear =
      options.target_modules.size() == 1 && options.target_modules[0] == "all-linear";
  auto matches = [&](const std::string& full_name) {
    if (all_linear) return true;
    for (const std::string& entry : options.target_modules) {
      if (full_name == entry || absl::EndsWith(full_name, absl::StrCat(".", entry))) return true;
    }
    return false;
  };
  // Check every entry matches something before touching the model (PEFT raises likewise).
  if (!all_linear) {
    for (const std::string& entry : options.target_modules) {
      bool found = false;
      for (size_t i = 0; i < layers.size() && !found; ++i) {
        for (const char* module : kLinearModuleNames) {
          const std::string full = absl::StrCat("model.layers.", i, ".", ModulePath(module));
          if (full == entry || absl::EndsWith(full, absl::StrCat(".", entry))) found = true;
        }
      }
      if (!found) {
        return absl::InvalidArgumentError(absl::StrCat(
            "lora target_modules: \"", entry, "\" matches no linear layer (q_proj, k_proj, "
            "v_proj, o_proj, gate_proj, up_proj, down_proj or all-linear)"));
      }
    }
  }

  const double scale = options.use_rslora ? options.alpha / std::sqrt(static_cast<double>(options.r))
                                          : options.alpha / static_cast<double>(options.r);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  for (size_t i = 0; i < layers.size(); ++i) {
    for (const char* module : kLinearModuleNames) {
      if (!matches(absl::StrCat("model.layers.", i, ".", ModulePath(module)))) continue;
      LinearLayer& linear = layers[i].Linear(module);
      const double bound = 1.0 / std::sqrt(static_cast<double>(linear.base.in_features));
      LoraWeights lora;
      lora.a = at::empty({options.r, linear.base.in_features}, at::kFloat)
                   .uniform_(-bound, bound, gen)
                   .to(device_)
                   .requires_grad_(true);
      lora.b = at::zeros({linear.base.out_features, options.r}, at::dtype(at::kFloat).device(device_))
                   .requires_grad_(true);
      lora.scale = scale;
      lora.dropout = options.dropout;
      linear.lora = std::move(lora);
    }
  }
  lora_ = options;
  return absl::OkStatus();
}

at::Tensor LlamaForCausalLM::LayerForward(const DecoderLayer& layer, const at::Tensor& x,
                                          const at::Tensor& cos, const at::Tensor& sin,
                                          const LayerAttention& attention, bool value_unused,
                                          const LayerOffloading& offloading) const {
  const int64_t batch = x.size(0), seq = x.size(1);
  const int64_t heads = config_.num_attention_heads, kv_heads = config_.num_key_value_heads;
  const int64_t head_dim = config_.head_dim;
  const double eps = config_.rms_norm_eps;

  // On CUDA both norms are fused nodes (fused_ops.h): the input norm passes x through as the
  // residual stream (its gradient joins the norm's in one kernel), the post-attention norm adds
  // the attention output first. ATen's ops elsewhere, which the CPU tests pin to transformers.
  auto fused_norm = [&](const at::Tensor& w) {
    return x.is_cuda() && w.scalar_type() == x.scalar_type() && !w.requires_grad();
  };
  // The fused norms leave their outputs' rows room for the q/k/v and gate/up adapters' rank-r
  // projections (SharedInputForward's widened GEMMs).
  const std::vector<const LinearLayer*> qkv_layers = {&layer.q_proj, &layer.k_proj, &layer.v_proj};
  const std::vector<const LinearLayer*> gate_up_layers = {&layer.gate_proj, &layer.up_proj};
  // The fused norms' outputs are given with their sources, which the q/k/v and gate/up nodes
  // keep instead of the outputs (linear4bit.h NormedInput).
  at::Tensor residual, n;
  std::optional<NormedInput> n_source, m_source;
  if (fused_norm(layer.input_layernorm)) {
    // Its gradient (x's, the layer below's output) goes to the down projection below alone,
    // which then writes its dh' beside it (linear4bit.h OutputGradientSpareColumns).
    NormedResidual r = ResidualRmsNorm(x, at::Tensor(), layer.input_layernorm, eps,
                                       SharedInputSpareColumns(qkv_layers, training_),
                                       OutputGradientSpareColumns(layer.down_proj, training_));
    residual = std::move(r.h);
    n = std::move(r.n);
    n_source = NormedInput{residual, std::move(r.rstd), layer.input_layernorm};
  } else {
    residual = x;
    n = RmsNorm(x, layer.input_layernorm, eps);
  }
  // [batch, seq, heads * head_dim] -> [batch, heads, seq, head_dim]
  auto split = [&](const at::Tensor& t, int64_t h) {
    return t.view({batch, seq, h, head_dim}).transpose(1, 2);
  };
  // Every temporary is let go after its last reader (std::exchange): a recomputation's dead
  // projection outputs (q and k before rotary, o) would otherwise live until LayerForward
  // returns, through the step's memory peak.
  // q and k come back rotated (on CUDA with multi-head attention, in place in the packed q/k/v
  // rows the node's one GEMM writes: linear4bit.h).
  // Their gradients packed for one input-gradient GEMM where no layer is checkpointed (one
  // buffer more at a layer's backward: linear4bit.h).
  const SharedInputRotary rotary{cos, sin, batch, seq, head_dim,
                                 /*packed_gradients=*/checkpointed_layers_ == 0};
  std::vector<at::Tensor> qkv = SharedInputForward(qkv_layers, n, training_, false, &rotary,
                                                   n_source ? &*n_source : nullptr);
  n.reset();  // kept by the node where it keeps it (not where it keeps n's source)
  n_source.reset();
  const at::Tensor q = split(std::exchange(qkv[0], {}), heads);
  const at::Tensor k = split(std::exchange(qkv[1], {}), kv_heads);
  const at::Tensor v = split(std::exchange(qkv[2], {}), kv_heads);
  const bool gqa = kv_heads != heads;
  at::Tensor attn;
  if (attention.documents) {
    attn = VarlenCausalAttention(q, k, v, *attention.documents, attention.window);
  } else if (attention.mask.defined()) {
    attn = at::scaled_dot_product_attention(q, k, v, attention.mask, 0.0, false, std::nullopt, gqa);
  } else {
    attn = DenseCausalAttention(q, k, v);
  }
  at::Tensor o =
      layer.o_proj.Forward(attn.transpose(1, 2).reshape({batch, seq, heads * head_dim}), training_);
  // Tiles: a checkpointed layer's first forward (no grad) or its recomputation, rows many, and
  // no saves of its own offloaded (the offloader's groups follow the untiled graph).
  const bool tiled = mlp_tile_rows_ > 0 && batch * seq > mlp_tile_rows_ &&
                     (value_unused || !at::GradMode::is_enabled()) && offloading.mlp_group < 0;
  if (tiled) return TiledMlpForward(layer, residual, std::move(o), value_unused, offloading);
  return MlpForward(layer, residual, std::move(o), value_unused, offloading);
}

at::Tensor LlamaForCausalLM::MlpForward(const DecoderLayer& layer, const at::Tensor& residual,
                                        at::Tensor o, bool value_unused,
                                        const LayerOffloading& offloading) const {
  const at::Tensor& x = residual;
  const double eps = config_.rms_norm_eps;
  auto fused_norm = [&](const at::Tensor& w) {
    return x.is_cuda() && w.scalar_type() == x.scalar_type() && !w.requires_grad();
  };
  const std::vector<const LinearLayer*> gate_up_layers = {&layer.gate_proj, &layer.up_proj};
  std::optional<NormedInput> m_source;
  // An offloaded layer's MLP saves go to its early group (nested in the caller's scope).
  std::optional<OffloadScope> mlp_offload;
  if (offloading.mlp_group >= 0) mlp_offload.emplace(offloading.offloader, offloading.mlp_group);
  at::Tensor h, m;
  if (fused_norm(layer.post_attention_layernorm)) {
    // (A tile's input gradient goes to the tiles' concatenation, not to o: no spare columns.)
    NormedResidual r = ResidualRmsNorm(
        residual, o, layer.post_attention_layernorm, eps,
        SharedInputSpareColumns(gate_up_layers, training_),
        o.defined() ? OutputGradientSpareColumns(layer.o_proj, training_) : 0);
    h = std::move(r.h);
    m = std::move(r.n);
    m_source = NormedInput{h, std::move(r.rstd), layer.post_attention_layernorm};
  } else {
    h = o.defined() ? residual + o : residual;
    m = RmsNorm(h, layer.post_attention_layernorm, eps);
  }
  o.reset();
  PrefetchOnGradient(h, offloading.offloader, offloading.prefetch_after_mlp);
  std::vector<at::Tensor> gate_up = SharedInputForward(gate_up_layers, m, training_, false,
                                                       nullptr, m_source ? &*m_source : nullptr);
  m.reset();
  m_source.reset();
  // With grad, one node for SwiGLU and down (SwigluThenForward): a layer that keeps its
  // activations until backward (no checkpoint) saves gate and up but not their product, which
  // the node gets again in backward; a checkpointed layer's recomputation lives one layer's
  // backward, so it keeps the product. A checkpointed layer's first forward keeps nothing.
  SwigluThenOptions swiglu;
  swiglu.training = training_;
  swiglu.value_unused = value_unused;
  // gate and up are this layer's own: their gradients may take their memory.
  swiglu.overwrite_inputs = true;
  // A model that checkpoints layers saves memory first: its plain layers' backward (the top
  // one's is the peak) recomputes SwiGLU's output before the input gradient exists.
  swiglu.lean_backward = checkpointed_layers_ > 0;
  swiglu.widened_rows = h.is_cuda();
  // h + down's gradient comes from the next layer's input norm alone (its grad_spare_columns).
  swiglu.owns_output_gradient_spare_columns = true;
  // h + down, the residual add inside the down projection's GEMMs, with and without grad (a
  // checkpointed layer's first forward gives the same bits as a plain layer's).
  return SwigluThenForward(layer.down_proj, std::exchange(gate_up[0], {}),
                           std::exchange(gate_up[1], {}), swiglu, h);
}

at::Tensor LlamaForCausalLM::TiledMlpForward(const DecoderLayer& layer, const at::Tensor& residual,
                                             at::Tensor o, bool value_unused,
                                             const LayerOffloading& offloading) const {
  at::Tensor h = residual + o;
  o.reset();
  PrefetchOnGradient(h, offloading.offloader, offloading.prefetch_after_mlp);
  const at::Tensor rows = h.view({1, -1, h.size(-1)});  // every row of the micro-batch
  const std::vector<at::Tensor> tiles = rows.split(mlp_tile_rows_, 1);
  if (!at::GradMode::is_enabled()) {
    // The first forward: a tile's tensors live while it runs, its output goes into place.
    at::Tensor out = at::empty_like(rows);
    int64_t start = 0;
    for (const at::Tensor& tile : tiles) {
      const int64_t n = tile.size(1);
      out.narrow(1, start, n).copy_(MlpForward(layer, tile, at::Tensor(), false, LayerOffloading{}));
      start += n;
    }
    return out.view(h.sizes());
  }
  // The recomputation: a checkpoint per tile, whose backward recomputes that tile alone. Its
  // forward's value is unused (the layer's is), so it computes nothing (an output with no
  // storage of its own carries the node) unless LoRA dropout draws masks there: each tile's
  // backward replays the random stream from where its forward found it, which is where the
  // first forward's tile found it only if the tiles before it drew theirs again. The tile's
  // layer keeps its (gathered) weights until the tile's backward, as an untiled graph does.
  const auto whole = std::make_shared<const DecoderLayer>(layer);
  std::vector<at::Tensor> params;
  bool draws = false;
  for (const LinearLayer* l : {&layer.gate_proj, &layer.up_proj, &layer.down_proj}) {
    if (!l->lora.has_value()) continue;
    draws = draws || (training_ && l->lora->dropout > 0);
    params.push_back(l->lora->a);
    params.push_back(l->lora->b);
  }
  const bool skip_forward = value_unused && !draws;
  std::vector<at::Tensor> outputs;
  outputs.reserve(tiles.size());
  for (const at::Tensor& tile : tiles) {
    outputs.push_back(Checkpoint(
        [this, whole, skip_forward](const at::Tensor& t, bool recompute) {
          if (skip_forward && !recompute) return at::empty_strided(t.sizes(), {0, 0, 0}, t.options());
          return MlpForward(*whole, t, at::Tensor(), recompute, LayerOffloading{});
        },
        tile, params));
  }
  // The joined value is unused too: only the graph joins, no [rows, hidden] buffer.
  return CatGraphOnly(outputs, 1).view(h.sizes());
}

at::Tensor LlamaForCausalLM::Forward(const at::Tensor& input_ids,
                                     const ForwardOptions& options) const {
  TORCH_CHECK(input_ids.dim() == 2, "input_ids must be [batch, seq], got ", input_ids.sizes());
  const int64_t seq = input_ids.size(1);
  const at::Tensor ids = input_ids.to(device_, at::kLong);

  // cos/sin [batch or 1, 1, seq, head_dim].
  at::Tensor cos, sin;
  if (options.position_ids.defined()) {
    TORCH_CHECK(options.position_ids.sizes() == input_ids.sizes(),
                "position_ids must have input_ids' shape");
    std::tie(cos, sin) = RotaryTables(options.position_ids.to(device_, at::kLong));
  } else {
    TORCH_CHECK(!options.block_diagonal, "block_diagonal attention needs position_ids");
    std::tie(cos, sin) = DefaultRotaryTables(seq);
  }

  // The dequantized layers' adapter columns and rows for this step's passes (noted in the adapters'
  // scope: the passes and the next micro-batches find them written), a launch for every
  // kDequantizedLayersALaunch layers, each batch once the layer before it is queued, so that assembling
  // the blocks on the host (tens of tensor views a layer) overlaps the GPU's work on the layers
  // queued before (all of them at once outlasted the first layer's forward under the profiler,
  // leaving the GPU idle). The first layer's passes write their own, as its forward starts the
  // step, where the GPU waits for the host.
  constexpr int64_t kDequantizedLayersALaunch = 4;
  const int64_t held = training_ && at::GradMode::is_enabled() ? dequantized_layers_ : 0;
  auto write_dequantized = [&](int64_t first, int64_t count) {
    std::vector<const DecoderLayer*> batch;
    for (int64_t i = first; i < std::min(held, first + count); ++i) batch.push_back(&layers[i]);
    if (!batch.empty()) WriteDequantizedAdapters(batch, training_, /*widened_down=*/device_.is_cuda());
  };

  // Each layer's attention: packed rows share one document layout; unpacked rows use plain
  // causal SDPA, with a dense mask only for sliding layers shorter than the row.
  LayerAttention full_attention, window_attention;
  if (options.block_diagonal) {
    full_attention.documents = window_attention.documents =
        DocumentLayout::FromPositions(options.position_ids, device_);
    window_attention.window = config_.sliding_window;
  } else if (config_.sliding_window > 0 && seq > config_.sliding_window) {
    window_attention.mask = at::ones({seq, seq}, at::dtype(at::kBool).device(device_))
                                .tril()
                                .triu(-(config_.sliding_window - 1))  // key > query - window
                                .view({1, 1, seq, seq});
  }

  at::Tensor x = EmbedTokens(ids, options.host_input_ids);
  const bool checkpoint = training_ && at::GradMode::is_enabled();
  const std::shared_ptr<ActivationOffloader> offloader =
      checkpoint ? offloader_ : nullptr;  // null unless SetOffloadedLayers(n > 0)
  // With a base weight store, each layer's weights are made whole as it runs, the next one's
  // prefetched: in forward the layer above; after the top layer, the first one backward
  // recomputes (the top checkpointed layer); in a recomputation, the one below.
  const int64_t count = static_cast<int64_t>(layers.size());
  BaseWeightStore* store = base_weights_.get();
  for (int64_t i = 0; i < count; ++i) {
    const std::shared_ptr<const DecoderLayer> whole = WholeLayer(i);
    if (store != nullptr) {
      const int64_t recomputed_first = checkpoint ? checkpointed_layers_ - 1 : 0;
      store->Prefetch(i + 1 < count ? i + 1 : recomputed_first);
    }
    const DecoderLayer& layer = *whole;
    const LayerAttention& attention = config_.SlidingLayer(i) ? window_attention : full_attention;
    const LayerOffloading offloading = OffloadingOf(i, offloader);
    if (offloader != nullptr && offloaded_[i]) {
      OffloadScope scope(offloader, OffloadLateGroup(i));
      x = LayerForward(layer, x, cos, sin, attention, /*value_unused=*/false, offloading);
    } else if (checkpoint && i < checkpointed_layers_) {
      CheckpointOffload input_offload;  // the input waits in host memory (not the top layer's)
      if (offloader != nullptr && input_offloaded_[i]) input_offload = {offloader, OffloadEarlyGroup(i)};
      // The lambda outlives Forward: it copies the layout (tensor handles). Its first call, at
      // once, uses `whole`; its recomputation asks for the weights again (gathers them again),
      // as the lambda must not keep them alive until backward.
      x = Checkpoint(
          [this, i, cos, sin, attention, offloading,
           in_forward = std::weak_ptr<const DecoderLayer>(whole)](const at::Tensor& h,
                                                                  bool recompute) {
            std::shared_ptr<const DecoderLayer> weights = recompute ? nullptr : in_forward.lock();
            if (weights == nullptr) weights = WholeLayer(i);
            if (recompute && base_weights_ != nullptr) base_weights_->Prefetch(i - 1);
            return LayerForward(*weights, h, cos, sin, attention, /*value_unused=*/recompute,
                                offloading);
          },
          x, LayerParameters(layer), input_offload);
    } else {
      x = LayerForward(layer, x, cos, sin, attention, /*value_unused=*/false, offloading);
    }
    if (i % kDequantizedLayersALaunch == 0) write_dequantized(i + 1, kDequantizedLayersALaunch);
    if (offloader != nullptr && !prefetch_at_[i].empty() && x.requires_grad()) {
      // Runs when x's gradient is ready: before this layer's backward. The late groups come
      // later (LayerForward's hook).
      x.register_hook([offloader, layers = prefetch_at_[i]](const at::TensorBase&) {
        for (int64_t layer : layers) offloader->Prefetch(OffloadEarlyGroup(layer));
      });
    }
  }
  return RmsNorm(x, norm, config_.rms_norm_eps);
}

at::Tensor LlamaForCausalLM::Logits(const at::Tensor& hidden) const {
  return at::linear(hidden.to(compute_dtype_), lm_head);
}

CausalLmLoss LlamaForCausalLM::Loss(const at::Tensor& hidden, const at::Tensor& labels,
                                   const LossOptions& options) const {
  return ComputeCausalLmLoss(hidden, lm_head, labels, options);
}

std::vector<std::pair<std::string, at::Tensor>> LlamaForCausalLM::TrainableParameters() const {
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (size_t i = 0; i < layers.size(); ++i) {
    for (const char* module : kLinearModuleNames) {
      const LinearLayer& linear = layers[i].Linear(module);
      if (!linear.lora) continue;
      const std::string prefix =
          absl::StrCat("base_model.model.model.layers.", i, ".", ModulePath(module));
      params.emplace_back(absl::StrCat(prefix, ".lora_A.weight"), linear.lora->a);
      params.emplace_back(absl::StrCat(prefix, ".lora_B.weight"), linear.lora->b);
    }
  }
  return params;
}

}  // namespace qlora::engine
