// The job file's key table and the unknown-key suggestions built from it.
#include "common/config/job_config_schema.h"

#include <algorithm>
#include <cctype>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace qlora::config_internal {
namespace {

SchemaNode Leaf(std::string key) { return SchemaNode{std::move(key), {}, {}}; }

SchemaNode Map(std::string key, std::vector<SchemaNode> children) {
  return SchemaNode{std::move(key), std::move(children), {}};
}

SchemaNode Refused(std::string key, std::string because) {
  return SchemaNode{std::move(key), {}, std::move(because)};
}

SchemaNode BuildSchema() {
  const std::vector<SchemaNode> feature = {Leaf("name"), Leaf("type")};
  return Map("", {
      Leaf("name"),
      Leaf("model_type"),
      Leaf("base_model"),
      Leaf("base_model_path"),  // written by EmitResolvedJobYaml: the resolved local folder
      Leaf("dataset"),
      Leaf("validation_dataset"),
      Leaf("output_dir"),
      Map("input_features", feature),
      Map("output_features", feature),
      Map("adapter",
          {Leaf("type"), Leaf("r"), Leaf("alpha"), Leaf("dropout"), Leaf("target_modules"),
           Leaf("use_rslora"), Leaf("bias_type"),
           Map("postprocessor", {Leaf("merge_adapter_into_base_model"), Leaf("progressbar")}),
           Refused("pretrained_adapter_weights",
                   "starting from existing adapter weights is not supported yet")}),
      Map("quantization",
          {Leaf("bits"), Leaf("bnb_4bit_quant_type"), Leaf("bnb_4bit_use_double_quant"),
           Leaf("bnb_4bit_compute_dtype"), Leaf("blocksize"),
           Refused("llm_int8_threshold", "it only applies to 8-bit quantization, which is not "
                                         "supported; remove it"),
           Refused("llm_int8_has_fp16_weight", "it only applies to 8-bit quantization, which "
                                               "is not supported; remove it")}),
      Map("backend",
          {Leaf("type"),
           Map("trainer",
               {Leaf("use_gpu"), Leaf("num_workers"), Leaf("min_workers"), Leaf("placement_strategy"),
                Map("resources_per_worker", {Leaf("CPU"), Leaf("GPU")}),
                Map("strategy",
                    {Leaf("type"), Leaf("zero_stage_reason"),
                     Map("zero_optimization",
                         {Leaf("stage"), Leaf("reduce_bucket_size"),
                          Leaf("allgather_bucket_size"), Leaf("overlap_comm"),
                          Leaf("contiguous_gradients"),
                          Refused("offload_optimizer",
                                  "CPU/NVMe optimizer offload is not built yet; remove it"),
                          Refused("offload_param",
                                  "parameter offload needs ZeRO stage 3, which is not built "
                                  "yet; remove it")}),
                     Map("fp16", {Leaf("enabled")}),
                     Map("bf16", {Leaf("enabled")})})})}),
      Map("trainer",
          {Leaf("type"), Leaf("batch_size"), Leaf("eval_batch_size"),
           Leaf("gradient_accumulation_steps"), Leaf("learning_rate"), Leaf("epochs"),
           Leaf("train_steps"),
           Map("optimizer", {Leaf("type"), Leaf("weight_decay"), Leaf("betas"), Leaf("eps")}),
           Map("learning_rate_scheduler", {Leaf("decay"), Leaf("warmup_fraction")}),
           Map("gradient_clipping", {Leaf("clipglobalnorm")}),
           Leaf("enable_gradient_checkpointing"), Leaf("max_memory_gib"),
           Leaf("offload_activation_layers"), Leaf("dequantized_weight_layers"),
           Leaf("steps_per_checkpoint"), Leaf("checkpoint_every_minutes"),
           Leaf("eval_steps"), Leaf("seed"), Leaf("max_restarts"), Leaf("keep_checkpoints"),
           Refused("use_mixed_precision",
                   "DeepSpeed's AMP does not work with ZeRO; the compute dtype is "
                   "quantization.bnb_4bit_compute_dtype")}),
      Map("data",
          {Leaf("format"), Leaf("prompt_template"), Leaf("max_sequence_length"),
           Leaf("packing"), Leaf("malformed_records"), Leaf("validation_fraction"),
           Leaf("test_fraction")}),
      // Ludwig's LLM sections (ludwig_sections.h maps them onto data.* and generation).
      Map("prompt",
          {Leaf("template"),
           Refused("task", "write the task into prompt.template instead"),
           Refused("retrieval", "retrieval-augmented prompts are not supported")}),
      Map("preprocessing",
          {Map("split", {Leaf("type"), Leaf("probabilities")}),
           Leaf("global_max_sequence_length")}),
      Map("generation",
          {Leaf("temperature"), Leaf("top_p"), Leaf("repetition_penalty"),
           Leaf("max_new_tokens"), Leaf("min_new_tokens"), Leaf("top_k"), Leaf("num_beams"),
           Leaf("do_sample")}),
  });
}

std::string Lower(const std::string& s) {
  std::string out = s;
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Every path (a.b.c) in the schema whose last key is exactly `key`.
std::vector<std::string> PathsEndingIn(const SchemaNode& root, const std::string& key) {
  std::vector<std::string> found;
  std::function<void(const SchemaNode&, const std::string&)> walk =
      [&](const SchemaNode& node, const std::string& prefix) {
        for (const SchemaNode& child : node.children) {
          const std::string path = prefix.empty() ? child.key : absl::StrCat(prefix, ".", child.key);
          if (child.key == key) found.push_back(path);
          walk(child, path);
        }
      };
  walk(root, "");
  return found;
}

}  // namespace

const SchemaNode* SchemaNode::Child(const std::string& name) const {
  for (const SchemaNode& child : children) {
    if (child.key == name) return &child;
  }
  return nullptr;
}

const SchemaNode& JobFileSchema() {
  static const SchemaNode* const kSchema = new SchemaNode(BuildSchema());
  return *kSchema;
}

int LevenshteinDistance(const std::string& a, const std::string& b) {
  std::vector<int> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = static_cast<int>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    int diagonal = row[0];
    row[0] = static_cast<int>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      const int above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string UnknownKeyProblem(const SchemaNode& node, const std::string& path,
                              const std::string& key) {
  const std::string where = path.empty() ? "the top level" : path;
  const SchemaNode* closest = nullptr;
  int best = 0;
  for (const SchemaNode& child : node.children) {
    const int d = LevenshteinDistance(Lower(key), child.key);
    if (closest == nullptr || d < best) {
      closest = &child;
      best = d;
    }
  }
  // Close enough to be a typo: at most 2 edits, or a third of the name for long names.
  const int tolerance = std::max<int>(2, static_cast<int>(key.size()) / 3);
  if (closest != nullptr && best <= tolerance) {
    return absl::StrCat("unknown field; did you mean '", closest->key, "'?");
  }
  const std::vector<std::string> elsewhere = PathsEndingIn(JobFileSchema(), key);
  if (elsewhere.size() == 1) {
    return absl::StrCat("unknown field in ", where, "; did you mean '", elsewhere[0], "'?");
  }
  std::vector<std::string> names;
  for (const SchemaNode& child : node.children) names.push_back(child.key);
  if (closest == nullptr) return "unknown field";
  return absl::StrCat("unknown field (closest valid name: '", closest->key, "'); the fields of ",
                      where, " are: ", absl::StrJoin(names, ", "));
}

}  // namespace qlora::config_internal
