// A job's workers: launch, stop, collect their ends (see worker_group.h).
#include "coordinator/jobs/worker_group.h"

#include <algorithm>
#include <utility>

namespace qlora::coordinator {

absl::Status WorkerGroup::Launch(WorkerLauncher* launcher, const GroupLaunch& launch,
                                 const std::vector<std::string>& tokens, absl::Time now) {
  absl::StatusOr<std::unique_ptr<LaunchedGroup>> launched = launcher->Launch(launch);
  if (!launched.ok()) return launched.status();
  launched_ = *std::move(launched);
  workers_.clear();
  for (const RankLaunch& rank : launch.ranks) {
    WorkerProcess w;
    w.rank = rank.rank;
    w.token = tokens.at(rank.rank);
    w.slot = rank.slot;
    w.where = launched_->Where(rank.rank);
    w.last_heartbeat = now;
    workers_.push_back(std::move(w));
  }
  return absl::OkStatus();
}

WorkerProcess* WorkerGroup::FindByToken(const std::string& token) {
  for (WorkerProcess& w : workers_) {
    if (w.token == token) return &w;
  }
  return nullptr;
}

std::vector<WorkerExit> WorkerGroup::Reap() {
  std::vector<WorkerExit> exits;
  if (!launched_) return exits;
  for (const RankEnd& end : launched_->Poll()) {
    for (WorkerProcess& w : workers_) {
      if (w.rank != end.rank || w.exited) continue;
      w.exited = true;
      // The launcher's place is the more precise one once it names a host.
      if (w.where.empty() || end.where.find("host") != std::string::npos) w.where = end.where;
      exits.push_back({w.rank, w.where, w.slot, w.completed, end.info});
    }
  }
  return exits;
}

bool WorkerGroup::AnyAlive() const {
  return std::any_of(workers_.begin(), workers_.end(), [](const WorkerProcess& w) { return !w.exited; });
}

bool WorkerGroup::AllCompleted() const {
  return std::all_of(workers_.begin(), workers_.end(), [](const WorkerProcess& w) { return w.completed; });
}

const WorkerProcess* WorkerGroup::SilentSince(absl::Time cutoff) const {
  for (const WorkerProcess& w : workers_) {
    if (!w.completed && !w.exited && w.last_heartbeat < cutoff) return &w;
  }
  return nullptr;
}

void WorkerGroup::TouchAll(absl::Time now) {
  for (WorkerProcess& w : workers_) w.last_heartbeat = now;
}

void WorkerGroup::Stop(absl::Time kill_at) {
  if (stopping_) return;
  ExpectExit(kill_at);
  if (launched_ && AnyAlive()) launched_->Terminate();
}

void WorkerGroup::ExpectExit(absl::Time kill_at) {
  if (stopping_) return;
  stopping_ = true;
  kill_at_ = kill_at;
}

void WorkerGroup::KillOverdue(absl::Time now) {
  if (stopping_ && now >= kill_at_ && AnyAlive()) KillAll();
}

void WorkerGroup::KillAll() {
  if (!launched_ || !AnyAlive()) return;
  launched_->Kill();
  killed_ = true;
}

void WorkerGroup::ReapKilled() {
  if (!launched_ || !killed_) return;
  launched_->AwaitKilled();
  Reap();
}

}  // namespace qlora::coordinator
