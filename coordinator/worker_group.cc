// A job's worker processes: launch, signal, reap (see worker_group.h).
#include "coordinator/worker_group.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

namespace qlora::coordinator {

absl::Status WorkerGroup::Launch(int rank, int slot, std::string token, const LaunchSpec& spec,
                                 absl::Time now) {
  absl::StatusOr<pid_t> pid = launcher_->Launch(spec);
  if (!pid.ok()) return pid.status();
  WorkerProcess w;
  w.rank = rank;
  w.token = std::move(token);
  w.slot = slot;
  w.pid = *pid;
  w.last_heartbeat = now;
  workers_.push_back(std::move(w));
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
  for (WorkerProcess& w : workers_) {
    if (w.exited) continue;
    std::optional<ExitInfo> info = launcher_->Poll(w.pid);
    if (!info) continue;
    w.exited = true;
    exits.push_back({w.rank, w.pid, w.slot, w.completed, *info});
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
  SignalAlive(SIGTERM);
}

void WorkerGroup::ExpectExit(absl::Time kill_at) {
  if (stopping_) return;
  stopping_ = true;
  kill_at_ = kill_at;
}

void WorkerGroup::KillOverdue(absl::Time now) {
  if (stopping_ && now >= kill_at_) SignalAlive(SIGKILL);
}

void WorkerGroup::ReapKilled() {
  for (WorkerProcess& w : workers_) {
    // Reap what was killed so nothing is left as a zombie.
    for (int i = 0; i < 100 && !w.exited; ++i) {
      if (launcher_->Poll(w.pid)) w.exited = true; else usleep(10000);
    }
  }
}

void WorkerGroup::SignalAlive(int signal) {
  for (const WorkerProcess& w : workers_) {
    if (!w.exited) launcher_->Signal(w.pid, signal);
  }
}

}  // namespace qlora::coordinator
