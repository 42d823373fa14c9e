// A gRPC server interceptor that times every call (from the call's start to the status it sends)
// and reports it to CoordinatorMetrics under its method and status code. Added to the server
// builder with builder.experimental().SetInterceptorCreators(...).
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include <grpcpp/support/server_interceptor.h>

#include "coordinator/http/metrics.h"

namespace qlora::coordinator {

// Creates one interceptor per call. `metrics` outlives the server.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeRpcMetricsInterceptorFactory(
    CoordinatorMetrics* metrics);

// "/pkg.Service/Method" of every method of the named services (from the linked-in descriptors):
// the methods counted under their own name (CoordinatorMetrics).
std::set<std::string> RpcMethodNames(const std::vector<std::string>& services);

}  // namespace qlora::coordinator
