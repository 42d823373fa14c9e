// Times gRPC calls for the metrics (see rpc_metrics_interceptor.h).
#include "coordinator/http/rpc_metrics_interceptor.h"

#include <google/protobuf/descriptor.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace qlora::coordinator {
namespace {

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::OK: return "OK";
    case grpc::CANCELLED: return "CANCELLED";
    case grpc::UNKNOWN: return "UNKNOWN";
    case grpc::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::NOT_FOUND: return "NOT_FOUND";
    case grpc::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::ABORTED: return "ABORTED";
    case grpc::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::INTERNAL: return "INTERNAL";
    case grpc::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::DATA_LOSS: return "DATA_LOSS";
    case grpc::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "OTHER";
  }
}

class RpcMetricsInterceptor final : public grpc::experimental::Interceptor {
 public:
  RpcMetricsInterceptor(CoordinatorMetrics* metrics, const char* method)
      : metrics_(metrics), method_(method == nullptr ? "" : method), start_(absl::Now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      metrics_->ObserveRpc(method_, CodeName(methods->GetSendStatus().error_code()),
                           absl::ToDoubleSeconds(absl::Now() - start_));
    }
    methods->Proceed();
  }

 private:
  CoordinatorMetrics* const metrics_;
  const std::string method_;
  const absl::Time start_;
};

class RpcMetricsInterceptorFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcMetricsInterceptorFactory(CoordinatorMetrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    return new RpcMetricsInterceptor(metrics_, info->method());
  }

 private:
  CoordinatorMetrics* const metrics_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeRpcMetricsInterceptorFactory(
    CoordinatorMetrics* metrics) {
  return std::make_unique<RpcMetricsInterceptorFactory>(metrics);
}

std::set<std::string> RpcMethodNames(const std::vector<std::string>& services) {
  std::set<std::string> names;
  const google::protobuf::DescriptorPool* pool = google::protobuf::DescriptorPool::generated_pool();
  for (const std::string& service : services) {
    const google::protobuf::ServiceDescriptor* d = pool->FindServiceByName(service);
    if (d == nullptr) continue;
    for (int i = 0; i < d->method_count(); ++i) {
      names.insert(absl::StrCat("/", service, "/", d->method(i)->name()));
    }
  }
  return names;
}

}  // namespace qlora::coordinator
