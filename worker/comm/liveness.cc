// LivenessBoard: one key per rank and point, "<prefix>/<point>/<rank>".
#include "worker/comm/liveness.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace qlora::comm {

std::string DescribeRanks(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ", "));
}

LivenessBoard::LivenessBoard(std::shared_ptr<RendezvousStore> store, std::string prefix, int rank,
                             int world_size)
    : store_(std::move(store)), prefix_(std::move(prefix)), rank_(rank), world_size_(world_size) {}

absl::StatusOr<std::vector<int>> LivenessBoard::Absent(const std::string& point,
                                                       absl::Duration timeout) {
  const std::string base = absl::StrCat(prefix_, "/", point, "/");
  absl::Status set = store_->Set(absl::StrCat(base, rank_), "1");
  if (!set.ok()) return set;
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<int> absent;
  for (int r = 0; r < world_size_; ++r) {
    if (r == rank_) continue;
    const absl::Duration left = std::max(deadline - absl::Now(), absl::ZeroDuration());
    absl::StatusOr<std::string> mark = store_->Get(absl::StrCat(base, r), left);
    if (absl::IsDeadlineExceeded(mark.status())) {
      absent.push_back(r);
    } else if (!mark.ok()) {
      return mark.status();
    }
  }
  return absent;
}

absl::Status LivenessBoard::Join(absl::Duration timeout) {
  absl::StatusOr<std::vector<int>> absent = Absent("join", timeout);
  if (!absent.ok()) {
    return absl::Status(absent.status().code(),
                        absl::StrCat("rendezvous '", prefix_, "' (rank ", rank_, " of ",
                                     world_size_, "): store failed: ",
                                     absent.status().message()));
  }
  if (absent->empty()) return absl::OkStatus();
  return absl::DeadlineExceededError(
      absl::StrCat("rendezvous '", prefix_, "': ", DescribeRanks(*absent), " of ", world_size_,
                   " did not join within ", absl::FormatDuration(timeout), " (seen from rank ",
                   rank_, ")"));
}

std::vector<int> LivenessBoard::RanksAbsentFrom(const std::string& point, absl::Duration grace) {
  absl::StatusOr<std::vector<int>> absent = Absent(point, grace);
  return absent.ok() ? *std::move(absent) : std::vector<int>{};
}

}  // namespace qlora::comm
