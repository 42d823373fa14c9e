// JobManager driven by hand: a real SQLite store and real job files and datasets, with a fake
// launcher (the test decides when and how each worker process ends) and a fake clock (deadlines
// pass without waiting). PollOnce stands in for the monitor thread.
#include "coordinator/jobs/job_manager.h"

#include <fcntl.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/test_util.h"

namespace qlora::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing::TempDir;
using testing::WriteFile;

// Worker processes as table entries. SIGKILL ends one at once (nothing can ignore it); other
// signals are only recorded, and End() decides how a process ends.
class FakeLauncher : public ProcessLauncher {
 public:
  struct Launched {
    pid_t pid;
    LaunchSpec spec;
  };

  absl::StatusOr<pid_t> Launch(const LaunchSpec& spec) override {
    absl::MutexLock lock(&mu_);
    if (fail_launches_) return absl::ResourceExhaustedError("fork: no more processes");
    const pid_t pid = next_pid_++;
    launched_.push_back({pid, spec});
    return pid;
  }
  std::optional<ExitInfo> Poll(pid_t pid) override {
    absl::MutexLock lock(&mu_);
    if (reaped_.count(pid)) return ExitInfo{false, -1};  // as waitpid: no such child
    auto it = ended_.find(pid);
    if (it == ended_.end()) return std::nullopt;
    reaped_.insert(pid);
    return it->second;
  }
  void Signal(pid_t pid, int signal) override {
    absl::MutexLock lock(&mu_);
    signals_[pid].push_back(signal);
    if (signal == SIGKILL) ended_.emplace(pid, ExitInfo{true, SIGKILL});
  }

  void End(pid_t pid, ExitInfo info) {
    absl::MutexLock lock(&mu_);
    ended_.emplace(pid, info);
  }
  void FailLaunches() {
    absl::MutexLock lock(&mu_);
    fail_launches_ = true;
  }
  std::vector<Launched> launched() const {
    absl::MutexLock lock(&mu_);
    return launched_;
  }
  std::vector<int> SignalsTo(pid_t pid) const {
    absl::MutexLock lock(&mu_);
    auto it = signals_.find(pid);
    return it == signals_.end() ? std::vector<int>{} : it->second;
  }

 private:
  mutable absl::Mutex mu_;
  pid_t next_pid_ = 1000;
  bool fail_launches_ = false;
  std::vector<Launched> launched_;
  std::map<pid_t, ExitInfo> ended_;
  std::set<pid_t> reaped_;
  std::map<pid_t, std::vector<int>> signals_;
};

class FakeClock {
 public:
  absl::Time Now() const {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ = absl::FromUnixSeconds(1700000000);
};

// One launched worker, read back from its command line.
struct WorkerHandle {
  pid_t pid = 0;
  int rank = -1;
  std::string token;
  LaunchSpec spec;
};

std::string ArgAfter(const std::vector<std::string>& argv, const std::string& flag) {
  for (size_t i = 0; i + 1 < argv.size(); ++i) {
    if (argv[i] == flag) return argv[i + 1];
  }
  return "";
}

class CoordinatorJobManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteFile(dir_.path() + "/model/config.json", "{}\n");
    std::string records;
    for (int i = 0; i < 40; ++i) {
      records += absl::StrCat(R"({"instruction": "Add )", i, R"( and 1.", "output": ")", i + 1, "\"}\n");
    }
    train_path_ = WriteFile(dir_.path() + "/train.jsonl", records);
    std::filesystem::create_directories(state_dir());
  }

  std::string state_dir() const { return dir_.path() + "/state"; }

  JobManagerOptions Options(int cpu_workers, std::vector<int> gpus = {}) {
    JobManagerOptions o;
    o.state_dir = state_dir();
    o.worker_binary = "/opt/qlora/qlora-worker";
    o.cpu_workers = cpu_workers;
    o.gpus = std::move(gpus);
    o.register_timeout = absl::Minutes(5);
    o.heartbeat_timeout = absl::Minutes(2);
    o.stop_grace = absl::Seconds(3);
    o.default_max_restarts = 0;  // a failure fails the job; the restart tests ask for more
    o.restart_backoff = absl::Seconds(5);
    o.now = [this] { return clock_.Now(); };
    return o;
  }

  // A manager on the store in state_dir(), loaded, driven by PollOnce.
  void Start(JobManagerOptions options, const JobStoreOptions& store_options = {}) {
    manager_.reset();
    store_.reset();
    absl::StatusOr<std::unique_ptr<JobStore>> store =
        JobStore::Open(state_dir() + "/jobs.sqlite", store_options);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    manager_ = std::make_unique<JobManager>(std::move(options), store_.get(), &launcher_);
    ASSERT_TRUE(manager_->Load().ok());
    manager_->SetCoordinatorAddress("127.0.0.1:7777");
  }

  SubmitRequest Job(int workers, const std::string& dataset = "") {
    SubmitRequest r;
    r.job_yaml = absl::StrCat(R"(model_type: llm
base_model: )", dir_.path(), R"(/model
input_features: [{name: instruction, type: text}]
output_features: [{name: output, type: text}]
adapter: {type: lora}
backend: {type: local, trainer: {num_workers: )", workers, R"(}}
trainer: {type: finetune, batch_size: 1}
)");
    r.dataset = dataset.empty() ? train_path_ : dataset;
    return r;
  }

  std::string Submit(int workers) {
    absl::StatusOr<JobRecord> job = manager_->Submit(Job(workers));
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->id : "";
  }

  // Every job (one page of up to 1000).
  std::vector<JobRecord> AllJobs() {
    std::string next;
    absl::StatusOr<std::vector<JobRecord>> jobs = manager_->List({}, std::nullopt, 1000, "", &next);
    EXPECT_TRUE(jobs.ok()) << jobs.status();
    return jobs.ok() ? *jobs : std::vector<JobRecord>{};
  }

  JobRecord Record(const std::string& id) {
    absl::StatusOr<JobRecord> job = manager_->Get(id);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : JobRecord{};
  }

  // The workers launched for `job_id`, in launch order.
  std::vector<WorkerHandle> Workers(const std::string& job_id) const {
    std::vector<WorkerHandle> out;
    for (const FakeLauncher::Launched& l : launcher_.launched()) {
      if (ArgAfter(l.spec.argv, "--job") != job_id) continue;
      out.push_back({l.pid, std::stoi(ArgAfter(l.spec.argv, "--rank")), l.spec.env.at(kWorkerTokenVariable), l.spec});
    }
    return out;
  }

  void RegisterAll(const std::string& job_id) {
    for (const WorkerHandle& w : Workers(job_id)) {
      ASSERT_TRUE(manager_->Register(job_id, w.token, w.rank, w.pid).ok());
    }
  }

  // Submits a job of `workers` CPU workers and takes it to RUNNING.
  std::string RunningJob(int workers) {
    const std::string id = Submit(workers);
    manager_->PollOnce();
    RegisterAll(id);
    EXPECT_EQ(Record(id).state, JobState::kRunning);
    return id;
  }

  TempDir dir_;
  std::string train_path_;
  FakeClock clock_;
  FakeLauncher launcher_;
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<JobManager> manager_;  // destroyed first: it stops its workers
};

TEST_F(CoordinatorJobManagerTest, JobStartsOneWorkerPerSlotAndRunsOnceAllRegister) {
  Start(Options(2));
  const std::string id = Submit(2);
  EXPECT_EQ(id, "job-000001");
  EXPECT_EQ(Record(id).state, JobState::kQueued);
  EXPECT_EQ(Record(id).reason_code, "SUBMITTED");
  EXPECT_THAT(Workers(id), IsEmpty());  // only a scheduling pass starts workers

  manager_->PollOnce();
  std::vector<WorkerHandle> workers = Workers(id);
  ASSERT_EQ(workers.size(), 2u);
  EXPECT_EQ(workers[0].rank, 0);
  EXPECT_EQ(workers[1].rank, 1);
  EXPECT_NE(workers[0].token, workers[1].token);
  EXPECT_EQ(ArgAfter(workers[0].spec.argv, "--coordinator"), "127.0.0.1:7777");
  EXPECT_EQ(workers[1].spec.log_path, state_dir() + "/jobs/job-000001/logs/rank-1.log");
  EXPECT_EQ(*manager_->LogPath(id, 1), workers[1].spec.log_path);
  EXPECT_EQ(Record(id).state, JobState::kStarting);

  // Authentication: the job, the token and the rank must match.
  EXPECT_EQ(manager_->Register("job-000099", workers[0].token, 0, 1).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(manager_->Register(id, "forged", 0, 1).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(manager_->Register(id, workers[0].token, 1, 1).code(), absl::StatusCode::kInvalidArgument);

  ASSERT_TRUE(manager_->Register(id, workers[0].token, 0, workers[0].pid).ok());
  EXPECT_EQ(manager_->Register(id, workers[0].token, 0, workers[0].pid).code(),
            absl::StatusCode::kPermissionDenied) << "a startup token is single-use";
  EXPECT_EQ(Record(id).state, JobState::kStarting);
  ASSERT_TRUE(manager_->Register(id, workers[1].token, 1, workers[1].pid).ok());
  EXPECT_EQ(Record(id).state, JobState::kRunning);
  EXPECT_EQ(Record(id).reason_code, "ALL_WORKERS_REGISTERED");

  absl::StatusOr<WorkerAssignment> a = manager_->GetAssignment(id, workers[1].token, absl::Now());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->job_id, id);
  EXPECT_EQ(a->rank, 1);
  EXPECT_EQ(a->world_size, 2);
  EXPECT_EQ(a->device, DeviceKind::kCpu);
  EXPECT_EQ(a->resolved_config_yaml, Record(id).resolved_config_yaml);
  EXPECT_EQ(a->output_dir, state_dir() + "/jobs/job-000001/output");
  EXPECT_EQ(a->job_uid, Record(id).uid);
  EXPECT_EQ(a->job_uid.size(), 32u);
  EXPECT_FALSE(a->train_shards.empty());
  EXPECT_EQ(a->train_shards[0].path, train_path_);
  EXPECT_TRUE(a->nccl_unique_id.empty());
  // The store of this generation works; another generation is refused.
  ASSERT_TRUE(manager_->StoreSet(id, workers[0].token, a->generation, "k", "v").ok());
  EXPECT_EQ(*manager_->StoreGet(id, workers[1].token, a->generation, "k", absl::Now()), "v");
  EXPECT_EQ(manager_->StoreSet(id, workers[0].token, a->generation + 1, "k", "v").code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(CoordinatorJobManagerTest, ListPagesInSubmissionOrderAndFiltersByState) {
  Start(Options(1));
  std::vector<std::string> ids;
  for (int i = 0; i < 7; ++i) ids.push_back(Submit(1));
  manager_->PollOnce();  // the first starts; the others wait
  std::vector<std::string> seen;
  std::string token;
  int pages = 0;
  do {
    std::string next;
    auto page = manager_->List({}, std::nullopt, 3, token, &next);
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_LE(page->size(), 3u);
    for (const JobRecord& r : *page) seen.push_back(r.id);
    token = next;
    ++pages;
  } while (!token.empty());
  EXPECT_EQ(seen, ids);
  EXPECT_EQ(pages, 3);
  std::string next;
  auto queued = manager_->List({JobState::kQueued}, std::nullopt, 100, "", &next);
  ASSERT_TRUE(queued.ok());
  EXPECT_EQ(queued->size(), 6u);
  EXPECT_EQ(next, "");
  EXPECT_EQ(manager_->List({}, std::nullopt, 3, "job-999999", &next).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorJobManagerTest, JobsRecordTheirOwnerAndListFiltersByOwner) {
  Start(Options(1));
  for (const char* owner : {"alice", "bob", "alice"}) {
    SubmitRequest r = Job(1);
    r.owner = owner;
    ASSERT_TRUE(manager_->Submit(r).ok());
  }
  std::string next;
  absl::StatusOr<std::vector<JobRecord>> mine = manager_->List({}, "alice", 100, "", &next);
  ASSERT_TRUE(mine.ok()) << mine.status();
  ASSERT_EQ(mine->size(), 2u);
  EXPECT_EQ((*mine)[0].owner, "alice");
  EXPECT_EQ((*mine)[1].id, "job-000003");
  EXPECT_EQ(manager_->List({}, "carol", 100, "", &next)->size(), 0u);
  // The owner survives a restart (it is in the store).
  Start(Options(1));
  EXPECT_EQ(manager_->Get("job-000002")->owner, "bob");
}

TEST_F(CoordinatorJobManagerTest, PathsOutsideTheConfiguredRootsAreRefusedAtSubmit) {
  JobManagerOptions options = Options(1);
  absl::StatusOr<PathRoots> roots = ResolvePathRoots(dir_.path() + "/model", "");
  ASSERT_TRUE(roots.ok()) << roots.status();
  options.roots = *roots;  // the model may be read, the dataset beside it not
  Start(options);
  absl::StatusOr<JobRecord> job = manager_->Submit(Job(1));
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(job.status().message()), HasSubstr("dataset: " + train_path_));
  EXPECT_THAT(AllJobs(), IsEmpty());
  options.roots.read.push_back(dir_.path());
  Start(options);
  absl::StatusOr<JobRecord> accepted = manager_->Submit(Job(1));
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  // The start's planner reads the dataset through a descriptor opened beneath the roots; the
  // worker is still given the file by the job's name.
  manager_->PollOnce();
  RegisterAll(accepted->id);
  const WorkerHandle w = Workers(accepted->id).at(0);
  absl::StatusOr<WorkerAssignment> assignment =
      manager_->GetAssignment(accepted->id, w.token, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(assignment.ok()) << assignment.status();
  ASSERT_FALSE(assignment->train_shards.empty());
  for (const data::ShardSpec& shard : assignment->train_shards) EXPECT_EQ(shard.path, train_path_);
}

// Nothing outside the read roots is looked at before the check: a missing and an existing file
// outside them get the same answer (no existence oracle), and so does a model folder.
TEST_F(CoordinatorJobManagerTest, PathsOutsideTheRootsAreRefusedBeforeTheyAreLookedAt) {
  JobManagerOptions options = Options(1);
  absl::StatusOr<PathRoots> roots = ResolvePathRoots(dir_.path() + "/model", "");
  ASSERT_TRUE(roots.ok()) << roots.status();
  options.roots = *roots;
  Start(options);
  for (const std::string& dataset : {train_path_, dir_.path() + "/no-such-file.jsonl"}) {
    absl::StatusOr<JobRecord> job = manager_->Submit(Job(1, dataset));
    EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument) << dataset;
    EXPECT_THAT(std::string(job.status().message()),
                HasSubstr("dataset: " + dataset + " lies outside"));
    // The root, resolved and as written the same, is listed once.
    EXPECT_THAT(std::string(job.status().message()),
                HasSubstr("(--read-roots " + dir_.path() + "/model)"));
  }
  SubmitRequest model_outside = Job(1);
  absl::StrReplaceAll({{"base_model: " + dir_.path() + "/model", "base_model: /etc"}},
                      &model_outside.job_yaml);
  model_outside.dataset = dir_.path() + "/model/config.json";
  absl::StatusOr<JobRecord> job = manager_->Submit(model_outside);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(job.status().message()), HasSubstr("base_model: /etc lies outside"));
}

// A dataset swapped for a link leading out of the roots between submit and start: the start's
// planner refuses it when it opens it (the job fails naming it; nothing outside was read).
TEST_F(CoordinatorJobManagerTest, ADatasetSwappedForALinkOutAfterSubmitFailsTheStart) {
  JobManagerOptions options = Options(1);
  absl::StatusOr<PathRoots> roots = ResolvePathRoots(dir_.path(), "");
  ASSERT_TRUE(roots.ok()) << roots.status();
  options.roots = *roots;
  Start(options);
  const std::string id = Submit(1);
  TempDir elsewhere;
  const std::string secret = WriteFile(elsewhere.path() + "/secret.jsonl", "{\"instruction\": \"s\"}\n");
  std::filesystem::remove(train_path_);
  std::filesystem::create_symlink(secret, train_path_);
  manager_->PollOnce();
  const JobRecord r = Record(id);
  EXPECT_EQ(r.state, JobState::kFailed);
  EXPECT_THAT(r.message, HasSubstr("leads out of the folders this coordinator reads"));
  EXPECT_THAT(launcher_.launched(), IsEmpty());
}

TEST_F(CoordinatorJobManagerTest, EveryJobHasItsOwnUidKeptAcrossRestarts) {
  Start(Options(1));
  const std::string first = Submit(1), second = Submit(1);
  const std::string uid = Record(first).uid;
  EXPECT_EQ(uid.size(), 32u);
  EXPECT_NE(uid, Record(second).uid);
  Start(Options(1));
  EXPECT_EQ(Record(first).uid, uid);
}

TEST_F(CoordinatorJobManagerTest, PerUserQueueCapRefusesOnlyThatUser) {
  JobManagerOptions options = Options(1);
  options.max_queued_jobs_per_user = 2;
  Start(options);
  auto submit_as = [&](const char* owner) {
    SubmitRequest r = Job(1);
    r.owner = owner;
    return manager_->Submit(r);
  };
  ASSERT_TRUE(submit_as("alice").ok());
  ASSERT_TRUE(submit_as("alice").ok());
  absl::StatusOr<JobRecord> third = submit_as("alice");
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(third.status().message()), HasSubstr("--max-queued-jobs-per-user"));
  EXPECT_TRUE(submit_as("bob").ok()) << "another user's jobs are not counted against alice";
  manager_->PollOnce();  // alice's first job starts: she may queue one more
  EXPECT_TRUE(submit_as("alice").ok());
}

// A store lost (or replaced) while the jobs' folders stay: the next job must not take an old
// job's id, hence its folder, and resume its checkpoints or overwrite its adapter.
TEST_F(CoordinatorJobManagerTest, JobIdsNeverReuseTheFolderOfAJobTheStoreForgot) {
  std::filesystem::create_directories(state_dir() + "/jobs/job-000007/output/checkpoints");
  std::filesystem::create_directories(state_dir() + "/jobs/job-000003");
  std::filesystem::create_directories(state_dir() + "/jobs/job-00009x");  // not a job folder
  Start(Options(1));  // an empty store
  EXPECT_EQ(Submit(1), "job-000008");
}

TEST_F(CoordinatorJobManagerTest, SubmissionsPastTheQueueLimitAreRefusedAndNotStored) {
  JobManagerOptions options = Options(1);
  options.max_queued_jobs = 3;
  Start(options);
  for (int i = 0; i < 3; ++i) Submit(1);
  absl::StatusOr<JobRecord> fourth = manager_->Submit(Job(1));
  ASSERT_FALSE(fourth.ok());
  EXPECT_EQ(fourth.status().code(), absl::StatusCode::kResourceExhausted) << fourth.status();
  EXPECT_THAT(std::string(fourth.status().message()), HasSubstr("--max-queued-jobs"));
  EXPECT_EQ(AllJobs().size(), 3u);
  manager_->PollOnce();  // the first job starts: the queue has room again
  EXPECT_TRUE(manager_->Submit(Job(1)).ok());
}

TEST_F(CoordinatorJobManagerTest, AJobsOutputFolderIsItsOwn) {
  Start(Options(1));
  auto with_output = [&](const std::string& dir) {
    SubmitRequest r = Job(1);
    r.job_yaml += "output_dir: " + dir + "\n";
    return manager_->Submit(r);
  };
  auto refused = [&](const std::string& dir, const std::string& why) {
    absl::StatusOr<JobRecord> job = with_output(dir);
    ASSERT_FALSE(job.ok()) << dir << " was accepted";
    EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument) << job.status();
    EXPECT_THAT(std::string(job.status().message()), HasSubstr("output_dir")) << job.status();
    EXPECT_THAT(std::string(job.status().message()), HasSubstr(why)) << job.status();
  };
  refused(state_dir(), "state folder");
  refused(state_dir() + "/jobs/job-000001/output", "state folder");  // another job's default
  refused(dir_.path(), "state folder");                                // holds the state folder
  std::filesystem::create_directory_symlink(state_dir() + "/jobs", dir_.path() + "/link");
  refused(dir_.path() + "/link/x", "state folder");  // a symbolic link does not hide it
  std::filesystem::create_directories(dir_.path() + "/full");
  WriteFile(dir_.path() + "/full/someone-elses.txt", "precious");
  refused(dir_.path() + "/full", "not empty");
  absl::StatusOr<JobRecord> first = with_output(dir_.path() + "/runs/a");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->output_dir, dir_.path() + "/runs/a");
  refused(dir_.path() + "/runs/a", "another job");
  refused(dir_.path() + "/runs/a/inner", "another job");
  refused(dir_.path() + "/runs", "another job");
  EXPECT_TRUE(with_output(dir_.path() + "/runs/b").ok());
  EXPECT_EQ(AllJobs().size(), 2u) << "nothing refused was stored";
}

TEST_F(CoordinatorJobManagerTest, JobAskingForMoreWorkersThanSlotsIsRefusedAndNotStored) {
  Start(Options(2));
  absl::StatusOr<std::string> resolved = manager_->Validate(Job(2));
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_THAT(*resolved, HasSubstr(train_path_));
  absl::StatusOr<JobRecord> job = manager_->Submit(Job(3));
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(job.status().message(), HasSubstr("backend.trainer.num_workers"));
  std::string next;
  EXPECT_THAT(*manager_->List({}, std::nullopt, 100, "", &next), IsEmpty());
  EXPECT_THAT(*store_->LoadJobs(), IsEmpty());
}

// A worker's startup token, read from its environment by someone with the worker's rights, must
// not turn a running job into a success with an adapter of the replayer's choosing (issue 58:
// `adapterPath: /etc/passwd` made a job at step 80 of 400 SUCCEEDED): a completion naming any
// output but the planned ones is refused and changes nothing, and once a rank has completed its
// token is spent for every call.
TEST_F(CoordinatorJobManagerTest, ACompletionMustNameThePlannedOutputsAndSpendsTheToken) {
  Start(Options(2));
  const std::string id = Submit(2);
  manager_->PollOnce();
  RegisterAll(id);
  const std::vector<WorkerHandle> w = Workers(id);
  ASSERT_EQ(w.size(), 2u);
  const std::string output = Record(id).output_dir;
  for (const std::string& forged :
       {std::string("/etc/passwd"), output + "/../adapter", output + "/adapter/../../x"}) {
    const absl::Status refused =
        manager_->ReportCompletion(id, w[0].token, {.ok = true, .adapter_path = forged});
    EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied) << forged;
    EXPECT_THAT(refused.message(), HasSubstr("outside the job's output folder")) << forged;
  }
  EXPECT_EQ(manager_->ReportCompletion(id, w[0].token, {.ok = true, .adapter_path = output + "/adapter",
                                                        .merged_path = "/tmp/merged"})
                .code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Record(id).state, JobState::kRunning);
  EXPECT_EQ(Record(id).adapter_path, "");

  ASSERT_TRUE(manager_->ReportCompletion(id, w[1].token, {.ok = true}).ok());
  // Rank 1 is done: its token is spent, for progress, heartbeats and completions alike.
  EXPECT_EQ(manager_->ReportProgress(id, w[1].token, ProgressSnapshot{}).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(manager_->Heartbeat(id, w[1].token).status().code(), absl::StatusCode::kPermissionDenied);
  const absl::Status replayed = manager_->ReportCompletion(id, w[1].token, {.ok = true});
  EXPECT_EQ(replayed.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(replayed.message(), HasSubstr("its startup token is spent"));
  EXPECT_NE(Record(id).state, JobState::kSucceeded);

  ASSERT_TRUE(manager_->ReportCompletion(id, w[0].token, {.ok = true, .adapter_path = output + "/adapter"}).ok());
  EXPECT_EQ(Record(id).state, JobState::kSucceeded);
  EXPECT_EQ(Record(id).adapter_path, output + "/adapter");
}

TEST_F(CoordinatorJobManagerTest, QueueIsStrictFifoAndWorkersAreFreeOnlyOnceTheirProcessEnds) {
  Start(Options(2));
  const std::string a = Submit(1);
  manager_->PollOnce();
  const std::string b = Submit(2);
  const std::string c = Submit(1);  // would fit in the free slot, but b is older
  manager_->PollOnce();
  EXPECT_EQ(Record(a).state, JobState::kStarting);
  EXPECT_EQ(Record(b).state, JobState::kQueued);
  EXPECT_EQ(Record(b).reason_code, "WAITING_FOR_WORKERS");
  EXPECT_EQ(Record(b).message, "waiting for workers: needs 2, 1 of 2 free (held by job-000001)");
  EXPECT_EQ(Record(c).state, JobState::kQueued);
  EXPECT_THAT(Workers(c), IsEmpty());
  EXPECT_EQ(launcher_.launched().size(), 1u);

  // a succeeds, but its worker process has not ended: it still holds its slot.
  RegisterAll(a);
  const WorkerHandle wa = Workers(a)[0];
  const std::string adapter = Record(a).output_dir + "/adapter";
  ASSERT_TRUE(manager_->ReportCompletion(a, wa.token, {.ok = true, .adapter_path = adapter}).ok());
  EXPECT_EQ(Record(a).state, JobState::kSucceeded);
  EXPECT_EQ(Record(a).adapter_path, adapter);
  manager_->PollOnce();
  EXPECT_EQ(Record(b).state, JobState::kQueued);
  EXPECT_THAT(Workers(b), IsEmpty());

  launcher_.End(wa.pid, ExitInfo{false, 0});
  manager_->PollOnce();
  EXPECT_EQ(Record(a).state, JobState::kSucceeded);  // a clean exit after completing
  EXPECT_EQ(Record(b).state, JobState::kStarting);
  EXPECT_EQ(Workers(b).size(), 2u);
  EXPECT_EQ(Record(c).state, JobState::kQueued);
  EXPECT_EQ(Record(c).message, "waiting for workers: needs 1, 0 of 2 free (held by job-000002)");
}

TEST_F(CoordinatorJobManagerTest, WorkerExitFailsTheJobNamingTheRankAndStopsTheOthers) {
  Start(Options(2));
  const std::string id = RunningJob(2);
  std::vector<WorkerHandle> workers = Workers(id);
  absl::StatusOr<WorkerAssignment> a = manager_->GetAssignment(id, workers[0].token, absl::Now());
  ASSERT_TRUE(a.ok()) << a.status();
  launcher_.End(workers[1].pid, ExitInfo{true, SIGSEGV});
  manager_->PollOnce();
  const JobRecord job = Record(id);
  EXPECT_EQ(job.state, JobState::kFailed);
  EXPECT_EQ(job.reason_code, "WORKER_EXITED");
  EXPECT_THAT(job.message, HasSubstr(absl::StrCat("rank 1 (pid ", workers[1].pid, ") ended with signal 11")));
  EXPECT_THAT(job.message, HasSubstr("qloractl logs job-000001 --rank 1"));
  EXPECT_THAT(launcher_.SignalsTo(workers[0].pid), ElementsAre(SIGTERM));
  EXPECT_THAT(launcher_.SignalsTo(workers[1].pid), IsEmpty());  // it had ended already
  // The surviving rank hears it at its next heartbeat; a store wait ends at once.
  EXPECT_TRUE(*manager_->Heartbeat(id, workers[0].token));
  absl::StatusOr<std::string> got =
      manager_->StoreGet(id, workers[0].token, a->generation, "never-set", absl::Now() + absl::Seconds(60));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(got.status().message(), "job job-000001 has ended");
}

TEST_F(CoordinatorJobManagerTest, FailedWorkerRestartsTheJobAsANewGenerationAfterTheBackoff) {
  JobManagerOptions options = Options(2);
  options.default_max_restarts = 2;
  Start(options);
  const std::string id = RunningJob(2);
  const std::vector<WorkerHandle> first = Workers(id);
  launcher_.End(first[1].pid, ExitInfo{true, SIGKILL});
  manager_->PollOnce();
  JobRecord job = Record(id);
  EXPECT_EQ(job.state, JobState::kQueued);
  EXPECT_EQ(job.reason_code, "RESTARTING");
  EXPECT_THAT(job.message, HasSubstr("restart 1 of 2 in 5s"));
  EXPECT_THAT(job.message, HasSubstr("rank 1"));
  EXPECT_EQ(job.restarts, 1);
  ASSERT_EQ(job.restart_causes.size(), 1u);
  EXPECT_THAT(launcher_.SignalsTo(first[0].pid), ElementsAre(SIGTERM));  // the survivor is stopped
  // Not before its old workers are gone and the backoff has passed.
  manager_->PollOnce();
  EXPECT_EQ(Workers(id).size(), 2u);
  launcher_.End(first[0].pid, ExitInfo{true, SIGTERM});
  clock_.Advance(absl::Seconds(4));
  manager_->PollOnce();
  EXPECT_EQ(Workers(id).size(), 2u) << "started before the backoff passed";
  clock_.Advance(absl::Seconds(2));
  manager_->PollOnce();
  const std::vector<WorkerHandle> all = Workers(id);
  ASSERT_EQ(all.size(), 4u) << "a new generation of both ranks";
  EXPECT_EQ(Record(id).state, JobState::kStarting);
  // The old generation's tokens are refused; the new ones work, and resume the same job.
  EXPECT_EQ(manager_->Register(id, first[0].token, 0, first[0].pid).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_FALSE(manager_->Heartbeat(id, first[0].token).ok());
  for (int i = 2; i < 4; ++i) ASSERT_TRUE(manager_->Register(id, all[i].token, all[i].rank, all[i].pid).ok());
  EXPECT_EQ(Record(id).state, JobState::kRunning);
  absl::StatusOr<WorkerAssignment> a = manager_->GetAssignment(id, all[2].token, absl::Now());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->job_uid, Record(id).uid);  // so it finds its checkpoints
}

TEST_F(CoordinatorJobManagerTest, RestartsRunOutAndTheFailureNamesEveryCause) {
  JobManagerOptions options = Options(1);
  options.default_max_restarts = 1;
  Start(options);
  const std::string id = RunningJob(1);
  launcher_.End(Workers(id)[0].pid, ExitInfo{true, SIGSEGV});
  manager_->PollOnce();
  EXPECT_EQ(Record(id).state, JobState::kQueued);
  clock_.Advance(absl::Seconds(5));
  manager_->PollOnce();
  ASSERT_EQ(Workers(id).size(), 2u);
  const WorkerHandle second = Workers(id)[1];
  ASSERT_TRUE(manager_->Register(id, second.token, 0, second.pid).ok());
  launcher_.End(second.pid, ExitInfo{true, SIGBUS});
  manager_->PollOnce();
  const JobRecord job = Record(id);
  EXPECT_EQ(job.state, JobState::kFailed);
  EXPECT_THAT(job.message, HasSubstr("signal 7"));   // the last cause
  EXPECT_THAT(job.message, HasSubstr("gave up after 1 restart(s)"));
  EXPECT_THAT(job.message, HasSubstr("signal 11"));  // the earlier one
  // The count and the causes are in the store.
  Start(options);
  EXPECT_EQ(Record(id).restarts, 1);
  EXPECT_EQ(Record(id).restart_causes.size(), 1u);
}

TEST_F(CoordinatorJobManagerTest, CancelDuringTheBackoffEndsTheJobAtOnce) {
  JobManagerOptions options = Options(1);
  options.default_max_restarts = 2;
  Start(options);
  const std::string id = RunningJob(1);
  launcher_.End(Workers(id)[0].pid, ExitInfo{true, SIGKILL});
  manager_->PollOnce();
  ASSERT_EQ(Record(id).reason_code, "RESTARTING");
  ASSERT_TRUE(manager_->Cancel(id).ok());
  EXPECT_EQ(Record(id).state, JobState::kCancelled);
  clock_.Advance(absl::Minutes(1));
  manager_->PollOnce();
  EXPECT_EQ(Workers(id).size(), 1u) << "a cancelled job was started again";
}

TEST_F(CoordinatorJobManagerTest, AFailureThatWouldRepeatIsNotRetried) {
  JobManagerOptions options = Options(1);
  options.default_max_restarts = 3;
  Start(options);
  const std::string id = RunningJob(1);
  const WorkerHandle w = Workers(id)[0];
  ASSERT_TRUE(manager_->ReportCompletion(id, w.token, FailedCompletion(absl::InvalidArgumentError("bad record"))).ok());
  EXPECT_EQ(Record(id).state, JobState::kFailed);
  EXPECT_THAT(Record(id).message, HasSubstr("not retried"));
  EXPECT_EQ(Record(id).restarts, 0);
}

TEST_F(CoordinatorJobManagerTest, TheJobFileCanTurnRestartsOff) {
  JobManagerOptions options = Options(1);
  options.default_max_restarts = 3;
  Start(options);
  SubmitRequest r = Job(1);
  r.job_yaml = absl::StrReplaceAll(r.job_yaml, {{"batch_size: 1}", "batch_size: 1, max_restarts: 0}"}});
  absl::StatusOr<JobRecord> submitted = manager_->Submit(r);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  EXPECT_THAT(submitted->resolved_config_yaml, HasSubstr("max_restarts: 0"));
  manager_->PollOnce();
  RegisterAll(submitted->id);
  launcher_.End(Workers(submitted->id)[0].pid, ExitInfo{true, SIGKILL});
  manager_->PollOnce();
  EXPECT_EQ(Record(submitted->id).state, JobState::kFailed);
  // Without a setting, the coordinator's default is written into the resolved file.
  absl::StatusOr<JobRecord> defaulted = manager_->Submit(Job(1));
  ASSERT_TRUE(defaulted.ok());
  EXPECT_THAT(defaulted->resolved_config_yaml, HasSubstr("max_restarts: 3"));
}

TEST_F(CoordinatorJobManagerTest, CleanExitBeforeCompletingIsAFailure) {
  Start(Options(1));
  const std::string id = RunningJob(1);
  launcher_.End(Workers(id)[0].pid, ExitInfo{false, 0});
  manager_->PollOnce();
  EXPECT_EQ(Record(id).state, JobState::kFailed);
  EXPECT_THAT(Record(id).message, HasSubstr("rank 0"));
  EXPECT_THAT(Record(id).message, HasSubstr("exit status 0 before finishing"));
}

TEST_F(CoordinatorJobManagerTest, SilentWorkerFailsTheJobOnceTheHeartbeatTimeoutPasses) {
  Start(Options(2));
  const std::string id = RunningJob(2);
  std::vector<WorkerHandle> workers = Workers(id);
  clock_.Advance(absl::Seconds(100));
  ASSERT_TRUE(manager_->Heartbeat(id, workers[0].token).ok());
  manager_->PollOnce();
  EXPECT_EQ(Record(id).state, JobState::kRunning);
  clock_.Advance(absl::Seconds(30));  // rank 1: 130 s silent; rank 0: 30 s
  manager_->PollOnce();
  const JobRecord job = Record(id);
  EXPECT_EQ(job.state, JobState::kFailed);
  EXPECT_EQ(job.reason_code, "WORKER_HEARTBEAT_LOST");
  EXPECT_THAT(job.message, HasSubstr("rank 1"));
  EXPECT_THAT(job.message, HasSubstr("no heartbeat for 2m10s"));
}

TEST_F(CoordinatorJobManagerTest, RegistrationTimeoutNamesTheRanksThatNeverRegistered) {
  Start(Options(3));
  const std::string id = Submit(3);
  manager_->PollOnce();
  std::vector<WorkerHandle> workers = Workers(id);
  ASSERT_EQ(workers.size(), 3u);
  ASSERT_TRUE(manager_->Register(id, workers[1].token, 1, workers[1].pid).ok());
  clock_.Advance(absl::Minutes(5));
  manager_->PollOnce();
  EXPECT_EQ(Record(id).state, JobState::kStarting);  // not before the deadline has passed
  clock_.Advance(absl::Seconds(1));
  manager_->PollOnce();
  const JobRecord job = Record(id);
  EXPECT_EQ(job.state, JobState::kFailed);
  EXPECT_EQ(job.reason_code, "WORKER_REGISTRATION_TIMEOUT");
  EXPECT_EQ(job.message, "rank(s) 0, 2 did not register within 5m");
  for (const WorkerHandle& w : workers) EXPECT_THAT(launcher_.SignalsTo(w.pid), ElementsAre(SIGTERM));
}

TEST_F(CoordinatorJobManagerTest, CancelEndsWaitsAndSendsSigtermThenSigkillAfterTheGrace) {
  Start(Options(2));
  const std::string id = Submit(2);
  manager_->PollOnce();
  std::vector<WorkerHandle> workers = Workers(id);
  ASSERT_TRUE(manager_->Register(id, workers[0].token, 0, workers[0].pid).ok());
  // Rank 0 waits for rank 1 in GetAssignment (without holding the manager).
  absl::StatusOr<WorkerAssignment> waited = absl::UnknownError("not returned");
  absl::Notification returned;
  std::thread waiter([&] {
    waited = manager_->GetAssignment(id, workers[0].token, absl::Now() + absl::Seconds(60));
    returned.Notify();
  });
  EXPECT_FALSE(returned.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  EXPECT_TRUE(manager_->Get(id).ok());  // the manager answers while rank 0 waits

  absl::StatusOr<JobRecord> cancelled = manager_->Cancel(id);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state, JobState::kCancelled);
  EXPECT_EQ(cancelled->reason_code, "CANCELLED_BY_USER");
  EXPECT_TRUE(returned.WaitForNotificationWithTimeout(absl::Seconds(10)));
  waiter.join();
  EXPECT_EQ(waited.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(waited.status().message(), HasSubstr("has ended"));
  for (const WorkerHandle& w : workers) EXPECT_THAT(launcher_.SignalsTo(w.pid), ElementsAre(SIGTERM));

  launcher_.End(workers[0].pid, ExitInfo{false, 0});  // rank 0 stops gracefully; rank 1 hangs
  clock_.Advance(absl::Seconds(2));
  manager_->PollOnce();
  EXPECT_THAT(launcher_.SignalsTo(workers[1].pid), ElementsAre(SIGTERM));
  clock_.Advance(absl::Seconds(1));
  manager_->PollOnce();
  EXPECT_THAT(launcher_.SignalsTo(workers[0].pid), ElementsAre(SIGTERM));
  EXPECT_THAT(launcher_.SignalsTo(workers[1].pid), ElementsAre(SIGTERM, SIGKILL));
  EXPECT_EQ(Record(id).state, JobState::kCancelled);  // the exits do not change the outcome
  EXPECT_EQ(manager_->Cancel(id).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(CoordinatorJobManagerTest, GpuJobPinsEachWorkerToItsGpuAndRelaysTheNcclId) {
  Start(Options(0, {4, 6}));
  const std::string id = Submit(2);
  manager_->PollOnce();
  std::vector<WorkerHandle> workers = Workers(id);
  ASSERT_EQ(workers.size(), 2u);
  EXPECT_EQ(workers[0].spec.env.at("CUDA_VISIBLE_DEVICES"), "4");
  EXPECT_EQ(workers[1].spec.env.at("CUDA_VISIBLE_DEVICES"), "6");
  RegisterAll(id);
  EXPECT_EQ(manager_->PublishNcclId(id, workers[1].token, "x").code(), absl::StatusCode::kPermissionDenied);
  absl::StatusOr<WorkerAssignment> early = manager_->GetAssignment(id, workers[1].token, absl::Now());
  EXPECT_EQ(early.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(early.status().message(), HasSubstr("NCCL id"));

  absl::StatusOr<WorkerAssignment> rank1 = absl::UnknownError("not returned");
  std::thread waiter([&] {
    rank1 = manager_->GetAssignment(id, workers[1].token, absl::Now() + absl::Seconds(60));
  });
  EXPECT_TRUE(manager_->PublishNcclId(id, workers[0].token, "nccl-id-bytes").ok());
  waiter.join();
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  EXPECT_EQ(rank1->device, DeviceKind::kCuda);
  EXPECT_EQ(rank1->nccl_unique_id, "nccl-id-bytes");
}

// Records left without a target (cut before it) are said while the job runs: the first time and
// when their count has doubled, summed over ranks; above data.max_without_target_fraction the
// job fails, not to be retried.
TEST_F(CoordinatorJobManagerTest, RecordsWithoutATargetAreSaidWhileTheJobRunsAndCanFailIt) {
  Start(Options(2));
  const std::string id = RunningJob(2);
  std::vector<WorkerHandle> w = Workers(id);
  auto report = [&](int rank, int64_t step, int64_t trained, int64_t without) {
    ProgressSnapshot p;
    p.step = step;
    p.total_records.trained = trained;
    p.total_records.without_target = without;
    ASSERT_TRUE(manager_->ReportProgress(id, w[rank].token, p).ok());
  };
  auto warnings = [&] {
    bool terminal = false;
    std::vector<std::string> out;
    absl::StatusOr<std::vector<JobEvent>> events = manager_->WaitEvents(id, 0, absl::Now(), &terminal);
    EXPECT_TRUE(events.ok()) << events.status();
    for (const JobEvent& e : events.value_or(std::vector<JobEvent>{})) {
      if (e.reason_code == "RECORDS_WITHOUT_TARGET") out.push_back(e.message);
    }
    return out;
  };
  report(0, 1, 10, 0);
  report(1, 1, 9, 1);
  report(0, 2, 20, 1);  // 2 of 32: the first warning was at 1
  ASSERT_EQ(warnings().size(), 2u);
  EXPECT_THAT(warnings()[0], HasSubstr("1 of 20 records read so far (5.0%) left no target after "
                                       "cutting to data.max_sequence_length (512)"));
  EXPECT_THAT(warnings()[1], HasSubstr("2 of 31 records"));
  report(1, 2, 18, 2);  // 3: not yet twice 2
  EXPECT_EQ(warnings().size(), 2u);
  EXPECT_EQ(Record(id).state, JobState::kRunning);  // the default never fails
}

TEST_F(CoordinatorJobManagerTest, RecordsWithoutATargetAboveTheJobsShareFailIt) {
  Start(Options(1));
  SubmitRequest strict = Job(1);
  strict.job_yaml += "data: {max_without_target_fraction: 0.2}\n";
  absl::StatusOr<JobRecord> submitted = manager_->Submit(strict);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  manager_->PollOnce();
  RegisterAll(submitted->id);
  const std::vector<WorkerHandle> s = Workers(submitted->id);
  ProgressSnapshot p;
  p.step = 1;
  p.total_records.trained = 12;
  p.total_records.without_target = 4;  // 25 %
  ASSERT_TRUE(manager_->ReportProgress(submitted->id, s[0].token, p).ok());
  const JobRecord failed = Record(submitted->id);
  EXPECT_EQ(failed.state, JobState::kFailed);
  EXPECT_EQ(failed.reason_code, "RECORDS_WITHOUT_TARGET");
  EXPECT_THAT(failed.message, HasSubstr("4 of 16 records read so far (25.0%)"));
  EXPECT_THAT(failed.message, HasSubstr("more than data.max_without_target_fraction (0.2)"));
}

TEST_F(CoordinatorJobManagerTest, RunningJobIsQueuedAgainAfterARestart) {
  Start(Options(2));
  const std::string id = RunningJob(2);
  std::vector<WorkerHandle> before = Workers(id);
  ProgressSnapshot p;
  p.step = 3;
  ASSERT_TRUE(manager_->ReportProgress(id, before[0].token, p).ok());
  const int64_t old_generation = manager_->GetAssignment(id, before[0].token, absl::Now())->generation;

  // The coordinator stops (its workers are killed): the store still says RUNNING.
  manager_.reset();
  {
    absl::StatusOr<std::vector<JobRecord>> stored = store_->LoadJobs();
    ASSERT_TRUE(stored.ok());
    ASSERT_EQ(stored->size(), 1u);
    EXPECT_EQ((*stored)[0].state, JobState::kRunning);
    ASSERT_EQ((*stored)[0].progress.size(), 1u);  // rank 0's report
    EXPECT_EQ((*stored)[0].progress[0].step, 3);
  }
  clock_.Advance(absl::Minutes(1));
  Start(Options(2));
  JobRecord job = Record(id);
  EXPECT_EQ(job.state, JobState::kQueued);
  EXPECT_EQ(job.reason_code, "REQUEUED_AFTER_RESTART");
  EXPECT_THAT(job.progress, IsEmpty());
  EXPECT_EQ(Submit(1), "job-000002");  // numbering goes on after the stored jobs

  manager_->PollOnce();
  std::vector<WorkerHandle> after = Workers(id);
  ASSERT_EQ(after.size(), 4u);  // two before the restart, two now
  EXPECT_EQ(Record(id).state, JobState::kStarting);
  EXPECT_EQ(manager_->Heartbeat(id, before[0].token).status().code(), absl::StatusCode::kPermissionDenied);
  for (int i = 2; i < 4; ++i) {
    ASSERT_TRUE(manager_->Register(id, after[i].token, after[i].rank, after[i].pid).ok());
  }
  EXPECT_EQ(Record(id).state, JobState::kRunning);
  absl::StatusOr<WorkerAssignment> a = manager_->GetAssignment(id, after[2].token, absl::Now());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_NE(a->generation, old_generation);
  EXPECT_EQ(manager_->StoreSet(id, after[2].token, old_generation, "k", "v").code(),
            absl::StatusCode::kFailedPrecondition);

  // Every state change is in the store, sequence-numbered in order.
  bool terminal = true;
  absl::StatusOr<std::vector<JobEvent>> events = manager_->WaitEvents(id, 0, absl::Now(), &terminal);
  ASSERT_TRUE(events.ok()) << events.status();
  EXPECT_FALSE(terminal);
  std::vector<std::string> reasons;
  for (size_t i = 0; i < events->size(); ++i) {
    EXPECT_EQ((*events)[i].sequence, static_cast<int64_t>(i + 1));
    reasons.push_back((*events)[i].reason_code);
  }
  EXPECT_THAT(reasons, ElementsAre("SUBMITTED", "WORKERS_STARTING", "ALL_WORKERS_REGISTERED", "PROGRESS",
                                   "REQUEUED_AFTER_RESTART", "WORKERS_STARTING", "ALL_WORKERS_REGISTERED"));
  EXPECT_EQ(Record(id).last_sequence, static_cast<int64_t>(events->size()));
}

TEST_F(CoordinatorJobManagerTest, JobThatCannotStartFailsWithTheReason) {
  Start(Options(2));
  const std::string one_record = WriteFile(dir_.path() + "/one.jsonl",
                                           "{\"instruction\": \"a\", \"output\": \"b\"}\n");
  absl::StatusOr<JobRecord> small = manager_->Submit(Job(2, one_record));
  ASSERT_TRUE(small.ok()) << small.status();
  manager_->PollOnce();
  EXPECT_EQ(Record(small->id).state, JobState::kFailed);
  EXPECT_EQ(Record(small->id).reason_code, "START_FAILED");
  EXPECT_THAT(Record(small->id).message, HasSubstr("too small"));
  EXPECT_THAT(launcher_.launched(), IsEmpty());

  launcher_.FailLaunches();
  const std::string id = Submit(2);
  manager_->PollOnce();
  EXPECT_EQ(Record(id).state, JobState::kFailed);
  EXPECT_THAT(Record(id).message, HasSubstr("could not start rank 0"));
}

// A store with no room to grow (max_page_count at its size: SQLite then fails as on a full
// disk, with SQLITE_FULL) cannot record a new job: Submit says so and nothing of it is kept.
TEST_F(CoordinatorJobManagerTest, SubmitThatTheStoreCannotRecordFailsAndKeepsNothing) {
  JobStoreOptions full;
  full.max_pages = 1;  // clamped by SQLite to the pages the schema already has
  Start(Options(1), full);
  SubmitRequest big = Job(1);
  big.job_yaml += absl::StrCat("# ", std::string(64 << 10, 'x'), "\n");  // needs new pages
  absl::StatusOr<JobRecord> job = manager_->Submit(big);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(job.status().message(), HasSubstr("could not record the new job"));
  EXPECT_THAT(job.status().message(), HasSubstr("SQLITE_FULL"));
  EXPECT_THAT(AllJobs(), IsEmpty());
  EXPECT_EQ(manager_->Get("job-000001").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(manager_->Health().ok());  // a refused submission changes nothing stored
  manager_->PollOnce();
  EXPECT_THAT(launcher_.launched(), IsEmpty());

  Start(Options(1));  // the same file, reopened without the limit
  EXPECT_THAT(*store_->LoadJobs(), IsEmpty());
  EXPECT_THAT(*store_->LoadEvents("job-000001", 0), IsEmpty());  // no half-written record
  EXPECT_THAT(AllJobs(), IsEmpty());
  EXPECT_EQ(Submit(1), "job-000001");  // the number was not used up
}

// An acknowledged cancel is never lost: with a store that refuses writes (opened read-only here,
// failing as a full disk does, with UNAVAILABLE), Cancel fails with the store's error and
// cancels nothing, and the coordinator turns unhealthy. Once the store takes writes again the
// job is still queued, and a cancel then is stored and survives a restart.
TEST_F(CoordinatorJobManagerTest, ACancelTheStoreCannotRecordFailsAndCancelsNothing) {
  Start(Options(1));
  const std::string id = Submit(1);  // not polled: it stays queued
  std::vector<absl::Status> reported;
  JobManagerOptions options = Options(1);
  options.on_unhealthy = [&](const absl::Status& s) { reported.push_back(s); };
  Start(options, JobStoreOptions{.read_only = true});
  absl::StatusOr<JobRecord> cancelled = manager_->Cancel(id);
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(cancelled.status().message(),
              HasSubstr("could not record the cancel of job " + id + ", so it did not take effect"));
  EXPECT_EQ(Record(id).state, JobState::kQueued);
  EXPECT_FALSE(manager_->Health().ok());
  EXPECT_EQ(reported.size(), 1u);

  Start(Options(1));
  EXPECT_EQ(Record(id).state, JobState::kQueued);
  ASSERT_TRUE(manager_->Cancel(id).ok());
  Start(Options(1));
  EXPECT_EQ(Record(id).state, JobState::kCancelled);
}

// The last rank's completion is acknowledged only once the job's success is stored: while
// another connection holds the store's write lock (the manager's writes time out with
// SQLITE_BUSY, as on a store it cannot write), the completion fails with UNAVAILABLE, the job
// stays RUNNING, and the rank may report again; once the store takes writes, it succeeds.
TEST_F(CoordinatorJobManagerTest, ASuccessTheStoreCannotRecordIsNotAcknowledged) {
  Start(Options(1));
  const std::string id = Submit(1);
  manager_->PollOnce();
  RegisterAll(id);
  const WorkerHandle w = Workers(id)[0];
  const std::string adapter = Record(id).output_dir + "/adapter";
  sqlite3* blocker = nullptr;
  ASSERT_EQ(sqlite3_open((state_dir() + "/jobs.sqlite").c_str(), &blocker), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(blocker, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr), SQLITE_OK);
  const absl::Status refused =
      manager_->ReportCompletion(id, w.token, {.ok = true, .adapter_path = adapter});
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_THAT(refused.message(),
              HasSubstr("could not record the success of job " + id + ", so it did not take effect"));
  EXPECT_EQ(Record(id).state, JobState::kRunning);
  EXPECT_EQ(Record(id).adapter_path, "");
  ASSERT_EQ(sqlite3_exec(blocker, "COMMIT", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(blocker);

  ASSERT_TRUE(manager_->ReportCompletion(id, w.token, {.ok = true, .adapter_path = adapter}).ok());
  EXPECT_EQ(Record(id).state, JobState::kSucceeded);
  EXPECT_EQ(Record(id).adapter_path, adapter);
  Start(Options(1));
  EXPECT_EQ(Record(id).state, JobState::kSucceeded);
}

// A state change that cannot be written turns the coordinator unhealthy, once, with the cause:
// new jobs are refused, and a watcher is not left asking for the event the store lacks.
TEST_F(CoordinatorJobManagerTest, FailedWriteOfAStateChangeMakesTheCoordinatorUnhealthy) {
  Start(Options(2));
  const std::string id = Submit(1);
  std::vector<absl::Status> reported;
  JobManagerOptions options = Options(2);
  options.on_unhealthy = [&](const absl::Status& s) { reported.push_back(s); };
  Start(options, JobStoreOptions{1});  // restarted on a store that cannot grow
  manager_->PollOnce();
  RegisterAll(id);
  const WorkerHandle w = Workers(id).back();
  ProgressSnapshot p;
  for (int step = 1; step <= 1000 && manager_->Health().ok(); ++step) {
    p.step = step;
    ASSERT_TRUE(manager_->ReportProgress(id, w.token, p).ok());
  }
  const absl::Status health = manager_->Health();
  ASSERT_FALSE(health.ok()) << "1000 progress events fitted in a store that cannot grow";
  EXPECT_THAT(health.message(), HasSubstr("SQLITE_FULL"));
  EXPECT_THAT(health.message(), HasSubstr(id));
  ASSERT_EQ(reported.size(), 1u);
  EXPECT_EQ(reported[0], health);
  ASSERT_TRUE(manager_->ReportProgress(id, w.token, p).ok());  // later writes: not reported again
  EXPECT_EQ(reported.size(), 1u);

  absl::StatusOr<JobRecord> refused = manager_->Submit(Job(1));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused.status().message(), HasSubstr("unhealthy"));
  EXPECT_THAT(refused.status().message(), HasSubstr("SQLITE_FULL"));
  EXPECT_EQ(AllJobs().size(), 1u);

  // The last event is not in the store: the job's state stands in for it, with its number.
  const JobRecord job = Record(id);
  bool terminal = true;
  absl::StatusOr<std::vector<JobEvent>> events =
      manager_->WaitEvents(id, job.last_sequence - 1, absl::Now() + absl::Seconds(10), &terminal);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ(events->back().sequence, job.last_sequence);
  EXPECT_EQ(events->back().state, JobState::kRunning);
}

// A dataset that is a FIFO, a device, a folder or an empty file is refused at Submit and
// Validate, naming the field and the reason, at once (stat only: a FIFO with no writer would
// block an open forever), and nothing is kept.
TEST_F(CoordinatorJobManagerTest, DatasetsThatAreNotRegularNonEmptyFilesAreRefusedAtSubmit) {
  Start(Options(1));
  const std::string fifo = dir_.path() + "/pipe.jsonl";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  const std::string folder = dir_.path() + "/folder.jsonl";
  std::filesystem::create_directories(folder);
  const std::string empty = WriteFile(dir_.path() + "/empty.jsonl", "");
  const std::string device = dir_.path() + "/device.jsonl";
  std::filesystem::create_symlink("/dev/null", device);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {fifo, "is a FIFO (named pipe), not a regular file"},
      {folder, "is a folder, not a regular file"},
      {empty, "is empty"},
      {device, "is a character device, not a regular file"}};
  for (const auto& [path, reason] : cases) {
    const auto start = absl::Now();
    absl::StatusOr<JobRecord> job = manager_->Submit(Job(1, path));
    EXPECT_LT(absl::Now() - start, absl::Seconds(1));
    EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument) << path;
    EXPECT_THAT(job.status().message(), HasSubstr(absl::StrCat("dataset: '", path, "' ", reason)));
    EXPECT_EQ(manager_->Validate(Job(1, path)).status().code(), absl::StatusCode::kInvalidArgument);
  }
  SubmitRequest validation = Job(1);
  validation.validation_dataset = fifo;
  absl::StatusOr<JobRecord> job = manager_->Submit(validation);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(job.status().message(), HasSubstr("validation_dataset: '" + fifo + "' is a FIFO"));
  EXPECT_THAT(AllJobs(), IsEmpty());
  EXPECT_THAT(*store_->LoadJobs(), IsEmpty());
}

// A dataset swapped for a FIFO after Submit: the start is prepared without the manager's lock
// and the FIFO is opened without blocking, so other calls are answered meanwhile and the start
// fails with the reason instead of hanging the monitor (before: open() blocked under the lock).
TEST_F(CoordinatorJobManagerTest, DatasetSwappedForAFifoAfterSubmitFailsTheStartWithoutBlocking) {
  Start(Options(1));
  const std::string dataset = WriteFile(dir_.path() + "/swapped.jsonl", testing::ReadFile(train_path_));
  absl::StatusOr<JobRecord> job = manager_->Submit(Job(1, dataset));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(std::filesystem::remove(dataset));
  ASSERT_EQ(mkfifo(dataset.c_str(), 0644), 0);

  absl::Notification polled, answered;
  std::thread poller([&] {
    manager_->PollOnce();
    polled.Notify();
  });
  std::thread client([&] {
    (void)manager_->Get(job->id);
    (void)AllJobs();
    answered.Notify();
  });
  const bool answered_in_time = answered.WaitForNotificationWithTimeout(absl::Seconds(1));
  const bool polled_in_time = polled.WaitForNotificationWithTimeout(absl::Seconds(5));
  if (!polled_in_time) {  // a writer lets a blocked open() return, so that the test can end
    const int writer = open(dataset.c_str(), O_WRONLY | O_NONBLOCK);
    if (writer >= 0) close(writer);
  }
  poller.join();
  client.join();
  EXPECT_TRUE(answered_in_time) << "Get/List waited for the start";
  EXPECT_TRUE(polled_in_time) << "the start blocked on the FIFO";
  const JobRecord failed = Record(job->id);
  EXPECT_EQ(failed.state, JobState::kFailed);
  EXPECT_EQ(failed.reason_code, "START_FAILED");
  EXPECT_THAT(failed.message, HasSubstr(dataset));
  EXPECT_THAT(failed.message, HasSubstr("not a regular file"));
  EXPECT_THAT(launcher_.launched(), IsEmpty());
}

// AddressSanitizer keeps freed memory in quarantine (256 MiB by default), so resident memory
// says nothing about what the coordinator holds: the memory figures are only asserted without it.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kResidentMemoryMeaningful = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kResidentMemoryMeaningful = false;
#else
constexpr bool kResidentMemoryMeaningful = true;
#endif
#else
constexpr bool kResidentMemoryMeaningful = true;
#endif

// This process's resident memory (/proc/self/statm), for the soak tests.
int64_t ResidentBytes() {
  long pages = 0, resident = 0;
  FILE* f = fopen("/proc/self/statm", "r");
  if (f != nullptr) {
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    fclose(f);
  }
  return static_cast<int64_t>(resident) * sysconf(_SC_PAGESIZE);
}

// Retention: each user keeps the newest max_ended_jobs_per_user ended jobs; older ones lose
// their rows, events and state-folder folders, other users' jobs and live jobs are untouched,
// and a forgotten job's id is never given again, across a restart too.
TEST_F(CoordinatorJobManagerTest, EndedJobsBeyondAUsersKeepAreForgottenForGood) {
  JobManagerOptions options = Options(1);
  options.max_ended_jobs_per_user = 3;
  Start(options);
  auto submit_as = [&](const std::string& owner) {
    SubmitRequest r = Job(1);
    r.owner = owner;
    absl::StatusOr<JobRecord> job = manager_->Submit(r);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->id : "";
  };
  const std::string running = RunningJob(1);  // owner "": never ended, never forgotten
  const std::string bobs = submit_as("bob");
  ASSERT_TRUE(manager_->Cancel(bobs).ok());
  std::vector<std::string> alices;
  for (int i = 0; i < 8; ++i) {
    alices.push_back(submit_as("alice"));
    WriteFile(absl::StrCat(state_dir(), "/jobs/", alices.back(), "/logs/rank-0.log"), "x\n");
    ASSERT_TRUE(manager_->Cancel(alices.back()).ok());
    clock_.Advance(absl::Seconds(1));
  }
  manager_->PollOnce();
  for (int i = 0; i < 8; ++i) {
    const bool kept = i >= 5;  // the newest three
    EXPECT_EQ(manager_->Get(alices[i]).ok(), kept) << alices[i];
    EXPECT_EQ(std::filesystem::exists(absl::StrCat(state_dir(), "/jobs/", alices[i])), kept)
        << alices[i];
  }
  EXPECT_TRUE(manager_->Get(bobs).ok());
  EXPECT_EQ(Record(running).state, JobState::kRunning);
  EXPECT_EQ(AllJobs().size(), 5u);
  bool terminal = false;
  EXPECT_EQ(manager_->WaitEvents(alices[0], 0, clock_.Now(), &terminal).status().code(),
            absl::StatusCode::kNotFound);

  // The store holds what memory holds; a restarted coordinator numbers on after the forgotten.
  const std::string last = alices.back();
  Start(options);
  EXPECT_EQ(AllJobs().size(), 5u);
  const std::string next = submit_as("carol");
  EXPECT_GT(next, last) << "a forgotten job's id came back";
}

TEST_F(CoordinatorJobManagerTest, EndedJobsOlderThanTheRetentionAreForgotten) {
  JobManagerOptions options = Options(1);
  options.ended_job_retention = absl::Hours(1);
  Start(options);
  const std::string id = Submit(1);
  ASSERT_TRUE(manager_->Cancel(id).ok());
  clock_.Advance(absl::Minutes(59));
  manager_->PollOnce();
  EXPECT_TRUE(manager_->Get(id).ok());
  clock_.Advance(absl::Minutes(2));
  manager_->PollOnce();
  EXPECT_EQ(manager_->Get(id).status().code(), absl::StatusCode::kNotFound);
}

// Thousands of submit-and-cancel cycles leave memory, the store and the state folder where the
// first thousand left them (before retention, 300 cycles grew the coordinator's memory by
// 330 MB and its state folder by 300 MB).
TEST_F(CoordinatorJobManagerTest, SubmitAndCancelLoopsKeepMemoryStoreAndFolderFlat) {
  JobManagerOptions options = Options(1);
  options.max_ended_jobs_per_user = 20;
  Start(options);
  SubmitRequest request = Job(1);
  request.job_yaml += "# " + std::string(64 * 1024, 'x') + "\n";  // a large job file
  auto state_bytes = [&] {
    int64_t total = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(state_dir())) {
      if (e.is_regular_file()) total += static_cast<int64_t>(e.file_size());
    }
    return total;
  };
  auto cycles = [&](int n) {
    for (int i = 0; i < n; ++i) {
      absl::StatusOr<JobRecord> job = manager_->Submit(request);
      ASSERT_TRUE(job.ok()) << job.status();
      ASSERT_TRUE(manager_->Cancel(job->id).ok());
      clock_.Advance(absl::Milliseconds(10));
      manager_->PollOnce();
    }
  };
  cycles(1000);
  const int64_t rss = ResidentBytes(), disk = state_bytes();
  cycles(2000);
  const int64_t rss_growth = ResidentBytes() - rss, disk_growth = state_bytes() - disk;
  printf("after 1000 cycles: RSS %.1f MiB, state %.1f MiB; 2000 more grew them by %.1f and "
         "%.1f MiB\n", rss / 1048576.0, disk / 1048576.0, rss_growth / 1048576.0,
         disk_growth / 1048576.0);
  EXPECT_EQ(AllJobs().size(), 20u);
  // 2000 kept job files alone would be 128 MiB.
  if (kResidentMemoryMeaningful) EXPECT_LT(rss_growth, int64_t{16} << 20);
  EXPECT_LT(disk_growth, int64_t{8} << 20);
}

// An ended job's job files leave the coordinator's memory once its end is stored; Get (and List's
// callers through FillJobFiles) still give them, from the store, after a restart too.
TEST_F(CoordinatorJobManagerTest, EndedJobsFilesLeaveMemoryButAreStillGiven) {
  JobManagerOptions options = Options(1);
  options.max_ended_jobs_per_user = 0;  // keep every ended job
  Start(options);
  SubmitRequest request = Job(1);
  request.job_yaml += "# " + std::string(256 * 1024, 'y') + "\n";
  const std::string id = manager_->Submit(request)->id;
  const JobRecord submitted = Record(id);
  ASSERT_TRUE(manager_->Cancel(id).ok());
  manager_->PollOnce();
  EXPECT_EQ(Record(id).job_yaml, request.job_yaml);
  EXPECT_EQ(Record(id).resolved_config_yaml, submitted.resolved_config_yaml);
  JobRecord listed = AllJobs().at(0);
  EXPECT_TRUE(listed.job_yaml.empty());
  ASSERT_TRUE(manager_->FillJobFiles(&listed).ok());
  EXPECT_EQ(listed.job_yaml, request.job_yaml);
  Start(options);
  manager_->PollOnce();
  EXPECT_EQ(Record(id).job_yaml, request.job_yaml);

  // 200 more such jobs would hold 50 MiB of job files in memory.
  const int64_t before = ResidentBytes();
  for (int i = 0; i < 200; ++i) {
    absl::StatusOr<JobRecord> job = manager_->Submit(request);
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_TRUE(manager_->Cancel(job->id).ok());
    manager_->PollOnce();
  }
  const int64_t growth = ResidentBytes() - before;
  printf("200 ended jobs with 256 KiB job files grew RSS by %.1f MiB\n", growth / 1048576.0);
  if (kResidentMemoryMeaningful) EXPECT_LT(growth, int64_t{20} << 20);
}

}  // namespace
}  // namespace qlora::coordinator
