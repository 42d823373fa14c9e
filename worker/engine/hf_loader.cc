// Streaming HF checkpoint loader (dense, quantize-on-load, or bitsandbytes pre-quantized).
#include "worker/engine/hf_loader.h"

#include <malloc.h>

#include <set>
#include <vector>

#include <ATen/ATen.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/safetensors/checkpoint_files.h"
#include "common/status_macros.h"
#include "kernels/float8.h"
#include "nlohmann/json.hpp"
#include "worker/engine/tensor_io.h"

namespace qlora::engine {
namespace {

using safetensors::CheckpointFiles;
using safetensors::TensorView;

class Loader {
 public:
  Loader(CheckpointFiles files, const LoadOptions& options, LlamaForCausalLM* model)
      : files_(std::move(files)), options_(options), model_(model) {}

  absl::Status LoadAll() {
    const LlamaConfig& c = model_->config();
    if (options_.input_embedding_in_host_memory && options_.device.is_cuda() &&
        !c.tie_word_embeddings) {
      QLORA_ASSIGN_OR_RETURN(const at::Tensor table,
                             Read("model.embed_tokens.weight", {c.vocab_size, c.hidden_size},
                                  options_.compute_dtype, at::Device(at::kCPU)));
      model_->embed_tokens = table.pin_memory();
    } else {
      QLORA_ASSIGN_OR_RETURN(model_->embed_tokens,
                             Dense("model.embed_tokens.weight", {c.vocab_size, c.hidden_size}));
    }
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      DecoderLayer& layer = model_->layers[i];
      const std::string prefix = absl::StrCat("model.layers.", i, ".");
      QLORA_ASSIGN_OR_RETURN(layer.input_layernorm,
                             Dense(prefix + "input_layernorm.weight", {c.hidden_size}));
      QLORA_ASSIGN_OR_RETURN(layer.post_attention_layernorm,
                             Dense(prefix + "post_attention_layernorm.weight", {c.hidden_size}));
      for (const char* name : kLinearModuleNames) {
        const LlamaConfig::Features f = c.ProjectionFeatures(name);
        FrozenWeight& base = layer.Linear(name).base;
        QLORA_ASSIGN_OR_RETURN(base, Frozen(prefix + ModulePath(name), f.out, f.in));
        if (c.ProjectionHasBias(name)) {
          QLORA_ASSIGN_OR_RETURN(base.bias, Dense(prefix + ModulePath(name) + ".bias", {f.out}));
        }
      }
      if (options_.base_weights != nullptr) options_.base_weights->Take(i, layer);
    }
    if (options_.base_weights != nullptr) model_->UseBaseWeightStore(options_.base_weights);
    QLORA_ASSIGN_OR_RETURN(model_->norm, Dense("model.norm.weight", {c.hidden_size}));
    if (c.tie_word_embeddings) {
      model_->lm_head = model_->embed_tokens;
      consumed_.insert("lm_head.weight");  // some tied checkpoints still carry a copy
    } else {
      QLORA_ASSIGN_OR_RETURN(model_->lm_head,
                             Dense("lm_head.weight", {c.vocab_size, c.hidden_size}));
    }
    return CheckNothingLeft();
  }

 private:
  absl::StatusOr<TensorView> View(const std::string& name, const std::vector<int64_t>& shape) {
    if (!files_.Contains(name)) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint lacks tensor \"", name, "\""));
    }
    QLORA_ASSIGN_OR_RETURN(TensorView view, files_.Get(name));
    if (!shape.empty() && view.shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", name, "\" has shape [", absl::StrJoin(view.shape, ", "),
          "] but the config needs [", absl::StrJoin(shape, ", "), "]"));
    }
    consumed_.insert(name);
    return view;
  }

  // A tensor converted to `dtype` on the target device (or `device`); its file pages are
  // released.
  absl::StatusOr<at::Tensor> Read(const std::string& name, const std::vector<int64_t>& shape,
                                  std::optional<at::ScalarType> dtype,
                                  std::optional<at::Device> device = std::nullopt) {
    QLORA_ASSIGN_OR_RETURN(TensorView view, View(name, shape));
    QLORA_ASSIGN_OR_RETURN(at::ScalarType stored, ToScalarType(view.dtype));
    absl::StatusOr<at::Tensor> tensor =
        CopyToTensor(view, dtype.value_or(stored), device.value_or(options_.device));
    files_.Evict(name, view);
    return tensor;
  }

  absl::StatusOr<at::Tensor> Dense(const std::string& name, const std::vector<int64_t>& shape) {
    return Read(name, shape, options_.compute_dtype);
  }

  absl::StatusOr<FrozenWeight> Frozen(const std::string& module, int64_t out, int64_t in) {
    FrozenWeight w;
    w.out_features = out;
    w.in_features = in;
    w.float8_forward = options_.float8_base_forward;  // 4-bit ones only (RunsFloat8)
    if (model_->config().bnb) {
      QLORA_ASSIGN_OR_RETURN(w.quantized, PreQuantized(module, out, in));
      return w;
    }
    QLORA_ASSIGN_OR_RETURN(at::Tensor dense, Dense(module + ".weight", {out, in}));
    if (!options_.quantize) {
      w.dense = std::move(dense);
      return w;
    }
    kernels::Quantize4bitOptions q;
    q.type = options_.quant_type;
    q.blocksize = options_.blocksize;
    q.double_quant = options_.double_quant;
    w.quantized = QuantizeWeight(dense, q);  // `dense` is dropped on return
    return w;
  }

  // The six bitsandbytes keys of one Linear (Params4bit / QuantState.as_dict(packed=True)).
  absl::StatusOr<kernels::Quantized4bit> PreQuantized(const std::string& module, int64_t out,
                                                      int64_t in) {
    const std::string w = module + ".weight";
    const BnbQuantizationConfig& bnb = *model_->config().bnb;
    const std::string state_key = absl::StrCat(w, ".quant_state.bitsandbytes__", bnb.quant_type);
    // Read by the host (JSON text), so kept in host memory whatever the target device.
    QLORA_ASSIGN_OR_RETURN(at::Tensor state_bytes,
                           Read(state_key, {}, std::nullopt, at::Device(at::kCPU)));
    const std::string text(static_cast<const char*>(state_bytes.data_ptr()), state_bytes.numel());
    const auto state = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (state.is_discarded() || !state.is_object() || !state.contains("shape") ||
        !state.contains("blocksize")) {
      return absl::InvalidArgumentError(absl::StrCat(state_key, ": malformed quant state"));
    }
    kernels::Quantized4bit q;
    q.type = bnb.quant_type == "nf4" ? kernels::QuantType::kNF4 : kernels::QuantType::kFP4;
    q.blocksize = state["blocksize"].get<int64_t>();
    q.shape = state["shape"].get<std::vector<int64_t>>();
    if (q.shape != std::vector<int64_t>{out, in}) {
      return absl::InvalidArgumentError(absl::StrCat(state_key, ": shape [",
                                                     absl::StrJoin(q.shape, ", "),
                                                     "] does not match the config"));
    }
    const std::string dtype = state.value("dtype", "bfloat16");
    q.dtype = dtype == "float32" ? at::kFloat : dtype == "float16" ? at::kHalf : at::kBFloat16;
    const int64_t n = out * in;
    const int64_t blocks = (n + q.blocksize - 1) / q.blocksize;
    QLORA_ASSIGN_OR_RETURN(at::Tensor packed, Read(w, {}, std::nullopt));
    if (packed.numel() != (n + 1) / 2 || packed.scalar_type() != at::kByte) {
      return absl::InvalidArgumentError(absl::StrCat(w, ": expected ", (n + 1) / 2, " packed bytes"));
    }
    q.packed = packed.reshape({-1});
    QLORA_ASSIGN_OR_RETURN(q.absmax, Read(w + ".absmax", {blocks}, std::nullopt));
    QLORA_ASSIGN_OR_RETURN(at::Tensor quant_map, Read(w + ".quant_map", {16}, at::kFloat));
    // The kernels carry the one code table; a checkpoint with another table cannot be served.
    if (!at::equal(quant_map.cpu(), BitsandbytesQuantMap(q.type).cpu())) {
      return absl::InvalidArgumentError(
          absl::StrCat(w, ".quant_map is not the bitsandbytes ", bnb.quant_type, " table"));
    }
    q.double_quant = state.contains("nested_offset");
    if (q.double_quant) {
      q.nested_blocksize = state.value("nested_blocksize", int64_t{256});
      q.nested_offset = state["nested_offset"].get<float>();
      QLORA_ASSIGN_OR_RETURN(q.nested_absmax, Read(w + ".nested_absmax", {}, at::kFloat));
      QLORA_ASSIGN_OR_RETURN(q.nested_code, Read(w + ".nested_quant_map", {256}, at::kFloat));
    }
    return q;
  }

  absl::Status CheckNothingLeft() {
    std::vector<std::string> unexpected;
    for (const std::string& name : files_.Names()) {
      if (!consumed_.count(name) && !absl::EndsWith(name, "rotary_emb.inv_freq")) {
        unexpected.push_back(name);
      }
    }
    if (unexpected.empty()) return absl::OkStatus();
    if (unexpected.size() > 5) unexpected.resize(5);
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint has tensors this ", model_->config().model_type,
                     " model does not use: ",
                     absl::StrJoin(unexpected, ", ")));
  }

  CheckpointFiles files_;
  LoadOptions options_;
  LlamaForCausalLM* model_;
  std::set<std::string> consumed_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<LlamaForCausalLM>> LoadLlama(const std::string& dir,
                                                             const LoadOptions& options) {
  QLORA_ASSIGN_OR_RETURN(LlamaConfig config, LoadLlamaConfig(dir));
  QLORA_ASSIGN_OR_RETURN(CheckpointFiles files, CheckpointFiles::Open(dir));
  if (options.float8_base_forward && options.compute_dtype != at::kBFloat16) {
    return absl::InvalidArgumentError(
        "quantization.float8_base_forward needs bnb_4bit_compute_dtype: bfloat16 (the FP8 GEMM "
        "writes bfloat16)");
  }
  if (options.float8_base_forward && !kernels::Float8GemmRunsOn(options.device)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "quantization.float8_base_forward needs a Hopper GPU (compute capability 9.x), whose "
        "cuBLASLt scales FP8 GEMMs by rows; ", options.device.str(), " is not one"));
  }
  try {
    auto model = std::make_unique<LlamaForCausalLM>(std::move(config), options.compute_dtype,
                                                    options.device);
    Loader loader(std::move(files), options, model.get());
    QLORA_RETURN_IF_ERROR(loader.LoadAll());
    return model;
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("loading ", dir, ": ", e.what_without_backtrace()));
  }
}

void UseMmapForLargeHostAllocations() { mallopt(M_MMAP_THRESHOLD, 1 << 20); }

}  // namespace qlora::engine
