// GenerationSessions (see generation_sessions.h).
#include "coordinator/generate/generation_sessions.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "common/posix_files.h"
#include "common/auth/token_hash.h"

namespace qlora::coordinator {
struct GenerationSessions::Session {
  std::string id, token, log_path;
  v1::GenerationTask task;
  int prompts = 0;
  int slot = 0;
  std::unique_ptr<LaunchedGroup> process;
  bool task_taken = false;
  bool process_ended = false;
  std::string exit;                      // how the process ended
  std::deque<v1::GeneratedText> pieces;  // reported, not yet read
  bool finished = false;                 // the last prompt's last piece was reported
  absl::Status failure;
  absl::Time started, last_heard;
};

GenerationSessions::GenerationSessions(GenerationSlots* slots, GenerationSessionsOptions options)
    : slots_(slots), options_(std::move(options)) {}

GenerationSessions::~GenerationSessions() {
  std::vector<std::string> ids;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, session] : sessions_) ids.push_back(id);
  }
  for (const std::string& id : ids) End(id);
}

absl::StatusOr<std::string> GenerationSessions::Start(GenerationStart start) {
  int64_t number = 0;
  {
    absl::MutexLock lock(&mu_);
    if (static_cast<int>(sessions_.size()) >= options_.max_sessions) {
      return absl::ResourceExhaustedError(absl::StrCat(
          options_.max_sessions, " generation sessions are running; try again when one ends"));
    }
    number = next_number_++;
  }
  absl::StatusOr<int> slot = slots_->Lease();
  for (const absl::Time give_up = absl::Now() + options_.slot_wait;
       absl::IsResourceExhausted(slot.status()) && absl::Now() < give_up;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    slot = slots_->Lease();
  }
  if (!slot.ok()) return slot.status();
  auto session = std::make_unique<Session>();
  session->id = absl::StrCat(start.job_id, "-generate-", number);
  session->token = RandomToken();
  session->prompts = start.task.prompts_size();
  session->slot = *slot;
  const std::string logs = start.job_dir + "/logs";
  if (absl::Status made = MakeDirs(logs); !made.ok()) {
    slots_->Return(*slot);
    return made;
  }
  session->log_path = absl::StrCat(logs, "/generate-", number, ".log");

  WorkerLaunchRequest request = slots_->LaunchBasics();
  request.job_id = session->id;
  request.job_dir = start.job_dir;
  request.startup_token = session->token;
  request.rank = 0;
  request.world_size = 1;
  request.slot = *slot;
  if (!request.confine_write.empty() || !request.confine_read.empty()) {
    request.confine_read = start.confine_read;
    request.confine_write = {logs};
  }
  GroupLaunch launch;
  launch.job_id = session->id;
  launch.job_uid = session->id;
  launch.use_gpu = request.use_gpu;
  RankLaunch rank;
  rank.rank = 0;
  rank.slot = *slot;
  rank.spec = BuildWorkerLaunchSpec(request);
  rank.spec.argv.push_back(absl::StrCat("--generate=", session->id));
  rank.spec.log_path = session->log_path;
  launch.ranks.push_back(std::move(rank));
  session->task = std::move(start.task);
  session->task.set_device(request.use_gpu ? "cuda" : "cpu");
  absl::StatusOr<std::unique_ptr<LaunchedGroup>> process = slots_->launcher()->Launch(launch);
  if (!process.ok()) {
    slots_->Return(*slot);
    return absl::UnavailableError(absl::StrCat("cannot start the generation worker: ",
                                               process.status().message()));
  }
  session->process = std::move(*process);
  session->started = session->last_heard = options_.now();
  const std::string id = session->id;
  absl::MutexLock lock(&mu_);
  sessions_[id] = std::move(session);
  return id;
}

void GenerationSessions::PollProcess(Session& s) {
  if (s.process == nullptr || s.process_ended) return;
  for (const RankEnd& end : s.process->Poll()) {
    s.process_ended = true;
    s.exit = end.info.Describe();
    if (!s.finished && s.failure.ok()) {
      s.failure = absl::InternalError(absl::StrCat(
          "the generation worker ended (", s.exit, ") before it finished; its log: ", s.log_path));
    }
  }
}

absl::Status GenerationSessions::Next(const std::string& id, absl::Time deadline,
                                      std::vector<v1::GeneratedText>* pieces, bool* finished) {
  absl::MutexLock lock(&mu_);
  *finished = false;
  while (true) {
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return absl::NotFoundError(absl::StrCat("no generation session ", id));
    Session& s = *it->second;
    while (!s.pieces.empty()) {
      pieces->push_back(std::move(s.pieces.front()));
      s.pieces.pop_front();
    }
    if (!pieces->empty() || s.finished) {
      *finished = s.finished;
      return absl::OkStatus();
    }
    PollProcess(s);
    if (!s.failure.ok()) return s.failure;
    const absl::Time now = options_.now();
    if (!s.task_taken && now - s.started > options_.start_timeout) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the generation worker did not start within ", absl::FormatDuration(options_.start_timeout),
          "; its log: ", s.log_path));
    }
    if (s.task_taken && now - s.last_heard > options_.idle_timeout) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the generation worker sent nothing for ", absl::FormatDuration(options_.idle_timeout),
          "; its log: ", s.log_path));
    }
    if (absl::Now() >= deadline) return absl::OkStatus();
    // The process's end is polled, not signalled: look again at least every 100 ms.
    changed_.WaitWithDeadline(&mu_, std::min(deadline, absl::Now() + absl::Milliseconds(100)));
  }
}

void GenerationSessions::End(const std::string& id) {
  std::unique_ptr<Session> session;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return;
    session = std::move(it->second);
    sessions_.erase(it);
  }
  // Forgotten first, so the worker's next call finds no session and it stops.
  Session& s = *session;
  if (!s.process_ended) {
    bool ended = false;
    auto poll = [&] {
      for (const RankEnd& end : s.process->Poll()) ended = true, (void)end;
    };
    poll();
    if (!ended) {
      s.process->Terminate();
      const absl::Time give_up = absl::Now() + options_.stop_grace;
      while (!ended && absl::Now() < give_up) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        poll();
      }
      if (!ended) {
        s.process->Kill();
        s.process->AwaitKilled();
      }
    }
  }
  slots_->Return(s.slot);
}

absl::StatusOr<GenerationSessions::Session*> GenerationSessions::Authenticated(const std::string& id,
                                                                             const std::string& token) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return absl::NotFoundError(absl::StrCat("no generation session ", id));
  if (!ConstantTimeEquals(token, it->second->token)) {
    return absl::PermissionDeniedError("wrong token for this generation session");
  }
  return it->second.get();
}

absl::StatusOr<v1::GenerationTask> GenerationSessions::Task(const std::string& id, const std::string& token) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Session*> s = Authenticated(id, token);
  if (!s.ok()) return s.status();
  (*s)->task_taken = true;
  (*s)->last_heard = options_.now();
  return (*s)->task;
}

absl::StatusOr<bool> GenerationSessions::Report(const std::string& id, const std::string& token,
                                                const v1::GenerationReport& report) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Session*> found = Authenticated(id, token);
  if (!found.ok()) return found.status();
  Session& s = **found;
  if (!s.task_taken) return absl::FailedPreconditionError("report before the task was fetched");
  s.last_heard = options_.now();
  if (!report.error().empty()) {
    const auto code = static_cast<absl::StatusCode>(report.code());
    s.failure = absl::Status(code == absl::StatusCode::kOk ? absl::StatusCode::kInternal : code,
                             report.error());
  } else if (!s.finished) {
    if (report.piece().done() && report.piece().prompt_index() >= s.prompts - 1) s.finished = true;
    s.pieces.push_back(report.piece());
  }
  changed_.SignalAll();
  // A client that went away ends its session (End), so the worker's next call finds none.
  return false;
}

}  // namespace qlora::coordinator
