// RunCoordinator: the daemon's whole life from resolved options to a signal: the state folder
// locked and loaded, the gRPC server (JobService, WorkerService, grpc.health.v1, reflection),
// the optional plaintext health port and HTTP port, then SIGHUP (tokens re-read) until SIGINT or
// SIGTERM, and an orderly stop. qlora-coordinator's main only turns flags into these options.
#pragma once

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "coordinator/auth/authenticator.h"
#include "coordinator/auth/server_tls.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/launch/ray/ray_worker_launcher.h"
#include "coordinator/rpc/job_service.h"

namespace qlora::coordinator {

struct CoordinatorOptions {
  std::string address = "127.0.0.1:50051";  // host:port; port 0 picks a free one
  bool insecure = false;                     // allow a non-loopback address without TLS and auth
  ServerTlsOptions tls;
  AuthOptions auth;
  std::string health_address;     // also grpc.health alone, plaintext, here ("" = off)
  std::string metrics_address;    // Prometheus /metrics and the status page ("" = off)
  std::string advertise_address;  // what workers dial ("" = the bound address)
  std::optional<RayLauncherOptions> ray;  // jobs with backend.type: ray run there
  JobManagerOptions job_manager;
  JobServiceOptions job_service;
  std::string port_file;          // the bound port is written here once serving
  std::string metrics_port_file;  // the HTTP port likewise
  absl::Duration shutdown_grace = absl::Milliseconds(500);  // NOT_SERVING before closing
  // The file-mode creation mask of the coordinator and of the workers it starts: everything in
  // the state folder (the store, logs, job files, adapters) is private to this user by default.
  // 027 lets the folder's group read (an operator group; docs/security.md).
  unsigned state_umask = 077;
};

// Serves until SIGINT or SIGTERM, then returns OK. A state folder that others may read more than
// `state_umask` allows is named in a warning at start (an existing folder keeps its mode). INVALID_ARGUMENT: the options are refused
// before anything starts (an unsafe listen address, unreadable TLS or tokens files, Ray without
// an advertised address); any other error: the state folder or a port could not be taken.
absl::Status RunCoordinator(CoordinatorOptions options);

}  // namespace qlora::coordinator
