// What a JobService call presented, read off its gRPC context: the bearer token of its
// `authorization` metadata and the common name of a client certificate that the TLS layer
// verified. The one place that knows where gRPC keeps them.
#pragma once

#include <grpcpp/server_context.h>

#include "coordinator/auth/authenticator.h"

namespace qlora::coordinator {

PresentedCredentials CredentialsOf(const grpc::ServerContext& context);

}  // namespace qlora::coordinator
