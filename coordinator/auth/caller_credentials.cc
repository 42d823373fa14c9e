// Reading a call's credentials off its gRPC context (see caller_credentials.h).
#include "coordinator/auth/caller_credentials.h"

#include <grpcpp/security/auth_context.h>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "common/rpc/coordinator_channel.h"

namespace qlora::coordinator {

PresentedCredentials CredentialsOf(const grpc::ServerContext& context) {
  PresentedCredentials presented;
  const auto& metadata = context.client_metadata();
  if (auto it = metadata.find(kAuthorizationHeader); it != metadata.end()) {
    absl::string_view value(it->second.data(), it->second.size());
    constexpr absl::string_view kBearer = "Bearer ";
    // A malformed header counts as a token that matches nobody.
    presented.bearer_token = absl::StartsWithIgnoreCase(value, kBearer)
                                 ? std::string(value.substr(kBearer.size()))
                                 : std::string(value);
    if (presented.bearer_token.empty()) presented.bearer_token = " ";
  }
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  // The TLS layer sets the peer's names only for a certificate it verified.
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    for (const grpc::string_ref& name : auth->FindPropertyValues("x509_common_name")) {
      presented.certificate_user.assign(name.data(), name.size());
    }
  }
  return presented;
}

}  // namespace qlora::coordinator
