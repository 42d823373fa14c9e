// The closed choices of a job file as enums, with one name table each (the spelling the job file
// and the resolved YAML use). The parser turns names into these once; every consumer switches on
// the enum and never compares strings. Header-only and torch-free.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace qlora {

enum class QuantType { kNF4, kFP4 };                      // bnb_4bit_quant_type
enum class ComputeDtype { kBFloat16, kFloat16, kFloat32 };  // bnb_4bit_compute_dtype
enum class LrScheduler { kConstant, kLinear, kCosine };   // learning_rate_scheduler.decay
enum class OptimizerType { kAdamW, kAdam };               // trainer.optimizer.type
enum class StrategyType { kDeepSpeed, kDdp };             // backend.trainer.strategy.type
enum class BackendType { kLocal, kRay };                  // backend.type
// backend.trainer.placement_strategy: Ray's strategies for one bundle per worker.
enum class PlacementStrategy { kPack, kSpread, kStrictPack, kStrictSpread };
enum class DatasetFormat { kAuto, kJsonl, kCsv, kText, kParquet, kArrow };  // data.format
enum class MalformedRecords { kFail, kSkip };             // data.malformed_records
// trainer.enable_gradient_checkpointing: every decoder layer, none, or as many as the memory
// budget needs (trainer.max_memory_gib; the worker plans it, worker/memory/activation_plan.h).
enum class CheckpointingMode { kAll, kNone, kAuto };
// trainer.type: supervised fine-tuning, or preference tuning as TRL's DPOTrainer / ORPOTrainer
// do it (worker/run/preference_objective.h); `none` parses and is refused (no adapter training).
enum class TrainerType { kFinetune, kDpo, kOrpo, kNone };
// trainer.loss_type of a DPO job: TRL's names.
enum class PreferenceLoss { kSigmoid, kIpo, kHinge, kRobust };

template <typename E>
struct EnumEntry {
  E value;
  const char* name;
};

// EnumTable<E>::kEntries: every value of E with its name, in the order messages list them.
template <typename E>
struct EnumTable;

#define QLORA_ENUM_TABLE(E, ...)                                  \
  template <>                                                     \
  struct EnumTable<E> {                                           \
    static constexpr EnumEntry<E> kEntries[] = {__VA_ARGS__};     \
  }

QLORA_ENUM_TABLE(QuantType, {QuantType::kNF4, "nf4"}, {QuantType::kFP4, "fp4"});
QLORA_ENUM_TABLE(ComputeDtype, {ComputeDtype::kBFloat16, "bfloat16"},
                 {ComputeDtype::kFloat16, "float16"}, {ComputeDtype::kFloat32, "float32"});
// "none" in the job file is kConstant (see the parser); the resolved YAML writes "none" too.
QLORA_ENUM_TABLE(LrScheduler, {LrScheduler::kCosine, "cosine"}, {LrScheduler::kLinear, "linear"},
                 {LrScheduler::kConstant, "none"});
QLORA_ENUM_TABLE(OptimizerType, {OptimizerType::kAdamW, "adamw"}, {OptimizerType::kAdam, "adam"});
QLORA_ENUM_TABLE(StrategyType, {StrategyType::kDeepSpeed, "deepspeed"}, {StrategyType::kDdp, "ddp"});
QLORA_ENUM_TABLE(BackendType, {BackendType::kLocal, "local"}, {BackendType::kRay, "ray"});
QLORA_ENUM_TABLE(PlacementStrategy, {PlacementStrategy::kPack, "PACK"},
                 {PlacementStrategy::kSpread, "SPREAD"}, {PlacementStrategy::kStrictPack, "STRICT_PACK"},
                 {PlacementStrategy::kStrictSpread, "STRICT_SPREAD"});
QLORA_ENUM_TABLE(DatasetFormat, {DatasetFormat::kAuto, "auto"}, {DatasetFormat::kJsonl, "jsonl"},
                 {DatasetFormat::kCsv, "csv"}, {DatasetFormat::kText, "text"},
                 {DatasetFormat::kParquet, "parquet"}, {DatasetFormat::kArrow, "arrow"});
QLORA_ENUM_TABLE(TrainerType, {TrainerType::kFinetune, "finetune"}, {TrainerType::kDpo, "dpo"},
                 {TrainerType::kOrpo, "orpo"}, {TrainerType::kNone, "none"});
QLORA_ENUM_TABLE(PreferenceLoss, {PreferenceLoss::kSigmoid, "sigmoid"}, {PreferenceLoss::kIpo, "ipo"},
                 {PreferenceLoss::kHinge, "hinge"}, {PreferenceLoss::kRobust, "robust"});
QLORA_ENUM_TABLE(MalformedRecords, {MalformedRecords::kFail, "fail"},
                 {MalformedRecords::kSkip, "skip"});
// The YAML booleans true/false (emitted unquoted, so they read back as booleans) and "auto".
QLORA_ENUM_TABLE(CheckpointingMode, {CheckpointingMode::kAll, "true"},
                 {CheckpointingMode::kNone, "false"}, {CheckpointingMode::kAuto, "auto"});

#undef QLORA_ENUM_TABLE

// The job file's name of `value`.
template <typename E>
const char* EnumName(E value) {
  for (const EnumEntry<E>& e : EnumTable<E>::kEntries) {
    if (e.value == value) return e.name;
  }
  return "?";
}

// The value named `name`; nullopt when no value has that name.
template <typename E>
std::optional<E> ParseEnumName(absl::string_view name) {
  for (const EnumEntry<E>& e : EnumTable<E>::kEntries) {
    if (name == e.name) return e.value;
  }
  return std::nullopt;
}

// Every name of E, for "expected one of ..." messages.
template <typename E>
std::vector<std::string> EnumNames() {
  std::vector<std::string> names;
  for (const EnumEntry<E>& e : EnumTable<E>::kEntries) names.emplace_back(e.name);
  return names;
}

}  // namespace qlora
