// config.json of the base model, stat'ed, read and parsed as the workers will (see model_check.h).
#include "coordinator/admission/model_check.h"

#include <sys/stat.h>

#include "absl/strings/str_cat.h"
#include "common/posix_files.h"
#include "common/model/llama_config.h"

namespace qlora::coordinator {
namespace {

constexpr int64_t kMaxConfigBytes = 4 << 20;

absl::Status Refuse(const std::string& dir, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("base_model '", dir, "': ", why));
}

}  // namespace

absl::Status CheckBaseModelConfig(const std::string& model_dir) {
  if (model_dir.empty()) return absl::OkStatus();
  const std::string path = JoinPath(model_dir, "config.json");
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return Refuse(model_dir, "config.json cannot be read");
  if (!S_ISREG(st.st_mode)) return Refuse(model_dir, "config.json is not a regular file");
  if (st.st_size > kMaxConfigBytes) return Refuse(model_dir, "config.json is larger than 4 MiB");
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return Refuse(model_dir, text.status().message());
  absl::StatusOr<engine::LlamaConfig> config = engine::ParseLlamaConfig(*text);
  if (!config.ok()) return Refuse(model_dir, config.status().message());
  return absl::OkStatus();
}

}  // namespace qlora::coordinator
