// qlora-coordinator: the daemon. Serves JobService, WorkerService, grpc.health.v1 and server
// reflection on one address; keeps its state (SQLite job store, logs, outputs) in --state-dir.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/job_manager.h"
#include "coordinator/job_service.h"
#include "coordinator/job_store.h"
#include "coordinator/listen_policy.h"
#include "coordinator/process_launcher.h"
#include "coordinator/state_lock.h"
#include "coordinator/worker_service.h"

ABSL_FLAG(std::string, address, "127.0.0.1:50051", "host:port to listen on (port 0 picks a free one)");
ABSL_FLAG(bool, insecure, false,
          "allow a non-loopback --address although the API has no TLS or authentication yet");
ABSL_FLAG(int, max_queued_jobs, qlora::coordinator::JobManagerOptions{}.max_queued_jobs,
          "refuse submissions (RESOURCE_EXHAUSTED) while this many jobs are queued");
ABSL_FLAG(int, max_streams, 256, "at most this many watch and log streams open at once");
ABSL_FLAG(std::string, state_dir, "qlora-state", "folder for the job store, logs and outputs");
ABSL_FLAG(int, cpu_workers, 0, "run jobs on this many CPU worker processes (machines without GPUs)");
ABSL_FLAG(std::string, gpus, "auto", "GPU ids to use, e.g. 0,1,2,3; 'auto' = every GPU; 'none' = no GPU");
ABSL_FLAG(std::string, worker_binary, "", "path of qlora-worker (default: beside this binary)");
ABSL_FLAG(std::string, port_file, "", "write the bound port here once serving");
ABSL_FLAG(int, shutdown_grace_ms, 500, "NOT_SERVING period before the listener closes");
// The job manager's own defaults are the flags' defaults (one source of truth).
ABSL_FLAG(int, register_timeout_s,
          static_cast<int>(absl::ToInt64Seconds(qlora::coordinator::JobManagerOptions().register_timeout)),
          "seconds for spawned workers to register");
ABSL_FLAG(int, heartbeat_timeout_s,
          static_cast<int>(absl::ToInt64Seconds(qlora::coordinator::JobManagerOptions().heartbeat_timeout)),
          "seconds without a heartbeat before a worker counts as lost");

namespace {

std::vector<int> DetectGpus() {
  std::vector<int> gpus;
  // A restriction the coordinator was started with holds for its workers too.
  if (const char* visible = getenv("CUDA_VISIBLE_DEVICES"); visible != nullptr) {
    for (absl::string_view part : absl::StrSplit(visible, ',', absl::SkipEmpty())) {
      int id;
      if (absl::SimpleAtoi(part, &id) && id >= 0) gpus.push_back(id);
    }
    return gpus;
  }
  std::error_code ec;
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec)) {
    (void)entry;
    gpus.push_back(n++);
  }
  return gpus;
}

absl::StatusOr<std::vector<int>> ParseGpus(const std::string& spec) {
  if (spec == "auto") return DetectGpus();
  if (spec == "none" || spec.empty()) return std::vector<int>{};
  std::vector<int> gpus;
  for (absl::string_view part : absl::StrSplit(spec, ',')) {
    int id;
    if (!absl::SimpleAtoi(part, &id) || id < 0) {
      return absl::InvalidArgumentError(absl::StrCat("--gpus: '", part, "' is not a GPU id"));
    }
    gpus.push_back(id);
  }
  return gpus;
}

// Accepts --cpu-workers as well as absl's --cpu_workers.
std::vector<char*> DashesToUnderscores(int argc, char** argv, std::vector<std::string>* storage) {
  storage->assign(argv, argv + argc);
  for (std::string& arg : *storage) {
    if (arg.rfind("--", 0) != 0) continue;
    for (size_t i = 2; i < arg.size() && arg[i] != '='; ++i) {
      if (arg[i] == '-') arg[i] = '_';
    }
  }
  std::vector<char*> out;
  for (std::string& arg : *storage) out.push_back(arg.data());
  return out;
}

std::string SelfDir() {
  std::error_code ec;
  return std::filesystem::read_symlink("/proc/self/exe", ec).parent_path().string();
}

// The state folder, locked for this process (one coordinator per folder), and its job store.
struct StateDir {
  qlora::coordinator::StateDirLock lock;
  std::unique_ptr<qlora::coordinator::JobStore> store;
};

absl::StatusOr<StateDir> OpenStateDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  absl::StatusOr<qlora::coordinator::StateDirLock> lock = qlora::coordinator::StateDirLock::Acquire(dir);
  if (!lock.ok()) return lock.status();
  absl::StatusOr<std::unique_ptr<qlora::coordinator::JobStore>> store =
      qlora::coordinator::JobStore::Open(dir + "/jobs.sqlite");
  if (!store.ok()) return store.status();
  return StateDir{std::move(*lock), std::move(*store)};
}

// The job manager's options from the flags.
absl::StatusOr<qlora::coordinator::JobManagerOptions> OptionsFromFlags() {
  absl::StatusOr<std::vector<int>> gpus = ParseGpus(absl::GetFlag(FLAGS_gpus));
  if (!gpus.ok()) return gpus.status();
  qlora::coordinator::JobManagerOptions options;
  options.state_dir = std::filesystem::absolute(absl::GetFlag(FLAGS_state_dir)).string();
  options.cpu_workers = absl::GetFlag(FLAGS_cpu_workers);
  if (options.cpu_workers == 0) options.gpus = *gpus;
  options.worker_binary = absl::GetFlag(FLAGS_worker_binary);
  if (options.worker_binary.empty()) {
    // Installed side by side, or in the build tree (coordinator/ and worker/).
    options.worker_binary = SelfDir() + "/qlora-worker";
    if (!std::filesystem::exists(options.worker_binary)) options.worker_binary = SelfDir() + "/../worker/qlora-worker";
  }
  options.register_timeout = absl::Seconds(absl::GetFlag(FLAGS_register_timeout_s));
  options.heartbeat_timeout = absl::Seconds(absl::GetFlag(FLAGS_heartbeat_timeout_s));
  options.max_queued_jobs = absl::GetFlag(FLAGS_max_queued_jobs);
  if (options.gpus.empty() && options.cpu_workers == 0) {
    options.cpu_workers = 1;
    fprintf(stderr, "qlora-coordinator: no GPUs found; running jobs on 1 CPU worker (see --cpu-workers)\n");
  }
  return options;
}

// grpc.health's overall status: SERVING once Serve() is called, NOT_SERVING for good after
// Fail() (the job manager turned unhealthy, or the coordinator is stopping), whichever order
// they come in. Thread-safe.
class HealthSwitch {
 public:
  void Serve(grpc::HealthCheckServiceInterface* service) {
    absl::MutexLock lock(&mu_);
    service_ = service;
    service_->SetServingStatus(!failed_);
  }
  void Fail() {
    absl::MutexLock lock(&mu_);
    failed_ = true;
    if (service_ != nullptr) service_->SetServingStatus(false);
  }

 private:
  absl::Mutex mu_;
  grpc::HealthCheckServiceInterface* service_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
};

void WritePortFile(const std::string& path, int port) {
  if (path.empty()) return;
  const std::string tmp = path + ".tmp";
  if (FILE* f = fopen(tmp.c_str(), "w")) {
    fprintf(f, "%d\n", port);
    fclose(f);
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "qlora-coordinator --address=HOST:PORT --state-dir=DIR [--cpu-workers=N | --gpus=0,1]\n"
      "Queues QLoRA fine-tuning jobs and runs each on one worker process per GPU (or CPU slot).");
  std::vector<std::string> arg_storage;
  std::vector<char*> args = DashesToUnderscores(argc, argv, &arg_storage);
  absl::ParseCommandLine(static_cast<int>(args.size()), args.data());

  // SIGINT/SIGTERM are taken by a waiting thread: block them before any thread starts.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  const std::string address = absl::GetFlag(FLAGS_address);
  if (absl::Status allowed = qlora::coordinator::CheckListenAddress(address, absl::GetFlag(FLAGS_insecure));
      !allowed.ok()) {
    fprintf(stderr, "qlora-coordinator: %s\n", std::string(allowed.message()).c_str());
    return 2;
  }
  if (!qlora::coordinator::IsLoopbackAddress(address)) {
    fprintf(stderr, "qlora-coordinator: INSECURE: listening on %s without TLS or client "
            "authentication (--insecure): anyone who reaches it can submit, read and cancel jobs\n",
            address.c_str());
  }
  absl::StatusOr<qlora::coordinator::JobManagerOptions> flags = OptionsFromFlags();
  if (!flags.ok()) {
    fprintf(stderr, "qlora-coordinator: %s\n", std::string(flags.status().message()).c_str());
    return 2;
  }
  qlora::coordinator::JobManagerOptions options = *std::move(flags);
  HealthSwitch health;
  options.on_unhealthy = [&health](const absl::Status&) { health.Fail(); };
  absl::StatusOr<StateDir> state = OpenStateDir(options.state_dir);
  if (!state.ok()) {
    fprintf(stderr, "qlora-coordinator: %s\n", std::string(state.status().message()).c_str());
    return 1;
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  qlora::coordinator::PosixProcessLauncher launcher;
  // The stored jobs are loaded before the first request is served; workers are only spawned by
  // the monitor, started once the bound port is known.
  qlora::coordinator::JobManager manager(options, state->store.get(), &launcher);
  if (absl::Status loaded = manager.Load(); !loaded.ok()) {
    fprintf(stderr, "qlora-coordinator: %s\n", std::string(loaded.message()).c_str());
    return 1;
  }
  qlora::coordinator::JobServiceImpl job_service(&manager, absl::GetFlag(FLAGS_max_streams));
  qlora::coordinator::WorkerServiceImpl worker_service(&manager);
  const std::string host = address.substr(0, address.rfind(':'));
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&job_service);
  builder.RegisterService(&worker_service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    fprintf(stderr, "qlora-coordinator: cannot listen on %s\n", address.c_str());
    return 1;
  }
  const std::string bound = absl::StrCat(host.empty() ? "127.0.0.1" : host, ":", port);
  manager.SetCoordinatorAddress(bound);
  manager.StartMonitor();
  health.Serve(server->GetHealthCheckService());  // NOT_SERVING if already unhealthy (Load)
  printf("qlora-coordinator listening on %s (state %s, %s)\n", bound.c_str(), options.state_dir.c_str(),
         options.gpus.empty() ? absl::StrCat(options.cpu_workers, " CPU workers").c_str()
                              : absl::StrCat(options.gpus.size(), " GPUs").c_str());
  fflush(stdout);
  WritePortFile(absl::GetFlag(FLAGS_port_file), port);

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  fprintf(stderr, "qlora-coordinator: %s, shutting down\n", strsignal(signal_number));
  health.Fail();
  // Health says NOT_SERVING for a moment before the listener closes, so probes can see it.
  usleep(absl::GetFlag(FLAGS_shutdown_grace_ms) * 1000);
  manager.Shutdown();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}
