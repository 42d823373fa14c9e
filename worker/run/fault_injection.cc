// The crash-before-checkpoint test hook (see fault_injection.h).
#include "worker/run/fault_injection.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace qlora::worker {
namespace {

class CrashBeforeSave : public TrainingObserver {
 public:
  CrashBeforeSave(int64_t step, std::string marker) : step_(step), marker_(std::move(marker)) {}
  void OnCheckpointSave(int64_t step, const std::string&) override {
    if (step != step_) return;
    const int fd = ::open(marker_.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0) return;  // fired once already
    ::close(fd);
    fprintf(stderr, "%s: exiting before the checkpoint of step %lld\n", kCrashBeforeSaveVariable,
            static_cast<long long>(step));
    fflush(stderr);
    _exit(86);
  }

 private:
  const int64_t step_;
  const std::string marker_;
};

}  // namespace

std::unique_ptr<TrainingObserver> FaultInjectorFromEnvironment(int rank) {
  const char* spec = std::getenv(kCrashBeforeSaveVariable);
  if (spec == nullptr || *spec == '\0') return nullptr;
  const std::vector<std::string> parts = absl::StrSplit(spec, absl::MaxSplits(':', 2));
  int64_t step = 0;
  int crash_rank = 0;
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &step) || !absl::SimpleAtoi(parts[1], &crash_rank) ||
      parts[2].empty()) {
    fprintf(stderr, "%s: expected <step>:<rank>:<marker file>, got '%s'; ignored\n", kCrashBeforeSaveVariable, spec);
    return nullptr;
  }
  if (crash_rank != rank) return nullptr;
  return std::make_unique<CrashBeforeSave>(step, parts[2]);
}

}  // namespace qlora::worker
