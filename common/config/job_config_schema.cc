// The job file's key table and the unknown-key suggestions built from it.
#include "common/config/job_config_schema.h"

#include <algorithm>
#include <cctype>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace qlora::config_internal {
namespace {

// The reference text of one key: see SchemaNode.
struct KeyDoc {
  std::string type;
  std::string default_value = {};
  std::string doc = {};
  std::string origin = {};
  std::string default_note = {};
};

SchemaNode Leaf(std::string key, KeyDoc d) {
  SchemaNode node;
  node.key = std::move(key);
  node.type = std::move(d.type);
  node.default_value = std::move(d.default_value);
  node.default_note = std::move(d.default_note);
  node.doc = std::move(d.doc);
  node.origin = std::move(d.origin);
  return node;
}

SchemaNode Map(std::string key, KeyDoc d, std::vector<SchemaNode> children) {
  SchemaNode node = Leaf(std::move(key), std::move(d));
  node.children = std::move(children);
  return node;
}

SchemaNode Refused(std::string key, std::string because, std::string origin) {
  SchemaNode node;
  node.key = std::move(key);
  node.refused_because = std::move(because);
  node.origin = std::move(origin);
  return node;
}

constexpr char kLudwig[] = "Ludwig";
constexpr char kDeepSpeed[] = "DeepSpeed";
constexpr char kPeft[] = "PEFT";
constexpr char kBnb[] = "bitsandbytes";

// Why each stage-3 tuning key has no effect here (also the resolved file's comment on it).
constexpr char kStage3PrefetchWhy[] =
    "accepted; no effect here: the next decoder layer's 4-bit weights are always prefetched, "
    "whatever their size";
constexpr char kStage3PersistenceWhy[] =
    "accepted; no effect here: norms, biases, embeddings and lm_head always stay whole on "
    "every rank, and every layer's 4-bit weights are partitioned";
constexpr char kStage3LiveWhy[] =
    "accepted; no effect here: at most two gathered layers are kept (the one in use and the "
    "next), besides what a layer's backward still reads";
constexpr char kStage3ReuseWhy[] =
    "accepted; no effect here: a layer is released after use and gathered again for its "
    "recomputation";
constexpr char kStage3GatherOnSaveWhy[] =
    "accepted; no effect here: the adapter is always saved whole, and the merged model "
    "(`adapter.postprocessor.merge_adapter_into_base_model`) always holds the whole weights";

SchemaNode BuildSchema() {
  const std::vector<SchemaNode> feature = {
      Leaf("name", {"string", "", "the dataset column"}),
      Leaf("type", {"string", "", "`text` (the only type trained)"})};
  return Map("", {"mapping"}, {
      Leaf("name", {"string", "", "the job's name in listings: at most 128 bytes of UTF-8, no "
                                  "control characters; or `qloractl submit --name`"}),
      Leaf("model_type", {"string", "llm", "`llm` (Ludwig's; the only type)", kLudwig}),
      Leaf("base_model", {"string", "", "a local Hugging Face folder (`config.json`, safetensors, "
                                        "a tokenizer) of a `llama`, `mistral` or `qwen2` model, "
                                        "or a hub name found in the local Hugging Face cache "
                                        "(`$HF_HUB_CACHE`, `$HF_HOME/hub`, "
                                        "`~/.cache/huggingface/hub`); required", kLudwig}),
      Leaf("base_model_path", {"string", "", "written by the service in the resolved file: the "
                                             "local folder `base_model` resolved to"}),
      Leaf("dataset", {"string", "", "the training file(s), comma-separated; or `qloractl submit "
                                     "--dataset`; relative paths are relative to where qloractl "
                                     "runs"}),
      Leaf("validation_dataset", {"string", "", "the validation file(s), comma-separated; or "
                                                "`--validation-dataset`"}),
      Leaf("output_dir", {"string", "", "where the adapter (`adapter/`), checkpoints "
                                        "(`checkpoints/<job id>-<uid>/step-N`), TensorBoard "
                                        "events and metrics go; new or empty; inside "
                                        "`--output-root` when the coordinator has one", "",
                          "`<state-dir>/jobs/<id>/output`"}),
      Map("input_features", {"list of {name, type}", "", "the dataset columns of the prompt",
                             kLudwig, "`[{name: instruction, type: text}]`"}, feature),
      Map("output_features", {"list of {name, type}", "", "the dataset column of the target; "
                              "exactly one text output", kLudwig,
                              "`[{name: output, type: text}]`"}, feature),
      Map("adapter", {"mapping", "", "required: `{type: lora}`", kLudwig},
          {Leaf("type", {"string", "lora", "`lora` (the only adapter)"}),
           Leaf("r", {"integer >= 1", "8", "the LoRA rank"}),
           Leaf("alpha", {"number > 0", "16", "the LoRA scale's numerator (scale = alpha / r, "
                                              "or alpha / sqrt(r) with `use_rslora`)"}),
           Leaf("dropout", {"number in [0, 1)", "0.05", "dropout on the adapters' input"}),
           Leaf("target_modules", {"list of module names, or `all-linear`", "[q_proj, v_proj]",
                                   "the projections that get adapters, by their Hugging Face "
                                   "names (`q_proj` ... `down_proj`); the resolved file lists "
                                   "them", kPeft}),
           Leaf("use_rslora", {"bool", "false", "rank-stabilized LoRA's scale", kPeft}),
           Leaf("bias_type", {"string", "", "`none` (the only choice)", kPeft, "`none`"}),
           Map("postprocessor", {"mapping", "", "what happens after training", kLudwig},
               {Leaf("merge_adapter_into_base_model",
                     {"bool", "false", "also write the base model with the adapter merged in, "
                                       "as a Hugging Face folder for `AutoModelForCausalLM`"}),
                Leaf("progressbar", {"bool", "", "accepted and unused"})}),
           Leaf("pretrained_adapter_weights",
                {"path", "", "a PEFT adapter folder (this service's or peft's) to start from; "
                             "its r, alpha, target modules and use_rslora must be the job's",
                 kLudwig})}),
      Map("quantization", {"mapping, or null for a 16-bit base", "",
                           "how the frozen base weights are stored; `null` keeps them in the "
                           "compute dtype", kBnb},
          {Leaf("bits", {"integer", "4", "4 (NF4 or FP4): the only width"}),
           Leaf("bnb_4bit_quant_type", {"`nf4` or `fp4`", "nf4", "the 4-bit code", kBnb}),
           Leaf("bnb_4bit_use_double_quant", {"bool", "true", "quantize the blocks' scales too "
                                                              "(as bitsandbytes does)", kBnb}),
           Leaf("bnb_4bit_compute_dtype", {"`bfloat16`, `float16` or `float32`", "bfloat16",
                                           "the dtype of the forward and backward", kBnb}),
           Leaf("blocksize", {"power of two in [32, 4096]", "64", "weights per quantization "
                                                                  "block"}),
           Leaf("float8_base_forward",
                {"bool", "false",
                 "run the frozen 4-bit weights' forward GEMMs in FP8 (e4m3, one scale per row) "
                 "on Hopper GPUs; adapters, gradients, norms, attention and the loss stay "
                 "bfloat16. Experimental, opt-in: the loss moves slightly (docs/float8.md)"}),
           Refused("llm_int8_threshold", "it only applies to 8-bit quantization, which is not "
                                         "supported; remove it", kBnb),
           Refused("llm_int8_has_fp16_weight", "it only applies to 8-bit quantization, which "
                                               "is not supported; remove it", kBnb)}),
      Map("backend", {"mapping", "", "where and how the workers run", kLudwig},
          {Leaf("type", {"`local` or `ray`", "local",
                         "`local`: the coordinator's own GPUs or CPU slots; `ray`: its Ray "
                         "cluster (`--ray-address`), refused by a coordinator without one"}),
           Map("trainer", {"mapping", "", "the workers"},
               {Leaf("use_gpu", {"bool", "true", "`false`: CPU workers even where there are "
                                                 "GPUs; on Ray it decides the bundle"}),
                Leaf("num_workers", {"integer >= 0", "", "how many workers (ranks)", "",
                                     "every GPU, or `--cpu-workers`; on Ray every GPU of the "
                                     "cluster"}),
                Leaf("min_workers", {"integer >= 0", "0", "elastic jobs: at a (re)start where "
                                                          "workers are gone for good, go on "
                                                          "with as many as remain, down to this "
                                                          "many (0: never fewer)"}),
                Leaf("placement_strategy", {"`PACK`, `SPREAD`, `STRICT_PACK` or "
                                            "`STRICT_SPREAD`", "PACK",
                                            "Ray only: the placement group's strategy (one "
                                            "bundle per worker)"}),
                Map("resources_per_worker", {"mapping", "", "Ray only: each bundle"},
                    {Leaf("CPU", {"integer in [1, 1024]", "1", "CPUs per bundle (also the "
                                                               "worker's threads)"}),
                     Leaf("GPU", {"0 or 1", "1", "1 with `use_gpu`, else 0"})}),
                Map("strategy", {"mapping, `deepspeed` or `ddp`", "",
                                 "the data-parallel strategy: DeepSpeed's ZeRO stages; `ddp` is "
                                 "stage 0", kDeepSpeed},
                    {Leaf("type", {"`deepspeed` or `ddp`", "deepspeed", "", kDeepSpeed}),
                     Leaf("zero_stage_reason", {"string", "", "written by the service in the "
                                                              "resolved file: why this stage"}),
                     Map("zero_optimization", {"mapping", "", "", kDeepSpeed},
                         {Leaf("stage", {"0, 1, 2, 3 or auto", "auto",
                                         "0 replicates the optimizer; 1 partitions the fp32 "
                                         "master weights and optimizer state; 2 also the "
                                         "gradients; 3 also the frozen 4-bit base weights, "
                                         "each layer gathered in its 4-bit form just before "
                                         "use. auto (or none written): the workers plan the "
                                         "lowest of 2, 3 and 3 with offload_param that fits "
                                         "the memory budget, and say which and why", kDeepSpeed}),
                          Leaf("reduce_bucket_size", {"integer >= 1", "500000000",
                                                      "elements per gradient bucket",
                                                      kDeepSpeed}),
                          Leaf("allgather_bucket_size", {"even integer >= 1", "500000000",
                                                         "accepted for DeepSpeed compatibility; "
                                                         "no effect here", kDeepSpeed}),
                          Leaf("overlap_comm", {"bool", "true", "accepted for DeepSpeed "
                                                                "compatibility; no effect here",
                                                kDeepSpeed}),
                          Leaf("contiguous_gradients", {"bool", "true", "accepted for DeepSpeed "
                                                                        "compatibility; no "
                                                                        "effect here",
                                                        kDeepSpeed}),
                          Map("offload_optimizer",
                              {"mapping", "", "where the AdamW moments wait between steps",
                               kDeepSpeed},
                              {Leaf("device", {"`cpu` or `none`", "none",
                                               "`cpu`: the two AdamW moments (this rank's "
                                               "partition from stage 1 up; 8 bytes a trainable "
                                               "element) live in host memory and are copied to "
                                               "the GPU for each step's update, which runs there "
                                               "as without (the same numbers, unlike DeepSpeed's "
                                               "CPU Adam), and back: less device memory through "
                                               "forward and backward for one copy each way a "
                                               "step. "
                                               "`nvme` is refused",
                                               kDeepSpeed}),
                               Leaf("pin_memory", {"bool", "true",
                                                   "pinned host memory (asynchronous copies; "
                                                   "false makes the host wait for each step's "
                                                   "copy back, and so for all queued before it)",
                                                   kDeepSpeed}),
                               Leaf("buffer_count", {"integer", "", "accepted; no effect "
                                                                    "here: both moments move "
                                                                    "in one copy each way",
                                                     kDeepSpeed}),
                               Leaf("fast_init", {"bool", "", "accepted; no effect here: the "
                                                              "moments start at zero in host "
                                                              "memory",
                                                  kDeepSpeed})}),
                          Map("offload_param", {"mapping", "", "where the frozen base weights "
                                                               "wait between uses",
                                                kDeepSpeed},
                              {Leaf("device", {"`cpu` or `none`", "none",
                                               "`cpu`: each layer's 4-bit weights (this rank's "
                                               "share under stage 3) live in host memory and are "
                                               "copied to the GPU a layer ahead of use, "
                                               "overlapping compute; any stage. `nvme` is refused",
                                               kDeepSpeed}),
                               Leaf("pin_memory", {"bool", "true",
                                                   "pinned host memory (asynchronous copies)",
                                                   kDeepSpeed}),
                               Leaf("buffer_count", {"integer", "", "accepted; no effect here: "
                                                                    "one layer is copied ahead",
                                                     kDeepSpeed}),
                               Leaf("buffer_size", {"integer", "", "accepted; no effect here: "
                                                                   "the copy unit is a layer",
                                                    kDeepSpeed}),
                               Leaf("max_in_cpu", {"integer", "", "accepted; no effect here: "
                                                                  "every layer stays in host "
                                                                  "memory",
                                                   kDeepSpeed})}),
                          Leaf("stage3_prefetch_bucket_size",
                               {"integer or `auto`", "", kStage3PrefetchWhy, kDeepSpeed}),
                          Leaf("stage3_param_persistence_threshold",
                               {"integer or `auto`", "", kStage3PersistenceWhy, kDeepSpeed}),
                          Leaf("stage3_max_live_parameters",
                               {"integer or `auto`", "", kStage3LiveWhy, kDeepSpeed}),
                          Leaf("stage3_max_reuse_distance",
                               {"integer or `auto`", "", kStage3ReuseWhy, kDeepSpeed}),
                          Leaf("stage3_gather_16bit_weights_on_model_save",
                               {"bool or `auto`", "", kStage3GatherOnSaveWhy, kDeepSpeed})}),
                     Map("fp16", {"mapping", "", "must agree with "
                                                 "`quantization.bnb_4bit_compute_dtype`",
                                  kDeepSpeed},
                         {Leaf("enabled", {"bool", "", "", kDeepSpeed})}),
                     Map("bf16", {"mapping", "", "must agree with "
                                                 "`quantization.bnb_4bit_compute_dtype`",
                                  kDeepSpeed},
                         {Leaf("enabled", {"bool", "", "", kDeepSpeed})})})})}),
      Map("trainer", {"mapping", "", "the training loop", kLudwig},
          {Leaf("type", {"`finetune`, `dpo` or `orpo`", "finetune",
                         "supervised fine-tuning, or preference tuning on prompt / chosen / "
                         "rejected pairs as TRL's DPOTrainer and ORPOTrainer do it "
                         "(docs/preference.md)", kLudwig}),
           // No resolved default: finetune jobs have none of these (a dpo or orpo job's resolved
           // file shows them).
           Leaf("beta", {"number > 0", "", "dpo: the KL weight (the rewards' scale); orpo: "
                                           "lambda, the odds-ratio term's weight", "TRL", "`0.1`"}),
           Leaf("loss_type", {"`sigmoid`, `ipo`, `hinge` or `robust`", "",
                              "dpo only: the preference loss", "TRL", "`sigmoid`"}),
           Leaf("label_smoothing", {"number in [0, 0.5)", "", "dpo with `robust` only: the "
                                    "assumed probability that a pair's labels are flipped",
                                    "TRL", "`0`"}),
           Leaf("batch_size", {"integer >= 1", "1", "rows per micro-batch and rank (pairs for "
                                                    "dpo and orpo)"}),
           Leaf("eval_batch_size", {"integer >= 1", "2", "rows per evaluation batch"}),
           Leaf("gradient_accumulation_steps", {"integer >= 1", "1",
                                                "micro-batches per optimizer step"}),
           Leaf("learning_rate", {"number > 0", "0.0002", "the peak learning rate"}),
           Leaf("epochs", {"integer >= 0", "3", "passes over the training data (>= 1 unless "
                                                "`train_steps` > 0)"}),
           Leaf("train_steps", {"integer >= 0", "0", "stop after this many optimizer steps "
                                                     "(0: `epochs` decides)"}),
           Map("optimizer", {"mapping, or a type name", "", ""},
               {Leaf("type", {"`adamw` or `adam`", "adamw", "paged and 8-bit optimizers are "
                                                            "refused"}),
                Leaf("weight_decay", {"number >= 0", "0", "decoupled weight decay (AdamW)"}),
                Leaf("betas", {"two numbers in [0, 1)", "[0.9, 0.999]", "Adam's betas"}),
                Leaf("eps", {"number in (0, 1]", "1e-08", "Adam's epsilon"})}),
           Map("learning_rate_scheduler", {"mapping", "", ""},
               {Leaf("decay", {"`cosine`, `linear` or `none`", "cosine",
                               "the decay after warm-up"}),
                Leaf("warmup_fraction", {"number in [0, 1]", "0.03",
                                         "the share of steps spent warming up"})}),
           Map("gradient_clipping", {"mapping", "", ""},
               {Leaf("clipglobalnorm", {"number >= 0", "0.3", "the gradients' global norm "
                                                              "bound (0: off)"})}),
           Leaf("enable_gradient_checkpointing",
                {"`true`, `false` or `auto`", "true",
                 "`true` recomputes every decoder layer in backward (least memory), `false` "
                 "none (fastest), `auto` only as many as fit `max_memory_gib` "
                 "(docs/memory.md)"}),
           Leaf("max_memory_gib", {"number > 0", "", "the GPU memory budget that `auto` plans "
                                                     "for (with checkpointing `true`: long rows' "
                                                     "MLP tiles and `offload_activation_layers: "
                                                     "auto`); not with checkpointing `false` "
                                                     "unless another key is `auto`", "",
                                   "what the GPU has free once the model is loaded"}),
           Leaf("offload_activation_layers", {"integer >= 0 or `auto`", "",
                                              "decoder layers whose saved activations wait in "
                                              "pinned host memory instead of the GPU "
                                              "(docs/memory.md)", "", "`0`"}),
           Leaf("max_host_memory_gib", {"number > 0", "", "the host memory that "
                                                          "`offload_activation_layers: auto` may "
                                                          "pin per rank; only with that `auto`",
                                        "", "half the host's available memory, shared by the "
                                            "ranks"}),
           Leaf("dequantized_weight_layers", {"integer >= 0 or `auto`", "",
                                              "the first N decoder layers hold their weights "
                                              "dequantized for the whole job: faster steps for "
                                              "GPU memory (docs/memory.md)", "", "`0`"}),
           Leaf("steps_per_checkpoint", {"integer >= 0", "0", "a checkpoint every N optimizer "
                                                              "steps (0: by time only)"}),
           Leaf("checkpoint_every_minutes", {"number >= 0", "10", "a checkpoint at the next "
                                                                  "step once this long has "
                                                                  "passed (0: off)"}),
           Leaf("eval_samples", {"integer in [0, 64]", "0",
                                 "at each evaluation, generate for the first N records of the "
                                 "validation file (else the training file) and show prompt and "
                                 "output in TensorBoard's TEXT tab, metrics.jsonl and the log"}),
           Leaf("eval_prompts", {"list of prompts", "", "generate for these at each evaluation "
                                 "instead (text, or JSON objects with the template's columns)"}),
           Leaf("eval_steps", {"integer >= 0", "0", "evaluate every N steps (0: at each "
                                                    "epoch's end)"}),
           Leaf("seed", {"integer", "42", "shuffling, dropout and initialization"}),
           Leaf("max_restarts", {"integer in [0, 100]", "", "automatic restarts from the last "
                                                            "checkpoint after a failure that "
                                                            "may pass", "",
                                 "the coordinator's `--max-restarts` (2)"}),
           Leaf("keep_checkpoints", {"integer >= 0", "2", "the newest complete checkpoints "
                                                          "kept (0: all)"}),
           Leaf("report_to", {"a name or a list: `tensorboard`, `mlflow`, `none`", "[tensorboard]",
                              "where metrics go: TensorBoard files in `<output_dir>/runs` "
                              "always; `mlflow` also sends params, metrics and the adapter to "
                              "the MLflow server MLFLOW_TRACKING_URI names (docs/metrics.md). "
                              "`wandb` is refused", "HF Trainer"}),
           Leaf("resume_from_checkpoint",
                {"path", "", "a checkpoint folder of this service (`step-N`, with its "
                             "manifest.json) to continue from: adapters, optimizer state, step "
                             "and data position; `qloractl submit --resume-from JOB` sets it to "
                             "JOB's newest", "HF Trainer"}),
           Refused("use_mixed_precision",
                   "DeepSpeed's AMP does not work with ZeRO; the compute dtype is "
                   "quantization.bnb_4bit_compute_dtype", kLudwig)}),
      Map("data", {"mapping", "", "how records become training rows (docs/data-formats.md)"},
          {Leaf("format", {"`auto`, `jsonl`, `csv`, `text`, `parquet` or `arrow`", "auto",
                           "the files' format (`auto`: by extension)"}),
           Leaf("prompt_template", {"string", "", "the prompt with `{column}` placeholders "
                                                  "(`{{`/`}}` for braces), or `llama3_chat`", "",
                                    "`### Instruction:\\n{instruction}\\n\\n### Response:\\n`"}),
           Leaf("max_sequence_length", {"integer in [8, 1048576]", "512", "rows are cut to this "
                                                                         "many tokens"}),
           Leaf("packing", {"bool", "false", "several examples per row, attention kept within "
                                             "each"}),
           Leaf("malformed_records", {"`fail` or `skip`", "fail", "a record that does not "
                                                                  "parse or lacks a column"}),
           Leaf("max_without_target_fraction",
                {"number in [0, 1]", "1", "the share of records left without a target (cut to "
                                          "max_sequence_length before it) above which the job "
                                          "fails; the job warns of them either way"}),
           Leaf("validation_fraction", {"number in [0, 1)", "0", "held out of the training "
                                                                 "file for validation"}),
           Leaf("test_fraction", {"number in [0, 1)", "0", "held out of the training file: "
                                                           "never trained nor validated"})}),
      // Ludwig's LLM sections (ludwig_sections.h maps them onto data.* and generation).
      Map("prompt", {"mapping", "", "", kLudwig},
          {Leaf("template", {"string", "", "= `data.prompt_template`", kLudwig}),
           Refused("task", "write the task into prompt.template instead", kLudwig),
           Refused("retrieval", "retrieval-augmented prompts are not supported", kLudwig)}),
      Map("preprocessing", {"mapping", "", "", kLudwig},
          {Map("split", {"mapping", "", "= `data.validation_fraction` and "
                                        "`data.test_fraction`", kLudwig},
               {Leaf("type", {"`random`", "", "other split types are refused", kLudwig}),
                Leaf("probabilities", {"[train, validation, test], summing to 1", "",
                                       "", kLudwig, "`[0.7, 0.1, 0.2]`"})}),
           Leaf("global_max_sequence_length", {"integer", "", "= `data.max_sequence_length`",
                                               kLudwig})}),
      Map("output", {"mapping", "", "more outputs of a finished job"},
          {Leaf("gguf", {"`true` (f16), `false`, `f16`, `bf16`, `q8_0` or `f32`", "false",
                         "also write the merged model as `<output_dir>/model-<type>.gguf` for "
                         "llama.cpp and Ollama (docs/jobs.md); implies "
                         "`adapter.postprocessor.merge_adapter_into_base_model`"})}),
      Map("generation", {"mapping", "", "the defaults of `qloractl generate` with the trained "
                                        "adapter (docs/generation.md); training does not read it",
                         kLudwig},
          {Leaf("temperature", {"number", "", "", kLudwig}),
           Leaf("top_p", {"number", "", "", kLudwig}),
           Leaf("repetition_penalty", {"number", "", "", kLudwig}),
           Leaf("max_new_tokens", {"integer", "", "", kLudwig}),
           Leaf("min_new_tokens", {"integer", "", "", kLudwig}),
           Leaf("top_k", {"integer", "", "", kLudwig}),
           Leaf("num_beams", {"integer", "", "", kLudwig}),
           Leaf("do_sample", {"bool", "", "", kLudwig})}),
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

// The names users of other trainers paste, and where this job file has the same setting.
struct PeerKeyName {
  const char* name;
  const char* tools;
  const char* here;
};
constexpr PeerKeyName kPeerKeyNames[] = {
    {"micro_batch_size", "Axolotl", "trainer.batch_size"},
    {"per_device_train_batch_size", "the HF Trainer and LLaMA-Factory", "trainer.batch_size"},
    {"lr", "torchtune", "trainer.learning_rate"},
    {"num_epochs", "Axolotl and torchtune", "trainer.epochs"},
    {"num_train_epochs", "the HF Trainer and LLaMA-Factory", "trainer.epochs"},
    {"max_steps", "the HF Trainer", "trainer.train_steps"},
    {"max_steps_per_epoch", "torchtune", "trainer.train_steps"},
    {"sequence_len", "Axolotl", "data.max_sequence_length"},
    {"cutoff_len", "LLaMA-Factory", "data.max_sequence_length"},
    {"max_seq_length", "TRL", "data.max_sequence_length"},
    {"max_seq_len", "torchtune", "data.max_sequence_length"},
    {"sample_packing", "Axolotl", "data.packing"},
    {"lora_r", "Axolotl", "adapter.r"},
    {"lora_rank", "torchtune and LLaMA-Factory", "adapter.r"},
    {"lora_alpha", "Axolotl, torchtune and LLaMA-Factory", "adapter.alpha"},
    {"lora_dropout", "Axolotl, torchtune and LLaMA-Factory", "adapter.dropout"},
    {"lora_target_modules", "Axolotl", "adapter.target_modules"},
    {"lora_target", "LLaMA-Factory", "adapter.target_modules"},
    {"lora_attn_modules", "torchtune", "adapter.target_modules"},
    {"base_model_name_or_path", "peft", "base_model"},
    {"model_name_or_path", "the HF Trainer and LLaMA-Factory", "base_model"},
    {"datasets", "Axolotl", "dataset"},
    {"val_set_size", "Axolotl", "data.validation_fraction"},
    {"warmup_ratio", "the HF Trainer and LLaMA-Factory", "trainer.learning_rate_scheduler.warmup_fraction"},
    {"lr_scheduler", "Axolotl", "trainer.learning_rate_scheduler.decay"},
    {"lr_scheduler_type", "the HF Trainer and LLaMA-Factory", "trainer.learning_rate_scheduler.decay"},
    {"weight_decay", "the HF Trainer and Axolotl", "trainer.optimizer.weight_decay"},
    {"save_steps", "the HF Trainer and LLaMA-Factory", "trainer.steps_per_checkpoint"},
    {"gradient_checkpointing", "the HF Trainer and Axolotl", "trainer.enable_gradient_checkpointing"},
    {"load_in_4bit", "Axolotl and the HF Trainer", "quantization.bits (4, the default)"},
};

NearestName Nearest(const std::string& typed, const std::vector<std::string>& candidates) {
  NearestName nearest;
  int best = 0;
  for (const std::string& candidate : candidates) {
    const int d = LevenshteinDistance(Lower(typed), candidate);
    if (nearest.name.empty() || d < best) {
      nearest.name = candidate;
      best = d;
    }
  }
  const int tolerance = std::max<int>(2, static_cast<int>(typed.size()) / 3);
  nearest.typo = !nearest.name.empty() && best <= tolerance;
  return nearest;
}

std::string UnknownKeyProblem(const SchemaNode& node, const std::string& path,
                              const std::string& key) {
  const std::string where = path.empty() ? "the top level" : path;
  for (const PeerKeyName& peer : kPeerKeyNames) {
    if (Lower(key) == peer.name) {
      return absl::StrCat("unknown field: '", peer.name, "' is ", peer.tools, "'s name; here it is '",
                          peer.here, "'");
    }
  }
  std::vector<std::string> names;
  for (const SchemaNode& child : node.children) names.push_back(child.key);
  const NearestName nearest = Nearest(key, names);
  if (nearest.typo) return absl::StrCat("unknown field; did you mean '", nearest.name, "'?");
  const std::vector<std::string> elsewhere = PathsEndingIn(JobFileSchema(), key);
  if (elsewhere.size() == 1) {
    return absl::StrCat("unknown field in ", where, "; did you mean '", elsewhere[0], "'?");
  }
  if (nearest.name.empty()) return "unknown field";
  return absl::StrCat("unknown field (closest valid name: '", nearest.name, "'); the fields of ",
                      where, " are: ", absl::StrJoin(names, ", "));
}

}  // namespace qlora::config_internal
