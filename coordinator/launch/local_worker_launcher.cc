// Child processes as a job's workers (see local_worker_launcher.h).
#include "coordinator/launch/local_worker_launcher.h"

#include <signal.h>
#include <unistd.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace qlora::coordinator {
namespace {

struct LocalRank {
  int rank = 0;
  pid_t pid = 0;
  bool exited = false;
};

class LocalGroup : public LaunchedGroup {
 public:
  explicit LocalGroup(ProcessLauncher* processes) : processes_(processes) {}

  void Add(int rank, pid_t pid) { ranks_.push_back({rank, pid, false}); }

  std::string Where(int rank) const override {
    for (const LocalRank& r : ranks_) {
      if (r.rank == rank) return absl::StrCat("pid ", r.pid);
    }
    return "";
  }

  std::vector<RankEnd> Poll() override {
    std::vector<RankEnd> ends = std::move(awaited_);
    awaited_.clear();
    for (LocalRank& r : ranks_) {
      if (r.exited) continue;
      std::optional<ExitInfo> info = processes_->Poll(r.pid);
      if (!info) continue;
      r.exited = true;
      ends.push_back({r.rank, absl::StrCat("pid ", r.pid), *info});
    }
    return ends;
  }

  void Terminate() override { SignalAlive(SIGTERM); }
  void Kill() override { SignalAlive(SIGKILL); }

  void AwaitKilled() override {
    for (LocalRank& r : ranks_) {
      // Reap what was killed so nothing is left as a zombie; Poll reports it no more.
      for (int i = 0; i < 100 && !r.exited; ++i) {
        if (std::optional<ExitInfo> info = processes_->Poll(r.pid)) {
          r.exited = true;
          awaited_.push_back({r.rank, absl::StrCat("pid ", r.pid), *info});
        } else {
          usleep(10000);
        }
      }
    }
  }

 private:
  void SignalAlive(int signal) {
    for (const LocalRank& r : ranks_) {
      if (!r.exited) processes_->Signal(r.pid, signal);
    }
  }

  ProcessLauncher* processes_;
  std::vector<LocalRank> ranks_;
  std::vector<RankEnd> awaited_;  // reaped by AwaitKilled, reported by the next Poll
};

}  // namespace

absl::StatusOr<std::unique_ptr<LaunchedGroup>> LocalWorkerLauncher::Launch(const GroupLaunch& launch) {
  auto group = std::make_unique<LocalGroup>(processes_);
  for (const RankLaunch& rank : launch.ranks) {
    absl::StatusOr<pid_t> pid = processes_->Launch(rank.spec);
    if (!pid.ok()) {
      group->Kill();  // nothing of a failed start is left running
      group->AwaitKilled();
      return absl::InternalError(absl::StrCat("could not start rank ", rank.rank, ": ", pid.status().message()));
    }
    group->Add(rank.rank, *pid);
  }
  return group;
}

LauncherCapacity LocalWorkerLauncher::Capacity() const {
  LauncherCapacity capacity;
  capacity.gpus = gpus_;
  capacity.cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  capacity.hosts = 1;
  capacity.known = true;
  return capacity;
}

}  // namespace qlora::coordinator
