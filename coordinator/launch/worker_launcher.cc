// The launcher-independent parts of worker_launcher.h.
#include "coordinator/launch/worker_launcher.h"

#include <string.h>

#include "absl/strings/str_cat.h"

namespace qlora::coordinator {

std::string ExitInfo::Describe() const {
  if (!cause.empty()) return cause;
  if (signaled) return absl::StrCat("signal ", code, " (", strsignal(code), ")");
  return absl::StrCat("exit status ", code);
}

}  // namespace qlora::coordinator
