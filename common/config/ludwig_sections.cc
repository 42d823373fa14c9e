// Ludwig's prompt, preprocessing and generation sections (see ludwig_sections.h).
#include "common/config/ludwig_sections.h"

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace qlora::config_internal {
namespace {

// "data.<key> (line N)" for messages; the line when the file has one for it.
std::string DataKeyAt(const MapReader& top, const std::string& key) {
  const int line = top.site()->Line(absl::StrCat("data.", key));
  return line > 0 ? absl::StrCat("data.", key, " (line ", line, ")") : absl::StrCat("data.", key);
}

// An error on `map`.`key` when data.`data_key` was written with another value.
absl::Status Conflict(const MapReader& map, const std::string& key, const MapReader& top,
                      const std::string& data_key, const std::string& ours, const std::string& theirs) {
  return map.Error(key, absl::StrCat("is ", ours, " but ", DataKeyAt(top, data_key), " is ", theirs,
                                     "; give one of them, or the same value in both"));
}

absl::Status ReadPrompt(const MapReader& top, const MapReader& data, DataConfig* d) {
  QLORA_ASSIGN_OR_RETURN(MapReader prompt, top.OpenMap("prompt"));
  if (!prompt.Has("template")) return absl::OkStatus();
  std::string text;
  QLORA_RETURN_IF_ERROR(prompt.ReadString("template", &text));
  if (data.Has("prompt_template") && text != d->prompt_template) {
    return prompt.Error("template", absl::StrCat("differs from ", DataKeyAt(top, "prompt_template"),
                                                 "; give one of them, or the same text in both"));
  }
  d->prompt_template = text;
  return absl::OkStatus();
}

// Ludwig's default for a random split without probabilities: 70% train, 10% validation, 20% test.
constexpr double kLudwigDefaultSplit[3] = {0.7, 0.1, 0.2};

absl::Status ReadProbabilities(const MapReader& split, double out[3]) {
  const YAML::Node node = split.Get("probabilities");
  if (!node.IsDefined() || node.IsNull()) {
    for (int i = 0; i < 3; ++i) out[i] = kLudwigDefaultSplit[i];
    return absl::OkStatus();
  }
  constexpr char kWant[] = "a list of 3 numbers in [0, 1] (train, validation, test) that sum to 1";
  if (!node.IsSequence() || node.size() != 3) {
    return split.Error("probabilities", absl::StrCat("must be ", kWant, ", got ", Describe(node)));
  }
  double sum = 0;
  for (int i = 0; i < 3; ++i) {
    if (!IsPlainScalar(node[i]) || !DecodeNumber(node[i], &out[i]) || !std::isfinite(out[i]) ||
        out[i] < 0 || out[i] > 1) {
      return split.Error("probabilities", absl::StrCat("must be ", kWant, "; item ", i + 1, " is ",
                                                       Describe(node[i])));
    }
    sum += out[i];
  }
  if (std::abs(sum - 1) > 1e-6) {
    return split.Error("probabilities", absl::StrCat("must sum to 1, got ", sum));
  }
  if (out[0] <= 0) return split.Error("probabilities", "the train share (the first) must be > 0");
  return absl::OkStatus();
}

absl::Status ReadSplit(const MapReader& top, const MapReader& data, const MapReader& pre,
                       DataConfig* d, bool* split_written) {
  if (!pre.Has("split")) return absl::OkStatus();
  QLORA_ASSIGN_OR_RETURN(MapReader split, pre.OpenMap("split"));
  std::string type = "random";
  if (split.Has("type")) {
    QLORA_RETURN_IF_ERROR(split.ReadString("type", &type));
    if (type != "random") {
      return split.Error("type", absl::StrCat(
          "'", type, "' is not supported; only 'random' (by a seeded hash of each record's "
          "position, the same on every run and rank). Ludwig's fixed, stratify, datetime and "
          "hash splits need a whole-dataset pass"));
    }
  }
  double p[3];
  QLORA_RETURN_IF_ERROR(ReadProbabilities(split, p));
  const struct {
    const char* key;
    double* field;
    double value;
  } fractions[] = {{"validation_fraction", &d->validation_fraction, p[1]},
                   {"test_fraction", &d->test_fraction, p[2]}};
  for (const auto& f : fractions) {
    if (data.Has(f.key) && *f.field != f.value) {
      return Conflict(split, "probabilities", top, f.key,
                      absl::StrCat("a ", f.key == std::string("test_fraction") ? "test" : "validation",
                                   " share of ", f.value),
                      absl::StrCat(*f.field));
    }
    *f.field = f.value;
  }
  *split_written = true;
  return absl::OkStatus();
}

absl::Status ReadPreprocessing(const MapReader& top, const MapReader& data, DataConfig* d,
                               bool* split_written) {
  QLORA_ASSIGN_OR_RETURN(MapReader pre, top.OpenMap("preprocessing"));
  QLORA_RETURN_IF_ERROR(ReadSplit(top, data, pre, d, split_written));
  if (!pre.Has("global_max_sequence_length")) return absl::OkStatus();
  int length = 0;
  QLORA_RETURN_IF_ERROR(pre.ReadInt("global_max_sequence_length", 8, kMaxSequenceLength, &length));
  if (data.Has("max_sequence_length") && length != d->max_sequence_length) {
    return Conflict(pre, "global_max_sequence_length", top, "max_sequence_length",
                    absl::StrCat(length), absl::StrCat(d->max_sequence_length));
  }
  d->max_sequence_length = length;
  return absl::OkStatus();
}

}  // namespace

absl::Status ReadLudwigDataSections(const MapReader& top, DataConfig* d, bool* split_written) {
  QLORA_ASSIGN_OR_RETURN(MapReader data, top.OpenMap("data"));
  QLORA_RETURN_IF_ERROR(ReadPrompt(top, data, d));
  return ReadPreprocessing(top, data, d, split_written);
}

absl::Status ReadOutput(const MapReader& top, JobConfig* c) {
  QLORA_ASSIGN_OR_RETURN(MapReader output, top.OpenMap("output"));
  if (!output.Has("gguf")) return absl::OkStatus();
  const YAML::Node node = output.Get("gguf");
  std::string value = node.IsScalar() ? node.Scalar() : "";
  if (value == "true" || value == "yes" || value == "on") value = "f16";
  if (value == "false" || value == "no" || value == "off" || value == "null" || value == "~") value = "";
  if (!value.empty() && value != "f16" && value != "bf16" && value != "q8_0" && value != "f32") {
    return output.Error("gguf", absl::StrCat("'", value, "': expected true (f16), false, f16, bf16, "
                                             "q8_0 or f32"));
  }
  c->gguf_type = value;
  if (!value.empty()) c->lora.merge_adapter_into_base_model = true;
  return absl::OkStatus();
}

absl::Status ReadGeneration(const MapReader& top, bool new_file, GenerationConfig* g) {
  QLORA_ASSIGN_OR_RETURN(MapReader gen, top.OpenMap("generation"));
  auto number = [&](const char* key, Bound min, Bound max, std::optional<double>* out) {
    if (!gen.Has(key)) return absl::OkStatus();
    double value = 0;
    QLORA_RETURN_IF_ERROR(gen.ReadNumber(key, min, max, &value));
    *out = value;
    return absl::OkStatus();
  };
  auto integer = [&](const char* key, int64_t min, std::optional<int64_t>* out) {
    if (!gen.Has(key)) return absl::OkStatus();
    int64_t value = 0;
    QLORA_RETURN_IF_ERROR(gen.ReadInt(key, min, int64_t{1} << 31, &value));
    *out = value;
    return absl::OkStatus();
  };
  constexpr double kInf = INFINITY;
  QLORA_RETURN_IF_ERROR(number("temperature", {0, true}, {kInf, false}, &g->temperature));
  QLORA_RETURN_IF_ERROR(number("top_p", {0, false}, {1, true}, &g->top_p));
  QLORA_RETURN_IF_ERROR(number("repetition_penalty", {0, false}, {kInf, false}, &g->repetition_penalty));
  QLORA_RETURN_IF_ERROR(integer("max_new_tokens", 1, &g->max_new_tokens));
  QLORA_RETURN_IF_ERROR(integer("min_new_tokens", 0, &g->min_new_tokens));
  QLORA_RETURN_IF_ERROR(integer("top_k", 0, &g->top_k));
  QLORA_RETURN_IF_ERROR(integer("num_beams", 1, &g->num_beams));
  if (gen.Has("do_sample")) {
    bool value = false;
    QLORA_RETURN_IF_ERROR(gen.ReadBool("do_sample", &value));
    g->do_sample = value;
  }
  if (new_file && g->do_sample.value_or(false) && g->temperature && *g->temperature == 0) {
    return gen.Error("temperature", "is 0 with do_sample: true: sampling needs a temperature above 0 "
                                    "(greedy decoding: do_sample: false)");
  }
  if (g->max_new_tokens && g->min_new_tokens && *g->min_new_tokens > *g->max_new_tokens) {
    return gen.Error("min_new_tokens", absl::StrCat("is more than max_new_tokens (",
                                                    *g->max_new_tokens, ")"));
  }
  return absl::OkStatus();
}

}  // namespace qlora::config_internal
