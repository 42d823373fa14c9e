// The family table: LLaMA, Mistral, Qwen2 and how each one's config.json fields map.
#include "common/model/model_family.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "common/model/llama_config.h"

namespace qlora::engine {
namespace {

using Json = nlohmann::json;

absl::Status Bad(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: \"", field, "\" ", why));
}

bool Present(const Json& json, const char* field) {
  return json.contains(field) && !json[field].is_null();
}

absl::StatusOr<bool> BoolField(const Json& json, const char* field, bool fallback) {
  if (!Present(json, field)) return fallback;
  if (!json[field].is_boolean()) return Bad(field, "must be true or false");
  return json[field].get<bool>();
}

// sliding_window: a positive integer, or null / absent (0 = no window).
absl::StatusOr<int64_t> WindowField(const Json& json) {
  if (!Present(json, "sliding_window")) return 0;
  const Json& w = json["sliding_window"];
  if (!w.is_number_integer() || w.get<int64_t>() <= 0) {
    return Bad("sliding_window", "must be a positive integer or null");
  }
  return w.get<int64_t>();
}

absl::Status ParseLlama(const Json& json, LlamaConfig* c) {
  absl::StatusOr<bool> mlp_bias = BoolField(json, "mlp_bias", false);
  if (!mlp_bias.ok()) return mlp_bias.status();
  if (*mlp_bias) return absl::UnimplementedError("config.json: mlp_bias is not supported");
  absl::StatusOr<bool> bias = BoolField(json, "attention_bias", false);
  if (!bias.ok()) return bias.status();
  c->qkv_bias = c->o_bias = *bias;
  return absl::OkStatus();
}

void WriteLlama(const LlamaConfig& c, Json* json) {
  (*json)["attention_bias"] = c.qkv_bias;
  (*json)["mlp_bias"] = false;
}

absl::Status ParseMistral(const Json& json, LlamaConfig* c) {
  absl::StatusOr<int64_t> window = WindowField(json);
  if (!window.ok()) return window.status();
  c->sliding_window = *window;
  c->sliding_layers.assign(c->sliding_window > 0 ? c->num_hidden_layers : 0, true);
  return absl::OkStatus();
}

void WriteMistral(const LlamaConfig& c, Json* json) {
  (*json)["sliding_window"] = c.sliding_window > 0 ? Json(c.sliding_window) : Json(nullptr);
}

// transformers' Qwen2Config: the window exists only with use_sliding_window; then layer_types
// (when given) or "every layer from max_window_layers on" says which layers use it.
absl::Status ParseQwen2(const Json& json, LlamaConfig* c) {
  c->qkv_bias = true;
  absl::StatusOr<bool> use_window = BoolField(json, "use_sliding_window", false);
  if (!use_window.ok()) return use_window.status();
  absl::StatusOr<int64_t> window = WindowField(json);
  if (!window.ok()) return window.status();
  c->sliding_window = *use_window ? *window : 0;
  c->max_window_layers = 28;
  if (Present(json, "max_window_layers")) {
    if (!json["max_window_layers"].is_number_integer()) {
      return Bad("max_window_layers", "must be an integer");
    }
    c->max_window_layers = json["max_window_layers"].get<int64_t>();
  }
  std::vector<bool> sliding(c->num_hidden_layers, false);
  if (Present(json, "layer_types")) {
    const Json& types = json["layer_types"];
    if (!types.is_array() || static_cast<int64_t>(types.size()) != c->num_hidden_layers) {
      return Bad("layer_types", "must list one type per hidden layer");
    }
    for (size_t i = 0; i < types.size(); ++i) {
      if (types[i] != "full_attention" && types[i] != "sliding_attention") {
        return Bad("layer_types", "entries must be \"full_attention\" or \"sliding_attention\"");
      }
      sliding[i] = types[i] == "sliding_attention";
    }
  } else {
    for (int64_t i = c->max_window_layers; i < c->num_hidden_layers; ++i) {
      if (i >= 0) sliding[i] = true;
    }
  }
  c->sliding_layers.clear();
  if (c->sliding_window > 0) c->sliding_layers = std::move(sliding);
  return absl::OkStatus();
}

void WriteQwen2(const LlamaConfig& c, Json* json) {
  const bool windowed = c.sliding_window > 0;
  (*json)["use_sliding_window"] = windowed;
  (*json)["sliding_window"] = windowed ? Json(c.sliding_window) : Json(nullptr);
  (*json)["max_window_layers"] = c.max_window_layers;
  Json types = Json::array();
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const bool sliding = windowed && i < static_cast<int64_t>(c.sliding_layers.size()) &&
                         c.sliding_layers[i];
    types.push_back(sliding ? "sliding_attention" : "full_attention");
  }
  (*json)["layer_types"] = types;
}

constexpr ModelFamily kFamilies[] = {
    {"llama", "LlamaForCausalLM", ParseLlama, WriteLlama},
    {"mistral", "MistralForCausalLM", ParseMistral, WriteMistral},
    {"qwen2", "Qwen2ForCausalLM", ParseQwen2, WriteQwen2},
};

}  // namespace

const ModelFamily* FindModelFamily(absl::string_view model_type) {
  for (const ModelFamily& family : kFamilies) {
    if (model_type == family.model_type) return &family;
  }
  return nullptr;
}

std::string SupportedModelTypes() {
  std::vector<std::string> names;
  for (const ModelFamily& family : kFamilies) names.push_back(family.model_type);
  return absl::StrJoin(names, ", ");
}

}  // namespace qlora::engine
