// The RPC fuzz target's environment (see rpc_fuzz_env.h).
#include "tests/fuzz/rpc_fuzz_env.h"

#include <signal.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "common/worker_protocol.h"

namespace qlora::fuzz {
namespace {

[[noreturn]] void HarnessBroken(const std::string& what) {
  std::fprintf(stderr, "rpc fuzz environment: %s\n", what.c_str());
  std::abort();
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) HarnessBroken("cannot write " + path);
}

}  // namespace

absl::StatusOr<pid_t> RecordingLauncher::Launch(const coordinator::LaunchSpec& spec) {
  absl::MutexLock lock(&mu_);
  auto token = spec.env.find(kWorkerTokenVariable);
  tokens_.push_back(token == spec.env.end() ? "" : token->second);
  return next_pid_++;
}

std::optional<coordinator::ExitInfo> RecordingLauncher::Poll(pid_t pid) {
  absl::MutexLock lock(&mu_);
  auto it = killed_.find(pid);
  if (it == killed_.end()) return std::nullopt;
  if (it->second) return coordinator::ExitInfo{false, -1};  // as waitpid: no such child
  it->second = true;
  return coordinator::ExitInfo{true, SIGKILL};
}

void RecordingLauncher::Signal(pid_t pid, int signal) {
  absl::MutexLock lock(&mu_);
  if (signal == SIGKILL) killed_.emplace(pid, false);
}

std::string RecordingLauncher::TokenOf(size_t index) const {
  absl::MutexLock lock(&mu_);
  return index < tokens_.size() ? tokens_[index] : "";
}

Services MakeServices(coordinator::JobManager* manager) {
  Services services;
  services.auth = *coordinator::Authenticator::Create({});
  services.jobs = std::make_unique<coordinator::JobServiceImpl>(manager, services.auth.get());
  services.workers = std::make_unique<coordinator::WorkerServiceImpl>(manager);
  return services;
}

std::unique_ptr<grpc::ServerContext> MakeServerContext() {
  return std::make_unique<grpc::ServerContext>();
}

RpcFuzzEnv::RpcFuzzEnv() {
  if (root().empty()) HarnessBroken("cannot make a temporary folder");
  for (const std::string folder : {"/model", "/state"})
    if (::mkdir((root() + folder).c_str(), 0700) != 0) HarnessBroken("cannot make " + folder);
  Write(root() + "/model/config.json", "{}\n");
  Write(root() + "/train.jsonl",
        "{\"instruction\": \"Add 1 and 1.\", \"output\": \"2\"}\n"
        "{\"instruction\": \"Add 2 and 1.\", \"output\": \"3\"}\n");
  Write(root() + "/train.csv", "instruction,output\n\"Add 1, 1\",2\nAdd 2 and 1.,3\n");
  Write(root() + "/train.txt", "one document\nanother document\n");

  absl::StatusOr<std::unique_ptr<coordinator::JobStore>> store =
      coordinator::JobStore::Open(root() + "/state/jobs.sqlite");
  if (!store.ok()) HarnessBroken(store.status().ToString());
  store_ = std::move(*store);
  coordinator::JobManagerOptions options;
  options.state_dir = root() + "/state";
  options.worker_binary = "/nonexistent/qlora-worker";  // never run: the launcher only records
  options.cpu_workers = 2;
  options.max_queued_jobs = 4;
  options.now = [] { return absl::FromUnixSeconds(kFuzzClockUnixSeconds); };
  manager_ = std::make_unique<coordinator::JobManager>(options, store_.get(), &launcher_);
  if (absl::Status loaded = manager_->Load(); !loaded.ok()) HarnessBroken(loaded.ToString());
  manager_->SetCoordinatorAddress("127.0.0.1:1");
  services_ = MakeServices(manager_.get());
}

}  // namespace qlora::fuzz
