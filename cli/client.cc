// qloractl's connection to the coordinator (see client.h).
#include "cli/client.h"

#include <chrono>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/posix_files.h"
#include "common/rpc/coordinator_channel.h"

namespace qlora::cli {
namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

absl::StatusOr<std::string> ReadToken(const ParsedArgs& args) {
  const std::string file = args.Get("--token-file", Env("QLORA_TOKEN_FILE"));
  if (file.empty()) return Env("QLORA_TOKEN");
  absl::StatusOr<std::string> text = ReadFile(file);
  if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat("token file: ", text.status().message()));
  std::string token(absl::StripAsciiWhitespace(*text));
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat("token file ", file, " is empty"));
  return token;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::FromArgs(const ParsedArgs& args) {
  auto client = std::unique_ptr<Client>(new Client());
  const std::string env_address = Env("QLORA_ADDRESS");
  const std::string address = args.Get("--address", env_address.empty() ? "127.0.0.1:50051" : env_address);
  ClientTlsOptions tls = ClientTlsFromEnvironment();
  if (args.values.count("--tls-ca")) tls.ca_file = args.Get("--tls-ca");
  if (args.values.count("--tls-cert")) tls.cert_file = args.Get("--tls-cert");
  if (args.values.count("--tls-key")) tls.key_file = args.Get("--tls-key");
  if (args.values.count("--tls-server-name")) tls.server_name = args.Get("--tls-server-name");
  tls.enabled = tls.enabled || !tls.ca_file.empty() || !tls.cert_file.empty() || args.Has("--tls");
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = DialCoordinator(address, tls);
  if (!channel.ok()) return channel.status();
  client->stub_ = v1::JobService::NewStub(*channel);
  client->address_ = address;
  absl::StatusOr<std::string> token = ReadToken(args);
  if (!token.ok()) return token.status();
  client->token_ = *std::move(token);
  if (args.values.count("--timeout") &&
      (!absl::SimpleAtoi(args.Get("--timeout"), &client->timeout_s_) || client->timeout_s_ <= 0)) {
    return absl::InvalidArgumentError("--timeout must be a positive number of seconds");
  }
  return client;
}

void Client::Prepare(grpc::ClientContext* ctx, bool with_deadline) const {
  if (!token_.empty()) ctx->AddMetadata(kAuthorizationHeader, BearerValue(token_));
  if (with_deadline) ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(timeout_s_));
}

}  // namespace qlora::cli
