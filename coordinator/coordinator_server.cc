// The coordinator daemon's run, from options to a stop signal (see coordinator_server.h).
#include "coordinator/coordinator_server.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/worker_protocol.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "coordinator/auth/listen_policy.h"
#include "coordinator/http/http_server.h"
#include "coordinator/http/metrics.h"
#include "coordinator/http/rpc_metrics_interceptor.h"
#include "coordinator/http/status_site.h"
#include "coordinator/launch/process_launcher.h"
#include "coordinator/rpc/worker_service.h"
#include "coordinator/store/job_store.h"
#include "coordinator/store/state_lock.h"

namespace qlora::coordinator {
namespace {

// The state folder, locked for this process (one coordinator per folder), and its job store.
struct StateDir {
  StateDirLock lock;
  std::unique_ptr<JobStore> store;
};

absl::StatusOr<StateDir> OpenStateDir(const std::string& dir, unsigned umask_bits) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  // A new folder is made private by the umask; an existing one keeps its mode, so say so when
  // others may read it (jobs' files, logs and adapters would be theirs to read).
  struct stat st {};
  if (stat(dir.c_str(), &st) == 0 && (st.st_mode & 0777 & umask_bits) != 0) {
    fprintf(stderr, "qlora-coordinator: WARNING: the state folder %s has mode %04o: other users "
            "may read every job's files, logs and adapters; make it private with "
            "chmod -R go-rwx %s (or see --state-umask)\n", dir.c_str(), st.st_mode & 0777,
            dir.c_str());
  }
  QLORA_ASSIGN_OR_RETURN(StateDirLock lock, StateDirLock::Acquire(dir));
  QLORA_ASSIGN_OR_RETURN(std::unique_ptr<JobStore> store, JobStore::Open(dir + "/jobs.sqlite"));
  return StateDir{std::move(lock), std::move(store)};
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

// A refusal of the options themselves: the caller's mistake, whatever the cause's code.
absl::Status Refused(const absl::Status& status) {
  return status.ok() ? status : absl::InvalidArgumentError(status.message());
}

std::string Host(const std::string& address) { return address.substr(0, address.rfind(':')); }

}  // namespace

absl::Status RunCoordinator(CoordinatorOptions options) {
  // SIGINT/SIGTERM are taken by a waiting thread: block them before any thread starts.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  const ListenSecurity security{
      .tls = !options.tls.cert_file.empty(),
      .authentication = !options.auth.tokens_file.empty() || options.auth.client_certificates,
      .insecure = options.insecure};
  QLORA_RETURN_IF_ERROR(Refused(CheckListenAddress(options.address, security)));
  if (IsExposedInsecurely(options.address, security)) {
    fprintf(stderr, "qlora-coordinator: INSECURE: listening on %s without %s (--insecure): anyone "
            "who reaches it can submit, read and cancel jobs\n", options.address.c_str(),
            security.tls ? "client authentication" : "TLS and client authentication");
  }
  const std::string& metrics_address = options.metrics_address;
  if (!metrics_address.empty() && !IsLoopbackAddress(metrics_address) && !security.insecure) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics-address ", metrics_address, " is not a loopback address: the port speaks "
        "plain HTTP, so job data and bearer tokens would cross the network in clear; listen on "
        "127.0.0.1 (behind a TLS proxy) or pass --insecure"));
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      MakeServerCredentials(options.tls);
  QLORA_RETURN_IF_ERROR(Refused(credentials.status()));
  absl::StatusOr<std::unique_ptr<Authenticator>> auth = Authenticator::Create(options.auth);
  QLORA_RETURN_IF_ERROR(Refused(auth.status()));
  if (options.ray && options.advertise_address.empty()) {
    return absl::InvalidArgumentError(
        "--ray-address needs --advertise-address HOST:PORT, an address of this coordinator that "
        "the cluster's hosts can reach");
  }

  JobManagerOptions& manager_options = options.job_manager;
  HealthSwitch health;
  // The metrics exist (and the RPCs are timed) only when they are served.
  std::unique_ptr<CoordinatorMetrics> metrics;
  if (!metrics_address.empty()) {
    std::set<std::string> methods = RpcMethodNames(
        {"qlora.v1.JobService", "qlora.v1.WorkerService", "grpc.reflection.v1alpha.ServerReflection"});
    methods.insert({"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"});
    metrics = std::make_unique<CoordinatorMetrics>(std::move(methods));
    manager_options.on_worker_exit = [m = metrics.get()](const WorkerExit& exit) {
      m->CountWorkerExit(exit);
    };
  }
  manager_options.on_unhealthy = [&health](const absl::Status&) { health.Fail(); };
  // Before anything is created: the state folder, the store, the logs and the workers' outputs
  // (workers inherit the mask) are private unless the operator widens it.
  umask(options.state_umask & 0777);
  manager_options.worker_env[kWorkerUmaskVariable] = absl::StrFormat("%03o", options.state_umask & 0777);
  QLORA_ASSIGN_OR_RETURN(StateDir state,
                         OpenStateDir(manager_options.state_dir, options.state_umask & 0777));

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  PosixProcessLauncher launcher;
  std::unique_ptr<RayWorkerLauncher> ray;
  if (options.ray) ray = std::make_unique<RayWorkerLauncher>(*options.ray);
  // The stored jobs are loaded before the first request is served; workers are only spawned by
  // the monitor, started once the bound port is known.
  JobManager manager(manager_options, state.store.get(), &launcher, ray.get());
  QLORA_RETURN_IF_ERROR(manager.Load());
  GenerationSessions sessions(&manager);
  JobServiceImpl job_service(&manager, auth->get(), options.job_service, &sessions);
  WorkerServiceImpl worker_service(&manager, &sessions);
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.address, *credentials, &port);
  builder.RegisterService(&job_service);
  builder.RegisterService(&worker_service);
  if (metrics) {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
    interceptors.push_back(MakeRpcMetricsInterceptorFactory(metrics.get()));
    builder.experimental().SetInterceptorCreators(std::move(interceptors));
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.address));
  }
  // Local workers dial a wildcard address as 127.0.0.1; workers elsewhere need the advertised one.
  const std::string host = Host(options.address);
  const bool wildcard = host.empty() || host == "0.0.0.0" || host == "[::]";
  std::string bound = absl::StrCat(wildcard ? "127.0.0.1" : host, ":", port);
  if (std::string advertised = options.advertise_address; !advertised.empty()) {
    if (absl::EndsWith(advertised, ":0")) {
      advertised = absl::StrCat(advertised.substr(0, advertised.size() - 2), ":", port);
    }
    bound = advertised;
  }
  manager.SetCoordinatorAddress(bound);
  manager.StartMonitor();
  health.Serve(server->GetHealthCheckService());  // NOT_SERVING if already unhealthy (Load)
  std::unique_ptr<grpc::Server> health_server;
  if (!options.health_address.empty()) {
    int health_port = 0;
    grpc::ServerBuilder health_builder;  // the default health service only
    health_builder.AddListeningPort(options.health_address, grpc::InsecureServerCredentials(),
                                    &health_port);
    health_server = health_builder.BuildAndStart();
    if (!health_server || health_port == 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot listen on --health-address ", options.health_address));
    }
    health.Serve(health_server->GetHealthCheckService());
    printf("qlora-coordinator: health (plaintext) on %s:%d\n", Host(options.health_address).c_str(),
           health_port);
  }
  std::unique_ptr<StatusSite> site;
  std::unique_ptr<HttpServer> http;
  if (metrics) {
    site = std::make_unique<StatusSite>(
        StatusSiteOptions{.store_path = manager_options.state_dir + "/jobs.sqlite"}, &manager,
        auth->get(), metrics.get());
    absl::StatusOr<std::unique_ptr<HttpServer>> started = HttpServer::Start(
        {.address = metrics_address},
        [s = site.get()](const HttpServerRequest& request) { return s->Handle(request); });
    if (!started.ok()) {
      return absl::Status(started.status().code(),
                          absl::StrCat("--metrics-address: ", started.status().message()));
    }
    http = *std::move(started);
    printf("qlora-coordinator: metrics and status page (HTTP%s) on %s:%d\n",
           (*auth)->enabled() ? ", bearer tokens" : "", Host(metrics_address).c_str(), http->port());
    if (!IsLoopbackAddress(metrics_address)) {
      fprintf(stderr, "qlora-coordinator: INSECURE: --metrics-address %s serves plain HTTP beyond "
              "this host\n", metrics_address.c_str());
    }
  }
  printf("qlora-coordinator listening on %s (state %s, %s; %s, %s)\n", bound.c_str(),
         manager_options.state_dir.c_str(),
         manager_options.gpus.empty() ? absl::StrCat(manager_options.cpu_workers, " CPU workers").c_str()
                                      : absl::StrCat(manager_options.gpus.size(), " GPUs").c_str(),
         security.tls ? (options.tls.client_ca_file.empty() ? "TLS" : "TLS with client certificates")
                      : "plaintext",
         security.authentication ? "authentication on" : "authentication off");
  if (ray) printf("qlora-coordinator: jobs with backend.type: ray run on %s\n", ray->Describe().c_str());
  const PathRoots& roots = manager_options.roots;
  printf("qlora-coordinator: jobs read from %s and write to %s\n",
         roots.read.empty() ? "any path (no --read-roots)" : absl::StrJoin(roots.read, ",").c_str(),
         roots.output.empty() ? "any path (no --output-root)" : roots.output.c_str());
  fflush(stdout);
  if (http) WritePortFile(options.metrics_port_file, http->port());
  WritePortFile(options.port_file, port);

  int signal_number = 0;
  // SIGHUP re-reads the tokens file; SIGINT / SIGTERM stop.
  while (sigwait(&stop_signals, &signal_number) == 0 && signal_number == SIGHUP) {
    const absl::Status reloaded = (*auth)->Reload();
    fprintf(stderr, "qlora-coordinator: SIGHUP: %s\n",
            reloaded.ok() ? "tokens file re-read"
                          : absl::StrCat("kept the previous tokens: ", reloaded.message()).c_str());
  }
  fprintf(stderr, "qlora-coordinator: %s, shutting down\n", strsignal(signal_number));
  health.Fail();
  // Health says NOT_SERVING for a moment before the listener closes, so probes can see it.
  absl::SleepFor(options.shutdown_grace);
  http.reset();  // no request is in flight on the manager past this
  manager.Shutdown();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (health_server) health_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return absl::OkStatus();
}

}  // namespace qlora::coordinator
