// qloractl's connection to the coordinator: the address, TLS and credentials from flags or the
// environment, and the deadline every call carries. A token is read from a file (--token-file,
// $QLORA_TOKEN_FILE) or $QLORA_TOKEN, never from the command line, where `ps` would show it.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/client_context.h>

#include "absl/status/statusor.h"
#include "cli/cli_args.h"
#include "qlora/v1/job_service.grpc.pb.h"

namespace qlora::cli {

class Client {
 public:
  // From --address ($QLORA_ADDRESS, else 127.0.0.1:50051), --tls-ca / --tls-cert / --tls-key /
  // --tls-server-name ($QLORA_TLS_*), --token-file ($QLORA_TOKEN_FILE, else $QLORA_TOKEN) and
  // --timeout (seconds, default 30). INVALID_ARGUMENT naming what is wrong.
  static absl::StatusOr<std::unique_ptr<Client>> FromArgs(const ParsedArgs& args);

  v1::JobService::Stub* stub() { return stub_.get(); }
  const std::string& address() const { return address_; }
  // Adds the credentials to `ctx` and, for a call that must end (not a followed stream), the
  // deadline.
  void Prepare(grpc::ClientContext* ctx, bool with_deadline = true) const;

 private:
  std::unique_ptr<v1::JobService::Stub> stub_;
  std::string address_;
  std::string token_;
  int timeout_s_ = 30;
};

}  // namespace qlora::cli
