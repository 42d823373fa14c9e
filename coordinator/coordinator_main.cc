// qlora-coordinator: the daemon. Serves JobService, WorkerService, grpc.health.v1 and server
// reflection on one address; keeps its state (SQLite job store, logs, outputs) in --state-dir.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/program/program_flags.h"
#include "coordinator/job_manager.h"
#include "coordinator/job_service.h"
#include "coordinator/job_store.h"
#include "common/rpc/coordinator_channel.h"
#include "coordinator/authenticator.h"
#include "coordinator/http/http_server.h"
#include "coordinator/http/metrics.h"
#include "coordinator/http/rpc_metrics_interceptor.h"
#include "coordinator/http/status_site.h"
#include "coordinator/listen_policy.h"
#include "coordinator/process_launcher.h"
#include "coordinator/ray/ray_worker_launcher.h"
#include "coordinator/server_tls.h"
#include "coordinator/state_lock.h"
#include "coordinator/worker_service.h"

ABSL_FLAG(std::string, address, "127.0.0.1:50051", "host:port to listen on (port 0 picks a free one)");
ABSL_FLAG(bool, insecure, false,
          "allow a non-loopback --address without TLS and client authentication (and a non-loopback "
          "--metrics-address, which is plain HTTP)");
ABSL_FLAG(std::string, tls_cert, "", "TLS: this server's certificate chain (PEM; re-read when it changes)");
ABSL_FLAG(std::string, tls_key, "", "TLS: the certificate's private key (PEM)");
ABSL_FLAG(std::string, tls_client_ca, "",
          "mTLS: CA bundle (PEM) for client certificates; a verified certificate's common name is its user");
ABSL_FLAG(std::string, tls_ca, "",
          "the CA (PEM) that signed --tls-cert, handed to workers to verify this coordinator "
          "(default: the system roots)");
ABSL_FLAG(std::string, tls_server_name, "",
          "the name workers check the certificate against (default: the host they dial, 127.0.0.1 "
          "for a wildcard --address)");
ABSL_FLAG(std::string, auth_tokens, "",
          "tokens file: lines 'sha256:<hex> USER ROLE' (qloractl hash-token); re-read on SIGHUP");
ABSL_FLAG(std::string, read_roots, "",
          "comma-separated folders jobs may read datasets and models from (default: anywhere)");
ABSL_FLAG(std::string, output_root, "", "the folder jobs' output_dir must lie in (default: anywhere)");
ABSL_FLAG(int, max_queued_jobs, qlora::coordinator::JobManagerOptions{}.max_queued_jobs,
          "refuse submissions (RESOURCE_EXHAUSTED) while this many jobs are queued");
ABSL_FLAG(int, max_restarts, qlora::coordinator::JobManagerOptions{}.default_max_restarts,
          "automatic restarts from the last checkpoint after a worker fails, for jobs whose file "
          "does not set trainer.max_restarts (0 = fail at once)");
ABSL_FLAG(double, restart_backoff_s,
          absl::ToDoubleSeconds(qlora::coordinator::JobManagerOptions{}.restart_backoff),
          "seconds before the first restart; each next one waits twice as long (at most 5 min)");
ABSL_FLAG(int, max_queued_jobs_per_user, 0, "the same per user (0 = no per-user cap)");
ABSL_FLAG(int, max_streams, 256, "at most this many watch and log streams open at once");
ABSL_FLAG(int, max_streams_per_user, 0, "at most this many per user (0 = no per-user cap)");
ABSL_FLAG(std::string, health_address, "",
          "also serve grpc.health.v1 alone, in plaintext, on this host:port (for probes that cannot "
          "speak TLS, e.g. Kubernetes' grpc probe): only grpc.health (and its reflection) is served there");
ABSL_FLAG(std::string, ray_address, "",
          "a Ray cluster's dashboard, http://HEAD:8265: jobs with backend.type: ray run their "
          "workers there (needs --advertise-address)");
ABSL_FLAG(std::string, ray_python, "python3", "the Python with ray on the cluster's hosts");
ABSL_FLAG(std::string, ray_launcher_script, "",
          "path of qlora_ray_launcher.py on the cluster's hosts (default: beside qlora-worker)");
ABSL_FLAG(std::string, advertise_address, "",
          "host:port workers dial (default: --address; 127.0.0.1 for a wildcard address); "
          "a port of 0 means the bound port");
ABSL_FLAG(std::string, state_dir, "qlora-state", "folder for the job store, logs and outputs");
ABSL_FLAG(int, cpu_workers, 0, "run jobs on this many CPU worker processes (machines without GPUs)");
ABSL_FLAG(std::string, gpus, "auto", "GPU ids to use, e.g. 0,1,2,3; 'auto' = every GPU; 'none' = no GPU");
ABSL_FLAG(std::string, worker_binary, "", "path of qlora-worker (default: beside this binary)");
ABSL_FLAG(std::string, port_file, "", "write the bound port here once serving");
ABSL_FLAG(std::string, metrics_address, "",
          "also serve Prometheus /metrics and the read-only status page (/, /jobs/ID) over plain HTTP "
          "on this IP:port (port 0 picks a free one; off when empty); a non-loopback address needs "
          "--insecure, and with --auth-tokens every data request needs 'Authorization: Bearer'");
ABSL_FLAG(std::string, metrics_port_file, "", "write the bound --metrics-address port here once serving");
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
  absl::StatusOr<qlora::coordinator::PathRoots> roots =
      qlora::coordinator::ResolvePathRoots(absl::GetFlag(FLAGS_read_roots), absl::GetFlag(FLAGS_output_root));
  if (!roots.ok()) return roots.status();
  options.roots = *std::move(roots);
  options.max_queued_jobs_per_user = absl::GetFlag(FLAGS_max_queued_jobs_per_user);
  options.default_max_restarts = absl::GetFlag(FLAGS_max_restarts);
  options.restart_backoff = absl::Seconds(absl::GetFlag(FLAGS_restart_backoff_s));
  if (!absl::GetFlag(FLAGS_tls_cert).empty()) {
    // Workers dial over TLS too; the CA and name are not secrets.
    options.worker_env[qlora::kTlsVariable] = "1";
    const std::string ca = absl::GetFlag(FLAGS_tls_ca);
    options.worker_env[qlora::kTlsCaVariable] = ca.empty() ? "" : std::filesystem::absolute(ca).string();
    options.worker_env[qlora::kTlsServerNameVariable] = absl::GetFlag(FLAGS_tls_server_name);
  }
  // Workers on other hosts do not inherit this environment: how NCCL and Gloo pick their network
  // interface (and NCCL's other settings) is passed on explicitly.
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const size_t eq = entry.find('=');
    const std::string name = entry.substr(0, eq);
    if (eq != std::string::npos && (name.rfind("NCCL_", 0) == 0 || name == "GLOO_SOCKET_IFNAME")) {
      options.worker_env[name] = entry.substr(eq + 1);
    }
  }
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
  // `service` (one per server: the API's and the plain health port's) follows from now on.
  void Serve(grpc::HealthCheckServiceInterface* service) {
    absl::MutexLock lock(&mu_);
    services_.push_back(service);
    service->SetServingStatus(!failed_);
  }
  void Fail() {
    absl::MutexLock lock(&mu_);
    failed_ = true;
    for (grpc::HealthCheckServiceInterface* service : services_) service->SetServingStatus(false);
  }

 private:
  absl::Mutex mu_;
  std::vector<grpc::HealthCheckServiceInterface*> services_ ABSL_GUARDED_BY(mu_);
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
  qlora::ProgramFlagsOptions program;
  program.program = "qlora-coordinator";
  program.usage =
      "qlora-coordinator --address=HOST:PORT --state-dir=DIR [--cpu-workers=N | --gpus=0,1]\n"
      "Queues QLoRA fine-tuning jobs and runs each on one worker process per GPU (or CPU slot).";
  program.flag_files = {"coordinator_main.cc"};
  program.dashed_names = true;
  std::vector<std::string> arg_storage;
  std::vector<char*> args = DashesToUnderscores(argc, argv, &arg_storage);
  qlora::ParseProgramFlags(static_cast<int>(args.size()), args.data(), program);

  // SIGINT/SIGTERM are taken by a waiting thread: block them before any thread starts.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  const std::string address = absl::GetFlag(FLAGS_address);
  qlora::coordinator::ServerTlsOptions tls;
  tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  tls.key_file = absl::GetFlag(FLAGS_tls_key);
  tls.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  qlora::coordinator::AuthOptions auth_options;
  auth_options.tokens_file = absl::GetFlag(FLAGS_auth_tokens);
  auth_options.client_certificates = !tls.client_ca_file.empty();
  const qlora::coordinator::ListenSecurity security{
      .tls = !tls.cert_file.empty(),
      .authentication = !auth_options.tokens_file.empty() || auth_options.client_certificates,
      .insecure = absl::GetFlag(FLAGS_insecure)};
  if (absl::Status allowed = qlora::coordinator::CheckListenAddress(address, security); !allowed.ok()) {
    fprintf(stderr, "qlora-coordinator: %s\n", std::string(allowed.message()).c_str());
    return 2;
  }
  if (qlora::coordinator::IsExposedInsecurely(address, security)) {
    fprintf(stderr, "qlora-coordinator: INSECURE: listening on %s without %s (--insecure): anyone "
            "who reaches it can submit, read and cancel jobs\n",
            address.c_str(), security.tls ? "client authentication" : "TLS and client authentication");
  }
  const std::string metrics_address = absl::GetFlag(FLAGS_metrics_address);
  if (!metrics_address.empty() && !qlora::coordinator::IsLoopbackAddress(metrics_address) &&
      !security.insecure) {
    fprintf(stderr, "qlora-coordinator: --metrics-address %s is not a loopback address: the port speaks "
            "plain HTTP, so job data and bearer tokens would cross the network in clear; listen on "
            "127.0.0.1 (behind a TLS proxy) or pass --insecure\n", metrics_address.c_str());
    return 2;
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      qlora::coordinator::MakeServerCredentials(tls);
  if (!credentials.ok()) {
    fprintf(stderr, "qlora-coordinator: %s\n", std::string(credentials.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<std::unique_ptr<qlora::coordinator::Authenticator>> auth =
      qlora::coordinator::Authenticator::Create(auth_options);
  if (!auth.ok()) {
    fprintf(stderr, "qlora-coordinator: %s\n", std::string(auth.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<qlora::coordinator::JobManagerOptions> flags = OptionsFromFlags();
  if (!flags.ok()) {
    fprintf(stderr, "qlora-coordinator: %s\n", std::string(flags.status().message()).c_str());
    return 2;
  }
  qlora::coordinator::JobManagerOptions options = *std::move(flags);
  HealthSwitch health;
  // The metrics exist (and the RPCs are timed) only when they are served.
  std::unique_ptr<qlora::coordinator::CoordinatorMetrics> metrics;
  if (!metrics_address.empty()) {
    std::set<std::string> methods = qlora::coordinator::RpcMethodNames(
        {"qlora.v1.JobService", "qlora.v1.WorkerService", "grpc.reflection.v1alpha.ServerReflection"});
    methods.insert({"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"});
    metrics = std::make_unique<qlora::coordinator::CoordinatorMetrics>(std::move(methods));
    options.on_worker_exit = [m = metrics.get()](const qlora::coordinator::WorkerExit& exit) {
      m->CountWorkerExit(exit);
    };
  }
  options.on_unhealthy = [&health](const absl::Status&) { health.Fail(); };
  absl::StatusOr<StateDir> state = OpenStateDir(options.state_dir);
  if (!state.ok()) {
    fprintf(stderr, "qlora-coordinator: %s\n", std::string(state.status().message()).c_str());
    return 1;
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  qlora::coordinator::PosixProcessLauncher launcher;
  std::unique_ptr<qlora::coordinator::RayWorkerLauncher> ray;
  if (const std::string ray_address = absl::GetFlag(FLAGS_ray_address); !ray_address.empty()) {
    if (absl::GetFlag(FLAGS_advertise_address).empty()) {
      fprintf(stderr, "qlora-coordinator: --ray-address needs --advertise-address HOST:PORT, an address of "
                      "this coordinator that the cluster's hosts can reach\n");
      return 2;
    }
    qlora::coordinator::RayLauncherOptions ray_options;
    ray_options.address = ray_address;
    ray_options.python = absl::GetFlag(FLAGS_ray_python);
    ray_options.launcher_script = absl::GetFlag(FLAGS_ray_launcher_script);
    if (ray_options.launcher_script.empty()) {
      ray_options.launcher_script =
          (std::filesystem::path(options.worker_binary).parent_path() / "qlora_ray_launcher.py").string();
    }
    ray_options.placement_timeout = options.register_timeout;
    ray_options.stop_grace = options.stop_grace;
    ray = std::make_unique<qlora::coordinator::RayWorkerLauncher>(ray_options);
  }
  // The stored jobs are loaded before the first request is served; workers are only spawned by
  // the monitor, started once the bound port is known.
  qlora::coordinator::JobManager manager(options, state->store.get(), &launcher, ray.get());
  if (absl::Status loaded = manager.Load(); !loaded.ok()) {
    fprintf(stderr, "qlora-coordinator: %s\n", std::string(loaded.message()).c_str());
    return 1;
  }
  qlora::coordinator::JobServiceOptions service_options;
  service_options.max_streams = absl::GetFlag(FLAGS_max_streams);
  service_options.max_streams_per_user = absl::GetFlag(FLAGS_max_streams_per_user);
  qlora::coordinator::JobServiceImpl job_service(&manager, auth->get(), service_options);
  qlora::coordinator::WorkerServiceImpl worker_service(&manager);
  const std::string host = address.substr(0, address.rfind(':'));
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, *credentials, &port);
  builder.RegisterService(&job_service);
  builder.RegisterService(&worker_service);
  if (metrics) {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
    interceptors.push_back(qlora::coordinator::MakeRpcMetricsInterceptorFactory(metrics.get()));
    builder.experimental().SetInterceptorCreators(std::move(interceptors));
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    fprintf(stderr, "qlora-coordinator: cannot listen on %s\n", address.c_str());
    return 1;
  }
  // Local workers dial a wildcard address as 127.0.0.1; workers elsewhere need the advertised one.
  const bool wildcard = host.empty() || host == "0.0.0.0" || host == "[::]";
  std::string bound = absl::StrCat(wildcard ? "127.0.0.1" : host, ":", port);
  if (std::string advertised = absl::GetFlag(FLAGS_advertise_address); !advertised.empty()) {
    if (absl::EndsWith(advertised, ":0")) advertised = absl::StrCat(advertised.substr(0, advertised.size() - 2), ":", port);
    bound = advertised;
  }
  manager.SetCoordinatorAddress(bound);
  manager.StartMonitor();
  health.Serve(server->GetHealthCheckService());  // NOT_SERVING if already unhealthy (Load)
  std::unique_ptr<grpc::Server> health_server;
  if (const std::string health_address = absl::GetFlag(FLAGS_health_address); !health_address.empty()) {
    int health_port = 0;
    grpc::ServerBuilder health_builder;  // the default health service only
    health_builder.AddListeningPort(health_address, grpc::InsecureServerCredentials(), &health_port);
    health_server = health_builder.BuildAndStart();
    if (!health_server || health_port == 0) {
      fprintf(stderr, "qlora-coordinator: cannot listen on --health-address %s\n", health_address.c_str());
      return 1;
    }
    health.Serve(health_server->GetHealthCheckService());
    printf("qlora-coordinator: health (plaintext) on %s:%d\n",
           health_address.substr(0, health_address.rfind(':')).c_str(), health_port);
  }
  std::unique_ptr<qlora::coordinator::StatusSite> site;
  std::unique_ptr<qlora::coordinator::HttpServer> http;
  if (metrics) {
    site = std::make_unique<qlora::coordinator::StatusSite>(
        qlora::coordinator::StatusSiteOptions{.store_path = options.state_dir + "/jobs.sqlite"}, &manager,
        auth->get(), metrics.get());
    absl::StatusOr<std::unique_ptr<qlora::coordinator::HttpServer>> started = qlora::coordinator::HttpServer::Start(
        {.address = metrics_address},
        [s = site.get()](const qlora::coordinator::HttpServerRequest& request) { return s->Handle(request); });
    if (!started.ok()) {
      fprintf(stderr, "qlora-coordinator: --metrics-address: %s\n", std::string(started.status().message()).c_str());
      return 1;
    }
    http = *std::move(started);
    printf("qlora-coordinator: metrics and status page (HTTP%s) on %s:%d\n",
           (*auth)->enabled() ? ", bearer tokens" : "", metrics_address.substr(0, metrics_address.rfind(':')).c_str(),
           http->port());
    if (!qlora::coordinator::IsLoopbackAddress(metrics_address)) {
      fprintf(stderr, "qlora-coordinator: INSECURE: --metrics-address %s serves plain HTTP beyond this host\n",
              metrics_address.c_str());
    }
  }
  printf("qlora-coordinator listening on %s (state %s, %s; %s, %s)\n", bound.c_str(),
         options.state_dir.c_str(),
         options.gpus.empty() ? absl::StrCat(options.cpu_workers, " CPU workers").c_str()
                              : absl::StrCat(options.gpus.size(), " GPUs").c_str(),
         security.tls ? (tls.client_ca_file.empty() ? "TLS" : "TLS with client certificates") : "plaintext",
         security.authentication ? "authentication on" : "authentication off");
  if (ray) printf("qlora-coordinator: jobs with backend.type: ray run on %s\n", ray->Describe().c_str());
  printf("qlora-coordinator: jobs read from %s and write to %s\n",
         options.roots.read.empty() ? "any path (no --read-roots)" : absl::StrJoin(options.roots.read, ",").c_str(),
         options.roots.output.empty() ? "any path (no --output-root)" : options.roots.output.c_str());
  fflush(stdout);
  if (http) WritePortFile(absl::GetFlag(FLAGS_metrics_port_file), http->port());
  WritePortFile(absl::GetFlag(FLAGS_port_file), port);

  int signal_number = 0;
  // SIGHUP re-reads the tokens file; SIGINT / SIGTERM stop.
  while (sigwait(&stop_signals, &signal_number) == 0 && signal_number == SIGHUP) {
    const absl::Status reloaded = (*auth)->Reload();
    fprintf(stderr, "qlora-coordinator: SIGHUP: %s\n",
            reloaded.ok() ? "tokens file re-read" : absl::StrCat("kept the previous tokens: ", reloaded.message()).c_str());
  }
  fprintf(stderr, "qlora-coordinator: %s, shutting down\n", strsignal(signal_number));
  health.Fail();
  // Health says NOT_SERVING for a moment before the listener closes, so probes can see it.
  usleep(absl::GetFlag(FLAGS_shutdown_grace_ms) * 1000);
  http.reset();  // no request is in flight on the manager past this
  manager.Shutdown();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (health_server) health_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return 0;
}
