// config.json of the base model, stat'ed, read and parsed as the workers will (see model_check.h).
#include "coordinator/admission/model_check.h"

#include <sys/stat.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/posix_files.h"
#include "common/model/llama_config.h"
#include "coordinator/admission/confined_open.h"

namespace qlora::coordinator {
namespace {

constexpr int64_t kMaxConfigBytes = 4 << 20;

absl::Status Refuse(const std::string& dir, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("base_model '", dir, "': ", why));
}

// The largest rank an adapter of each targeted projection can have: min(in, out), the smallest
// over the targets, with the projection it comes from.
absl::Status CheckAdapterRank(const engine::LlamaConfig& model, const LoraConfig& lora) {
  for (const std::string& module : lora.target_modules) {
    const engine::LlamaConfig::Features f = model.ProjectionFeatures(module);
    const int64_t most = std::min(f.in, f.out);
    if (most > 0 && lora.r > most) {
      return absl::InvalidArgumentError(absl::StrCat(
          "adapter.r: ", lora.r, " is larger than any adapter of ", module, " can use (", f.in,
          " -> ", f.out, " features: at most ", most, "); lower adapter.r"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckBaseModelConfig(const std::string& model_dir, const LoraConfig* lora,
                                  const std::vector<std::string>& roots) {
  if (model_dir.empty()) return absl::OkStatus();
  // Looked at through a descriptor opened beneath the roots (no link can lead out meanwhile).
  absl::StatusOr<ConfinedFile> file = ConfinedFile::Open(JoinPath(model_dir, "config.json"), roots);
  if (!file.ok()) return Refuse(model_dir, absl::StrCat("config.json: ", file.status().message()));
  struct stat st;
  if (fstat(file->fd(), &st) != 0) return Refuse(model_dir, "config.json cannot be read");
  if (!S_ISREG(st.st_mode)) return Refuse(model_dir, "config.json is not a regular file");
  if (st.st_size > kMaxConfigBytes) return Refuse(model_dir, "config.json is larger than 4 MiB");
  absl::StatusOr<std::string> text = ReadFile(file->path_for_readers());
  if (!text.ok()) return Refuse(model_dir, text.status().message());
  absl::StatusOr<engine::LlamaConfig> config = engine::ParseLlamaConfig(*text);
  if (!config.ok()) return Refuse(model_dir, config.status().message());
  return lora == nullptr ? absl::OkStatus() : CheckAdapterRank(*config, *lora);
}

}  // namespace qlora::coordinator
