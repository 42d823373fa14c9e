// CollectiveFailureStatus (see collective_failure.h).
#include "worker/comm/collective_failure.h"

#include "absl/strings/str_cat.h"
#include "worker/comm/liveness.h"

namespace qlora::comm {

absl::Status CollectiveFailureStatus(const CollectiveFailure& f) {
  const std::string message = absl::StrCat(
      f.where, " #", f.sequence,
      f.tensor.defined()
          ? absl::StrCat(" of ", f.tensor.numel(), " ", c10::toString(f.tensor.scalar_type()))
          : std::string(),
      f.timed_out ? absl::StrCat(" did not complete within ", absl::FormatDuration(f.timeout))
                  : " failed",
      !f.absent.has_value() ? std::string("; no store to tell which rank is missing")
      : f.absent->empty()   ? std::string("; every rank had entered it")
                            : absl::StrCat("; missing ", DescribeRanks(*f.absent),
                                           " (never entered it or died)"),
      " [", f.detail, "]");
  return f.timed_out ? absl::DeadlineExceededError(message) : absl::UnavailableError(message);
}

}  // namespace qlora::comm
