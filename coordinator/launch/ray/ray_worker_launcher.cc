// A job's workers as one Ray job on a Ray cluster (see ray_worker_launcher.h).
#include "coordinator/launch/ray/ray_worker_launcher.h"

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "coordinator/launch/ray/driver_log.h"

namespace qlora::coordinator {
namespace {

constexpr absl::Duration kAwaitStop = absl::Seconds(5);

// `word` quoted for a POSIX shell (Ray runs the entrypoint with one).
std::string ShellQuote(const std::string& word) {
  return absl::StrCat("'", absl::StrReplaceAll(word, {{"'", "'\\''"}}), "'");
}

// Appends `text` to the file at `path` (the coordinator's own log folder); best effort.
void AppendToFile(const std::string& path, const std::string& text) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (fd < 0) return;
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  close(fd);
}

std::string FolderOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

}  // namespace

struct RayWorkerLauncher::Start {
  // Fixed at Launch.
  std::string submission_id;
  std::string job_uid;
  std::string spec_json;             // QLORA_RAY_SPEC for the driver
  std::vector<std::string> log_paths;  // by rank
  std::string driver_log_path;
  // Guarded by the launcher's mu_.
  bool stop_requested = false;
  bool stop_sent = false;
  bool over = false;                 // every rank's end is known
  std::vector<bool> ended;           // by rank
  std::vector<RankEnd> unreported;   // for the next Poll
  absl::Time unreachable_since = absl::InfiniteFuture();
  // The launcher's thread alone.
  bool submitted = false;
  explicit Start(std::string nonce) : log(nonce), nonce(std::move(nonce)) {}
  DriverLogReader log;
  std::string nonce;                 // marks the driver's QLORA-EXIT lines (driver_log.h)
  absl::Time stop_sent_at = absl::InfiniteFuture();
  int terminal_polls = 0;            // polls that saw the job ended but could not read its log

  void End(int rank, std::string where, ExitInfo info) {
    if (rank < 0 || rank >= static_cast<int>(ended.size()) || ended[rank]) return;
    ended[rank] = true;
    unreported.push_back({rank, std::move(where), std::move(info)});
    over = std::all_of(ended.begin(), ended.end(), [](bool e) { return e; });
  }
  void EndAll(const std::string& cause) {
    for (int rank = 0; rank < static_cast<int>(ended.size()); ++rank) {
      ExitInfo info;
      info.cause = cause;
      End(rank, absl::StrCat("Ray job ", submission_id), info);
    }
  }
};

namespace {

class RayGroup : public LaunchedGroup {
 public:
  RayGroup(std::shared_ptr<RayWorkerLauncher::Start> start, absl::Mutex* mu)
      : start_(std::move(start)), mu_(mu) {}

  std::string Where(int) const override { return absl::StrCat("Ray job ", start_->submission_id); }

  std::vector<RankEnd> Poll() override {
    absl::MutexLock lock(mu_);
    std::vector<RankEnd> ends = std::move(start_->unreported);
    start_->unreported.clear();
    return ends;
  }

  void Terminate() override {
    absl::MutexLock lock(mu_);
    start_->stop_requested = true;
  }
  void Kill() override { Terminate(); }

  void AwaitKilled() override {
    absl::MutexLock lock(mu_);
    RayWorkerLauncher::Start* s = start_.get();
    mu_->AwaitWithTimeout(absl::Condition(
                              +[](RayWorkerLauncher::Start* s) { return s->stop_sent || s->over; }, s),
                          kAwaitStop);
  }

 private:
  std::shared_ptr<RayWorkerLauncher::Start> start_;
  absl::Mutex* mu_;
};

}  // namespace

RayWorkerLauncher::RayWorkerLauncher(RayLauncherOptions options)
    : options_(std::move(options)), api_(options_.address, &http_) {
  thread_ = std::thread([this] { Loop(); });
}

RayWorkerLauncher::~RayWorkerLauncher() {
  {
    absl::MutexLock lock(&mu_);
    shutdown_ = true;
  }
  thread_.join();
  // Stops asked for but not sent yet (the coordinator is stopping): one try each.
  std::vector<std::shared_ptr<Start>> left;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& s : starts_) {
      if (s->submitted && s->stop_requested && !s->stop_sent && !s->over) left.push_back(s);
    }
  }
  for (const auto& s : left) (void)api_.Stop(s->submission_id);
}

std::string RayWorkerLauncher::Describe() const { return absl::StrCat("the Ray cluster at ", api_.address()); }

LauncherCapacity RayWorkerLauncher::Capacity() const {
  absl::MutexLock lock(&mu_);
  return capacity_;
}

absl::StatusOr<std::unique_ptr<LaunchedGroup>> RayWorkerLauncher::Launch(const GroupLaunch& launch) {
  if (launch.ranks.empty()) return absl::InvalidArgumentError("a start with no ranks");
  absl::BitGen random;  // seeded from the OS's entropy
  auto start = std::make_shared<Start>(absl::StrFormat("%016x", absl::Uniform<uint64_t>(random)));
  start->submission_id = absl::StrCat("qlora-", launch.job_id, "-", launch.job_uid.substr(0, 8), "-", launch.generation);
  start->job_uid = launch.job_uid;
  nlohmann::json spec;
  spec["job_id"] = launch.job_id;
  spec["submission_id"] = start->submission_id;
  spec["nonce"] = start->nonce;
  spec["use_gpu"] = launch.use_gpu;
  spec["cpus_per_worker"] = launch.cpus_per_worker;
  spec["placement"] = EnumName(launch.placement);
  spec["placement_timeout_s"] = absl::ToDoubleSeconds(options_.placement_timeout);
  spec["stop_grace_s"] = absl::ToDoubleSeconds(options_.stop_grace);
  spec["ranks"] = nlohmann::json::array();
  for (const RankLaunch& rank : launch.ranks) {
    nlohmann::json r;
    r["rank"] = rank.rank;
    r["argv"] = rank.spec.argv;
    r["env"] = rank.spec.env;
    spec["ranks"].push_back(std::move(r));
    if (static_cast<int>(start->log_paths.size()) <= rank.rank) start->log_paths.resize(rank.rank + 1);
    start->log_paths[rank.rank] = rank.spec.log_path;
  }
  start->spec_json = spec.dump();
  start->driver_log_path = absl::StrCat(FolderOf(launch.ranks.front().spec.log_path), "/ray-driver.log");
  start->ended.assign(start->log_paths.size(), false);
  absl::MutexLock lock(&mu_);
  starts_.push_back(start);
  return std::unique_ptr<LaunchedGroup>(std::make_unique<RayGroup>(start, &mu_));
}

void RayWorkerLauncher::RefreshCapacity() {
  absl::StatusOr<LauncherCapacity> capacity = api_.Capacity();
  if (!capacity.ok()) return;  // keeps what it knew; submissions say why when they fail
  absl::MutexLock lock(&mu_);
  capacity_ = *capacity;
}

void RayWorkerLauncher::Advance(Start& start) {
  bool stop = false, stop_sent = false;
  {
    absl::MutexLock lock(&mu_);
    if (start.over) return;
    stop = start.stop_requested;
    stop_sent = start.stop_sent;
  }
  if (!start.submitted) {
    if (stop) {
      absl::MutexLock lock(&mu_);
      start.EndAll("stopped before it reached the Ray cluster");
      return;
    }
    // A coordinator that was killed may have left an earlier start of this job running.
    if (absl::StatusOr<std::vector<RayJobInfo>> jobs = api_.List(); jobs.ok()) {
      for (const RayJobInfo& job : *jobs) {
        auto uid = job.metadata.find("qlora_job_uid");
        if (uid != job.metadata.end() && uid->second == start.job_uid && !job.terminal() &&
            job.submission_id != start.submission_id) {
          (void)api_.Stop(job.submission_id);
        }
      }
    }
    RaySubmission submission;
    submission.submission_id = start.submission_id;
    submission.entrypoint = absl::StrCat(ShellQuote(options_.python), " ", ShellQuote(options_.launcher_script));
    // Ray's stop waits RAY_JOB_STOP_WAIT_TIME_S (3 s by default) before it kills the driver; the
    // driver needs the ranks' grace and a little more to report their ends.
    submission.env_vars = {{"QLORA_RAY_SPEC", start.spec_json}, {"RAY_DEDUP_LOGS", "0"},
                           {"RAY_JOB_STOP_WAIT_TIME_S",
                            absl::StrCat(static_cast<int>(absl::ToDoubleSeconds(options_.stop_grace)) + 5)}};
    submission.metadata = {{"qlora_job_uid", start.job_uid}, {"qlora_submission", start.submission_id}};
    if (absl::Status submitted = api_.Submit(submission); !submitted.ok()) {
      absl::MutexLock lock(&mu_);
      start.EndAll(absl::StrCat("could not start on the Ray cluster: ", submitted.message()));
      return;
    }
    start.submitted = true;
  }
  if (stop && !stop_sent && api_.Stop(start.submission_id).ok()) {
    absl::MutexLock lock(&mu_);
    start.stop_sent = true;
    start.stop_sent_at = absl::Now();
  }
  // A Ray job that never ends after its stop (its supervisor lost): its ranks count as ended, or
  // the job's restart would wait for them forever.
  if (absl::Now() - start.stop_sent_at > options_.stop_grace + options_.unreachable_timeout) {
    absl::MutexLock lock(&mu_);
    start.EndAll(absl::StrCat("the Ray job ", start.submission_id, " did not end within ",
                              absl::FormatDuration(options_.stop_grace + options_.unreachable_timeout),
                              " of its stop"));
    return;
  }
  absl::StatusOr<RayJobInfo> info = api_.Get(start.submission_id);
  if (!info.ok()) {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    if (absl::IsNotFound(info.status())) {
      start.EndAll(absl::StrCat("the Ray job ", start.submission_id, " is gone from the cluster (was its head restarted?)"));
    } else if (start.unreachable_since == absl::InfiniteFuture()) {
      start.unreachable_since = now;
    } else if (now - start.unreachable_since > options_.unreachable_timeout) {
      start.EndAll(absl::StrCat("no answer from the Ray cluster for ", absl::FormatDuration(options_.unreachable_timeout),
                                ": ", info.status().message()));
    }
    return;
  }
  // The status first, then the log: once the job has ended its log holds every end it reported.
  DriverLogNews news;
  absl::StatusOr<std::string> log = api_.Logs(start.submission_id);
  if (log.ok()) news = start.log.Feed(*log);
  // An ended job's log holds the ranks' real ends: read it before giving them a generic cause
  // (a few polls at most).
  if (info->terminal() && !log.ok() && ++start.terminal_polls < 5) return;
  std::map<int, std::string> output;
  for (auto& [rank, line] : news.output) {
    if (rank < static_cast<int>(start.log_paths.size())) output[rank] += line;
  }
  for (const auto& [rank, text] : output) AppendToFile(start.log_paths[rank], text);
  std::string driver;
  for (const std::string& line : news.driver_lines) absl::StrAppend(&driver, line, "\n");
  if (!driver.empty()) AppendToFile(start.driver_log_path, driver);
  absl::MutexLock lock(&mu_);
  start.unreachable_since = absl::InfiniteFuture();
  for (RankEnd& end : news.ends) {
    if (end.rank == -1) {
      start.EndAll(end.info.cause);
    } else {
      start.End(end.rank, end.where, end.info);
    }
  }
  if (info->terminal()) {
    start.EndAll(absl::StrCat("the Ray job ", start.submission_id, " ended (", info->status,
                              info->message.empty() ? "" : absl::StrCat(": ", info->message),
                              ") before this rank's end was reported"));
  }
}

void RayWorkerLauncher::Loop() {
  RefreshCapacity();
  absl::Time next_capacity = absl::Now() + options_.capacity_refresh;
  while (true) {
    std::vector<std::shared_ptr<Start>> snapshot;
    {
      absl::MutexLock lock(&mu_);
      if (shutdown_) return;
      snapshot = starts_;
    }
    for (const auto& start : snapshot) {
      {
        absl::MutexLock lock(&mu_);
        if (shutdown_) return;
      }
      Advance(*start);
    }
    if (absl::Now() >= next_capacity) {
      RefreshCapacity();
      next_capacity = absl::Now() + options_.capacity_refresh;
    }
    snapshot.clear();
    absl::MutexLock lock(&mu_);
    // A start is forgotten once every rank's end is known and its group is gone.
    starts_.erase(std::remove_if(starts_.begin(), starts_.end(),
                                 [](const std::shared_ptr<Start>& s) { return s->over && s.use_count() == 1; }),
                  starts_.end());
    mu_.AwaitWithTimeout(absl::Condition(&shutdown_), options_.poll_interval);
  }
}

}  // namespace qlora::coordinator
