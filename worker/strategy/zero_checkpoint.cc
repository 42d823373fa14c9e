// ZeroStrategy checkpoints. Layout of a checkpoint directory:
//   rank-RRRRR-of-WWWWW.safetensors  one per rank: "master", "exp_avg", "exp_avg_sq" (fp32) of
//                                     flat range [R x P, (R + 1) x P), metadata step/range
//   manifest.json                     rank 0, written last: stage, world size, step, padding,
//                                     parameter names/shapes/offsets in order, partition files
// Every stage writes the same partitioning of the flat state (stage 0 writes its slice of the
// replicated state), so any stage and world size can load any checkpoint: the unpadded flat
// index space is the same for every world size, only the padding at its end differs
// (DeepSpeed's universal checkpoint reaches the same end offline).
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/posix_files.h"
#include "common/safetensors/reader.h"
#include "common/safetensors/writer.h"
#include "common/status_macros.h"
#include "worker/strategy/zero_strategy.h"

namespace qlora::strategy {
namespace {

constexpr char kManifest[] = "manifest.json";
constexpr char kFormat[] = "qlora-zero-checkpoint";
constexpr const char* kStateNames[] = {"master", "exp_avg", "exp_avg_sq"};

std::string PartitionName(int rank, int world) {
  return absl::StrFormat("rank-%05d-of-%05d.safetensors", rank, world);
}

absl::StatusOr<nlohmann::json> ReadManifest(const std::string& dir) {
  std::ifstream in(dir + "/" + kManifest);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(dir, " has no ", kManifest, " (not a complete checkpoint)"));
  }
  nlohmann::json manifest = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!manifest.is_object() || manifest.value("format", "") != kFormat) {
    return absl::DataLossError(absl::StrCat(dir, "/", kManifest, " is not a ", kFormat, " manifest"));
  }
  return manifest;
}

// Copies `count` float32 elements of 1-D tensor `name` from element `offset` on.
absl::Status ReadFloats(const safetensors::SafetensorsFile& file, const std::string& name,
                        int64_t offset, int64_t count, float* out) {
  QLORA_ASSIGN_OR_RETURN(safetensors::TensorView view, file.Get(name));
  const int64_t numel = static_cast<int64_t>(view.nbytes / sizeof(float));
  if (view.dtype != safetensors::Dtype::kF32 || view.shape.size() != 1 || offset < 0 ||
      count < 0 || offset + count > numel) {
    return absl::DataLossError(absl::StrCat(file.path(), ": '", name, "' is not F32 [>= ",
                                            offset + count, "]"));
  }
  std::memcpy(out, view.data + offset * sizeof(float), count * sizeof(float));
  file.Evict(view);
  return absl::OkStatus();
}

}  // namespace

absl::Status ZeroStrategy::SaveCheckpoint(const std::string& dir) {
  if (!broken_.ok()) return absl::FailedPreconditionError(broken_.message());
  const int rank = comm_.rank();
  const int world = comm_.world_size();
  const FlatRange part = layout_.Partition(rank);
  const FlatRange owned = Owned();
  // This rank's slice of each state tensor, on the CPU.
  std::vector<at::Tensor> state;
  for (const at::Tensor& t : {master_, adamw_->exp_avg(), adamw_->exp_avg_sq()}) {
    state.push_back(t.slice(0, part.begin - owned.begin, part.end - owned.begin)
                        .to(at::kCPU).contiguous());
  }
  absl::Status written = MakeDirs(dir);
  if (written.ok()) {
    std::vector<safetensors::TensorBytes> tensors;
    for (int i = 0; i < 3; ++i) {
      tensors.push_back({{kStateNames[i], safetensors::Dtype::kF32, {part.size()}},
                         state[i].data_ptr<float>(),
                         static_cast<size_t>(part.size()) * sizeof(float)});
    }
    written = safetensors::WriteSafetensors(
        absl::StrCat(dir, "/", PartitionName(rank, world)), tensors,
        {{"format", kFormat}, {"rank", std::to_string(rank)}, {"world_size", std::to_string(world)},
         {"step", std::to_string(adamw_->step())}, {"begin", std::to_string(part.begin)},
         {"end", std::to_string(part.end)}});
  }
  // Agree on success before the manifest marks the checkpoint complete.
  at::Tensor failures = at::full({1}, written.ok() ? 0.0 : 1.0, Fp32().dtype(at::kDouble));
  QLORA_RETURN_IF_ERROR(Collective(comm_.AllReduceSum(failures, options_.collective_timeout)));
  if (!written.ok()) return written;
  if (failures.item<double>() > 0) {
    return absl::AbortedError(absl::StrCat("checkpoint ", dir, ": ",
                                           static_cast<int>(failures.item<double>()),
                                           " rank(s) failed to write their partition"));
  }
  if (rank == 0) {
    nlohmann::json manifest;
    manifest["format"] = kFormat;
    manifest["version"] = 1;
    manifest["stage"] = plan_.stage;
    manifest["world_size"] = world;
    manifest["step"] = adamw_->step();
    manifest["numel"] = layout_.numel();
    manifest["padded_numel"] = layout_.padded_numel();
    manifest["partition_numel"] = layout_.partition_numel();
    manifest["alignment"] = 2 * world;
    const optim::AdamWOptions& a = adamw_->options();
    manifest["adamw"] = {{"beta1", a.beta1}, {"beta2", a.beta2}, {"eps", a.eps},
                         {"weight_decay", a.weight_decay}};
    for (int i = 0; i < layout_.num_params(); ++i) {
      manifest["params"].push_back({{"name", params_[i].name},
                                    {"shape", params_[i].tensor.sizes().vec()},
                                    {"offset", layout_.Param(i).begin},
                                    {"numel", layout_.Param(i).size()}});
    }
    for (int r = 0; r < world; ++r) manifest["partitions"].push_back(PartitionName(r, world));
    const std::string path = absl::StrCat(dir, "/", kManifest);
    // Written last and atomically: a checkpoint with a manifest is complete.
    if (written.ok()) written = WriteFileAtomically(path, manifest.dump(2) + "\n");
  }
  QLORA_RETURN_IF_ERROR(Collective(comm_.Broadcast(failures.fill_(written.ok() ? 0.0 : 1.0), 0,
                                                   options_.collective_timeout)));
  if (failures.item<double>() > 0) {
    return written.ok() ? absl::AbortedError(absl::StrCat("checkpoint ", dir,
                                                          ": rank 0 failed to write the manifest"))
                        : written;
  }
  return absl::OkStatus();
}

absl::StatusOr<ResumeReport> ZeroStrategy::LoadCheckpoint(const std::string& dir) {
  if (!broken_.ok()) return absl::FailedPreconditionError(broken_.message());
  ResumeReport report;
  const FlatRange owned = Owned();
  std::vector<at::Tensor> state;  // CPU copies of master, exp_avg, exp_avg_sq over `owned`
  for (int i = 0; i < 3; ++i) state.push_back(at::zeros({owned.size()}, at::kFloat));
  // Reads this rank's part; every rank then agrees on success before changing any state.
  auto read = [&]() -> absl::Status {
    QLORA_ASSIGN_OR_RETURN(nlohmann::json manifest, ReadManifest(dir));
    const nlohmann::json& saved = manifest["params"];
    if (!saved.is_array() || static_cast<int>(saved.size()) != layout_.num_params()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", dir, " holds ", saved.size(), " parameters, this job trains ",
          layout_.num_params()));
    }
    for (int i = 0; i < layout_.num_params(); ++i) {
      if (saved[i].value("name", "") != params_[i].name ||
          saved[i].value("shape", std::vector<int64_t>{}) != params_[i].tensor.sizes().vec()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "checkpoint ", dir, ": parameter ", i, " is '", saved[i].value("name", ""),
            "' there and '", params_[i].name, "' (or another shape) here"));
      }
    }
    report.step = manifest.value("step", int64_t{0});
    report.saved_world_size = manifest.value("world_size", 0);
    report.saved_stage = manifest.value("stage", 0);
    const int64_t saved_part = manifest.value("partition_numel", int64_t{0});
    const std::vector<std::string> files = manifest.value("partitions", std::vector<std::string>{});
    if (report.saved_world_size < 1 || static_cast<int>(files.size()) != report.saved_world_size ||
        saved_part * report.saved_world_size < layout_.numel()) {
      return absl::DataLossError(absl::StrCat("checkpoint ", dir, ": inconsistent manifest"));
    }
    const FlatRange wanted = Intersect(owned, {0, layout_.numel()});
    for (int q = 0; q < report.saved_world_size; ++q) {
      const FlatRange from = Intersect(wanted, {q * saved_part, (q + 1) * saved_part});
      if (from.size() == 0) continue;
      QLORA_ASSIGN_OR_RETURN(std::unique_ptr<safetensors::SafetensorsFile> file,
                             safetensors::SafetensorsFile::Open(absl::StrCat(dir, "/", files[q])));
      if (file->metadata().count("step") == 0 ||
          file->metadata().at("step") != std::to_string(report.step)) {
        return absl::DataLossError(absl::StrCat(dir, "/", files[q], " is from another step"));
      }
      for (int i = 0; i < 3; ++i) {
        QLORA_RETURN_IF_ERROR(ReadFloats(*file, kStateNames[i], from.begin - q * saved_part,
                                         from.size(),
                                         state[i].data_ptr<float>() + (from.begin - owned.begin)));
      }
    }
    return absl::OkStatus();
  };
  absl::Status status = read();
  at::Tensor failures = at::full({1}, status.ok() ? 0.0 : 1.0, Fp32().dtype(at::kDouble));
  QLORA_RETURN_IF_ERROR(Collective(comm_.AllReduceSum(failures, options_.collective_timeout)));
  if (!status.ok()) return status;
  if (failures.item<double>() > 0) {
    return absl::AbortedError(absl::StrCat("checkpoint ", dir, ": another rank could not read it"));
  }
  master_.copy_(state[0]);
  adamw_->exp_avg().copy_(state[1]);
  adamw_->exp_avg_sq().copy_(state[2]);
  adamw_->set_step(report.step);
  grad_.zero_();
  QLORA_RETURN_IF_ERROR(PublishMaster());
  const int world = comm_.world_size();
  report.repartitioned = report.saved_world_size != world;
  report.description = absl::StrCat(
      "resumed at step ", report.step, " from ", dir, " (saved by ", report.saved_world_size,
      " rank(s) under ZeRO stage ", report.saved_stage, "; now ", world, " rank(s), stage ",
      plan_.stage, ")",
      report.repartitioned
          ? absl::StrCat(": re-partitioned ", layout_.numel(), " elements of fp32 master, exp_avg "
                         "and exp_avg_sq from ", report.saved_world_size, " partition(s) into ",
                         world, " of ", layout_.partition_numel())
          : std::string(": same partitioning"));
  return report;
}

}  // namespace qlora::strategy
