// config.json <-> LlamaConfig.
#include "common/model/llama_config.h"


#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "common/posix_files.h"
#include "common/model/model_family.h"

namespace qlora::engine {
namespace {

using Json = nlohmann::json;

absl::Status Bad(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: \"", field, "\" ", why));
}

// Reads an optional positive integer field into *out.
absl::Status ReadPositive(const Json& json, const char* field, int64_t* out) {
  if (!json.contains(field) || json[field].is_null()) return absl::OkStatus();
  if (!json[field].is_number_integer() || json[field].get<int64_t>() <= 0) {
    return Bad(field, "must be a positive integer");
  }
  *out = json[field].get<int64_t>();
  return absl::OkStatus();
}

absl::Status ReadTokenId(const Json& json, const char* field, int64_t* out) {
  if (!json.contains(field) || json[field].is_null()) return absl::OkStatus();
  if (!json[field].is_number_integer() || json[field].get<int64_t>() < 0) {
    return Bad(field, "must be a non-negative integer");
  }
  *out = json[field].get<int64_t>();
  return absl::OkStatus();
}

absl::Status ReadNumber(const Json& json, const char* field, double* out) {
  if (!json.contains(field) || json[field].is_null()) return absl::OkStatus();
  if (!json[field].is_number()) return Bad(field, "must be a number");
  *out = json[field].get<double>();
  return absl::OkStatus();
}

absl::Status ReadBool(const Json& json, const char* field, bool* out) {
  if (!json.contains(field) || json[field].is_null()) return absl::OkStatus();
  if (!json[field].is_boolean()) return Bad(field, "must be true or false");
  *out = json[field].get<bool>();
  return absl::OkStatus();
}

// One rope dictionary: `rope_scaling` (theta outside) or `rope_parameters` (theta inside).
absl::Status ParseRope(const Json& rope, const char* field, RopeConfig* out) {
  if (!rope.is_object()) return Bad(field, "must be an object or null");
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    if (rope.contains(key) && rope[key].is_string()) {
      type = rope[key].get<std::string>();
      break;
    }
  }
  QLORA_RETURN_IF_ERROR(ReadNumber(rope, "rope_theta", &out->theta));
  if (type == "default") {
    out->type = RopeType::kDefault;
    return absl::OkStatus();
  }
  if (type != "linear" && type != "llama3") {
    return absl::UnimplementedError(
        absl::StrCat("config.json: rope type \"", type, "\" is not supported (default, linear, llama3)"));
  }
  out->type = type == "linear" ? RopeType::kLinear : RopeType::kLlama3;
  if (!rope.contains("factor")) return Bad(field, absl::StrCat("needs \"factor\" for ", type));
  QLORA_RETURN_IF_ERROR(ReadNumber(rope, "factor", &out->factor));
  if (out->factor <= 0) return Bad(field, "factor must be positive");
  if (out->type == RopeType::kLlama3) {
    QLORA_RETURN_IF_ERROR(ReadNumber(rope, "low_freq_factor", &out->low_freq_factor));
    QLORA_RETURN_IF_ERROR(ReadNumber(rope, "high_freq_factor", &out->high_freq_factor));
    QLORA_RETURN_IF_ERROR(ReadPositive(rope, "original_max_position_embeddings",
                                       &out->original_max_position_embeddings));
    if (out->high_freq_factor <= out->low_freq_factor) {
      return Bad(field, "high_freq_factor must exceed low_freq_factor");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<BnbQuantizationConfig> ParseBnb(const Json& q) {
  BnbQuantizationConfig bnb;
  const std::string method = q.value("quant_method", "");
  if (method != "bitsandbytes") {
    return absl::UnimplementedError(
        absl::StrCat("config.json: quantization method \"", method, "\" is not supported"));
  }
  if (!q.value("load_in_4bit", false)) {
    return absl::UnimplementedError("config.json: only 4-bit bitsandbytes checkpoints are supported");
  }
  bnb.quant_type = q.value("bnb_4bit_quant_type", "fp4");
  if (bnb.quant_type != "nf4" && bnb.quant_type != "fp4") {
    return Bad("bnb_4bit_quant_type", "must be nf4 or fp4");
  }
  bnb.double_quant = q.value("bnb_4bit_use_double_quant", false);
  if (q.contains("bnb_4bit_compute_dtype") && q["bnb_4bit_compute_dtype"].is_string()) {
    bnb.compute_dtype = q["bnb_4bit_compute_dtype"].get<std::string>();
  }
  if (q.contains("bnb_4bit_quant_storage") && q["bnb_4bit_quant_storage"] != "uint8") {
    return absl::UnimplementedError("config.json: only bnb_4bit_quant_storage uint8 is supported");
  }
  return bnb;
}

}  // namespace

absl::StatusOr<LlamaConfig> ParseLlamaConfig(absl::string_view text) {
  const Json json = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError("config.json is not a JSON object");
  }
  if (json.contains("model_type") && !json["model_type"].is_string()) {
    return Bad("model_type", "must be a string");
  }
  const std::string model_type = json.value("model_type", "llama");
  const ModelFamily* family = FindModelFamily(model_type);
  if (family == nullptr) {
    return absl::UnimplementedError(absl::StrCat("config.json: model_type \"", model_type,
                                                 "\" is not supported (supported: ",
                                                 SupportedModelTypes(), ")"));
  }
  if (json.value("hidden_act", "silu") != "silu") {
    return absl::UnimplementedError("config.json: only hidden_act \"silu\" is supported");
  }

  LlamaConfig c;
  c.model_type = model_type;
  QLORA_RETURN_IF_ERROR(ReadPositive(json, "vocab_size", &c.vocab_size));
  QLORA_RETURN_IF_ERROR(ReadPositive(json, "hidden_size", &c.hidden_size));
  QLORA_RETURN_IF_ERROR(ReadPositive(json, "intermediate_size", &c.intermediate_size));
  QLORA_RETURN_IF_ERROR(ReadPositive(json, "num_hidden_layers", &c.num_hidden_layers));
  QLORA_RETURN_IF_ERROR(ReadPositive(json, "num_attention_heads", &c.num_attention_heads));
  c.num_key_value_heads = c.num_attention_heads;
  QLORA_RETURN_IF_ERROR(ReadPositive(json, "num_key_value_heads", &c.num_key_value_heads));
  c.head_dim = c.hidden_size / c.num_attention_heads;
  QLORA_RETURN_IF_ERROR(ReadPositive(json, "head_dim", &c.head_dim));
  QLORA_RETURN_IF_ERROR(ReadPositive(json, "max_position_embeddings", &c.max_position_embeddings));
  QLORA_RETURN_IF_ERROR(ReadNumber(json, "rms_norm_eps", &c.rms_norm_eps));
  QLORA_RETURN_IF_ERROR(ReadBool(json, "tie_word_embeddings", &c.tie_word_embeddings));
  QLORA_RETURN_IF_ERROR(ReadTokenId(json, "bos_token_id", &c.bos_token_id));
  if (json.contains("eos_token_id") && json["eos_token_id"].is_array() &&
      !json["eos_token_id"].empty() && json["eos_token_id"][0].is_number_integer()) {
    c.eos_token_id = json["eos_token_id"][0].get<int64_t>();
  } else {
    QLORA_RETURN_IF_ERROR(ReadTokenId(json, "eos_token_id", &c.eos_token_id));
  }
  for (const char* key : {"dtype", "torch_dtype"}) {
    if (json.contains(key) && json[key].is_string()) {
      c.torch_dtype = json[key].get<std::string>();
      break;
    }
  }

  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return Bad("num_key_value_heads", "must divide num_attention_heads");
  }
  if (c.head_dim % 2 != 0) return Bad("head_dim", "must be even for rotary embeddings");

  QLORA_RETURN_IF_ERROR(ReadNumber(json, "rope_theta", &c.rope.theta));
  if (json.contains("rope_parameters") && !json["rope_parameters"].is_null()) {
    QLORA_RETURN_IF_ERROR(ParseRope(json["rope_parameters"], "rope_parameters", &c.rope));
  } else if (json.contains("rope_scaling") && !json["rope_scaling"].is_null()) {
    QLORA_RETURN_IF_ERROR(ParseRope(json["rope_scaling"], "rope_scaling", &c.rope));
  }
  if (c.rope.theta <= 0) return Bad("rope_theta", "must be positive");
  QLORA_RETURN_IF_ERROR(family->parse_fields(json, &c));

  if (json.contains("quantization_config") && !json["quantization_config"].is_null()) {
    QLORA_ASSIGN_OR_RETURN(c.bnb, ParseBnb(json["quantization_config"]));
  }
  return c;
}

absl::StatusOr<LlamaConfig> LoadLlamaConfig(const std::string& dir) {
  QLORA_ASSIGN_OR_RETURN(std::string text, ReadFile(JoinPath(dir, "config.json")));
  return ParseLlamaConfig(text);
}

std::string LlamaConfigToJson(const LlamaConfig& c, RopeJsonForm form) {
  const ModelFamily* family = FindModelFamily(c.model_type);
  if (family == nullptr) family = FindModelFamily("llama");
  Json json = {
      {"architectures", {family->architecture}},
      {"model_type", family->model_type},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"head_dim", c.head_dim},
      {"max_position_embeddings", c.max_position_embeddings},
      {"rms_norm_eps", c.rms_norm_eps},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"hidden_act", "silu"},
      {"bos_token_id", c.bos_token_id},
      {"eos_token_id", c.eos_token_id},
      {"torch_dtype", c.torch_dtype},
  };
  Json rope = Json::object();
  switch (c.rope.type) {
    case RopeType::kDefault:
      rope["rope_type"] = "default";
      break;
    case RopeType::kLinear:
      rope = {{"rope_type", "linear"}, {"factor", c.rope.factor}};
      break;
    case RopeType::kLlama3:
      rope = {{"rope_type", "llama3"},
              {"factor", c.rope.factor},
              {"low_freq_factor", c.rope.low_freq_factor},
              {"high_freq_factor", c.rope.high_freq_factor},
              {"original_max_position_embeddings", c.rope.original_max_position_embeddings}};
      break;
  }
  if (form == RopeJsonForm::kRopeParameters) {
    rope["rope_theta"] = c.rope.theta;
    json["rope_parameters"] = rope;
  } else {
    json["rope_theta"] = c.rope.theta;
    json["rope_scaling"] = c.rope.type == RopeType::kDefault ? Json(nullptr) : rope;
  }
  family->write_fields(c, &json);
  return json.dump(2);
}

}  // namespace qlora::engine
