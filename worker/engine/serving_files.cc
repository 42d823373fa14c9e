// generation_config.json and tokenizer files of a merged folder (see serving_files.h).
#include "worker/engine/serving_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/posix_files.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace qlora::engine {
namespace {

// The contents of `path` if it is a regular file of at most kMaxServingFileBytes; NotFound
// when it does not exist.
absl::StatusOr<std::string> ReadBoundedRegularFile(const std::string& path) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused just below.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(path);
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", std::strerror(errno)));
  }
  struct stat st {};
  std::string bytes;
  absl::Status status;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    status = absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  } else if (st.st_size > kMaxServingFileBytes) {
    status = absl::InvalidArgumentError(
        absl::StrCat(path, ": ", st.st_size, " bytes, more than the ", kMaxServingFileBytes, " allowed"));
  } else {
    bytes.resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        status = absl::InvalidArgumentError(absl::StrCat(path, ": short read"));
        break;
      }
      done += static_cast<size_t>(n);
    }
  }
  ::close(fd);
  if (!status.ok()) return status;
  return bytes;
}

// Copies `name` from `from` to `to`; false (and OK) when `from` has no such file.
absl::StatusOr<bool> CopyIfPresent(const std::string& from, const std::string& to, const std::string& name) {
  absl::StatusOr<std::string> bytes = ReadBoundedRegularFile(JoinPath(from, name));
  if (absl::IsNotFound(bytes.status())) return false;
  QLORA_RETURN_IF_ERROR(bytes.status());
  QLORA_RETURN_IF_ERROR(WriteFileAtomically(JoinPath(to, name), *bytes));
  return true;
}

}  // namespace

std::string GenerationConfigFromModelConfig(const LlamaConfig& config) {
  const nlohmann::json json = {
      {"_from_model_config", true},
      {"bos_token_id", config.bos_token_id},
      {"eos_token_id", config.eos_token_id},
  };
  return json.dump(2) + "\n";
}

absl::Status WriteServingFiles(const std::string& base_dir, const std::string& out_dir,
                               const LlamaConfig& config) {
  bool copied = false;
  if (!base_dir.empty()) {
    QLORA_ASSIGN_OR_RETURN(copied, CopyIfPresent(base_dir, out_dir, kGenerationConfigFile));
  }
  if (!copied) {
    QLORA_RETURN_IF_ERROR(WriteFileAtomically(JoinPath(out_dir, kGenerationConfigFile),
                                              GenerationConfigFromModelConfig(config)));
  }
  if (base_dir.empty()) return absl::OkStatus();
  for (const char* name : kTokenizerFiles) {
    QLORA_RETURN_IF_ERROR(CopyIfPresent(base_dir, out_dir, name).status());
  }
  return absl::OkStatus();
}

}  // namespace qlora::engine
