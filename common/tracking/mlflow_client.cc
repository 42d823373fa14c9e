// MlflowClient (see mlflow_client.h).
#include "common/tracking/mlflow_client.h"

#include <cstdlib>

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace qlora::tracking {
namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

HttpClientOptions WithCredentials(const MlflowSettings& s, HttpClientOptions http) {
  if (!s.token.empty()) {
    http.headers.push_back(absl::StrCat("Authorization: Bearer ", s.token));
  } else if (!s.username.empty()) {
    http.headers.push_back(
        absl::StrCat("Authorization: Basic ", absl::Base64Escape(absl::StrCat(s.username, ":", s.password))));
  }
  return http;
}

// Percent-encodes a query value.
std::string QueryValue(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += absl::StrCat("%", absl::Hex(c, absl::kZeroPad2));
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<MlflowSettings> MlflowSettingsFromEnvironment() {
  MlflowSettings s;
  s.tracking_uri = Env("MLFLOW_TRACKING_URI");
  if (!absl::StartsWith(s.tracking_uri, "http://") && !absl::StartsWith(s.tracking_uri, "https://")) {
    return absl::FailedPreconditionError(absl::StrCat(
        "report_to mlflow needs MLFLOW_TRACKING_URI set to the tracking server's http(s) address "
        "in the coordinator's environment (it is '", s.tracking_uri, "')"));
  }
  while (absl::EndsWith(s.tracking_uri, "/")) s.tracking_uri.pop_back();
  if (std::string name = Env("MLFLOW_EXPERIMENT_NAME"); !name.empty()) s.experiment_name = name;
  s.run_name = Env("MLFLOW_RUN_NAME");
  s.token = Env("MLFLOW_TRACKING_TOKEN");
  s.username = Env("MLFLOW_TRACKING_USERNAME");
  s.password = Env("MLFLOW_TRACKING_PASSWORD");
  return s;
}

MlflowClient::MlflowClient(const MlflowSettings& settings, HttpClientOptions http)
    : base_(settings.tracking_uri), http_(WithCredentials(settings, std::move(http))) {}

absl::StatusOr<std::string> MlflowClient::Call(const std::string& method, const std::string* json) const {
  const std::string url = absl::StrCat(base_, "/api/2.0/mlflow/", method);
  absl::StatusOr<HttpResponse> response = json != nullptr ? http_.PostJson(url, *json) : http_.Get(url);
  if (!response.ok()) return response.status();
  if (response->status / 100 == 2) return std::move(response->body);
  const nlohmann::json error = nlohmann::json::parse(response->body, nullptr, false);
  const std::string code = error.is_object() ? error.value("error_code", "") : "";
  const std::string message = error.is_object() ? error.value("message", "") : response->body.substr(0, 200);
  const std::string what = absl::StrCat("MLflow ", method.substr(0, method.find('?')), ": HTTP ",
                                        response->status, " ", code, " ", message);
  if (code == "RESOURCE_DOES_NOT_EXIST") return absl::NotFoundError(what);
  if (response->status == 401 || response->status == 403) return absl::PermissionDeniedError(what);
  if (response->status / 100 == 4) return absl::InvalidArgumentError(what);
  return absl::UnavailableError(what);
}

absl::StatusOr<std::string> MlflowClient::ExperimentId(const std::string& name) const {
  absl::StatusOr<std::string> found =
      Call(absl::StrCat("experiments/get-by-name?experiment_name=", QueryValue(name)), nullptr);
  if (found.ok()) {
    const nlohmann::json j = nlohmann::json::parse(*found, nullptr, false);
    if (j.is_object() && j.contains("experiment")) return j["experiment"].value("experiment_id", "");
  } else if (!absl::IsNotFound(found.status())) {
    return found.status();
  }
  const std::string body = nlohmann::json{{"name", name}}.dump();
  absl::StatusOr<std::string> made = Call("experiments/create", &body);
  if (!made.ok()) return made.status();
  const nlohmann::json j = nlohmann::json::parse(*made, nullptr, false);
  if (!j.is_object() || !j.contains("experiment_id")) return absl::UnavailableError("MLflow experiments/create: no id");
  return j["experiment_id"].get<std::string>();
}

absl::StatusOr<MlflowRun> MlflowClient::CreateRun(const std::string& experiment_id, const std::string& run_name,
                                                  int64_t start_ms,
                                                  const std::map<std::string, std::string>& tags) const {
  nlohmann::json body = {{"experiment_id", experiment_id}, {"start_time", start_ms}};
  if (!run_name.empty()) body["run_name"] = run_name;
  body["tags"] = nlohmann::json::array();
  for (const auto& [key, value] : tags) body["tags"].push_back({{"key", key}, {"value", value}});
  const std::string text = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  absl::StatusOr<std::string> answer = Call("runs/create", &text);
  if (!answer.ok()) return answer.status();
  const nlohmann::json j = nlohmann::json::parse(*answer, nullptr, false);
  if (!j.is_object() || !j.contains("run")) return absl::UnavailableError("MLflow runs/create: no run");
  MlflowRun run;
  run.run_id = j["run"]["info"].value("run_id", "");
  run.artifact_uri = j["run"]["info"].value("artifact_uri", "");
  return run;
}

absl::Status MlflowClient::LogBatch(const std::string& run_id, const std::vector<MlflowMetric>& metrics,
                                    const std::vector<std::pair<std::string, std::string>>& params) const {
  constexpr size_t kMaxParamValue = 6000;
  nlohmann::json body = {{"run_id", run_id}, {"metrics", nlohmann::json::array()},
                         {"params", nlohmann::json::array()}};
  for (const MlflowMetric& m : metrics) {
    body["metrics"].push_back({{"key", m.key}, {"value", m.value}, {"timestamp", m.timestamp_ms}, {"step", m.step}});
  }
  for (const auto& [key, value] : params) {
    body["params"].push_back({{"key", key}, {"value", value.substr(0, kMaxParamValue)}});
  }
  const std::string text = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return Call("runs/log-batch", &text).status();
}

absl::Status MlflowClient::EndRun(const std::string& run_id, const std::string& status, int64_t end_ms) const {
  const std::string body = nlohmann::json{{"run_id", run_id}, {"status", status}, {"end_time", end_ms}}.dump();
  return Call("runs/update", &body).status();
}

absl::Status MlflowClient::UploadArtifact(const MlflowRun& run, const std::string& path,
                                          const std::string& bytes) const {
  constexpr absl::string_view kProxied = "mlflow-artifacts:/";
  if (!absl::StartsWith(run.artifact_uri, kProxied)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the run's artifacts go to ", run.artifact_uri,
        ", which only the server's artifact proxy can take from here: start `mlflow server` with "
        "--serve-artifacts (its default)"));
  }
  const std::string url = absl::StrCat(base_, "/api/2.0/mlflow-artifacts/artifacts/",
                                       run.artifact_uri.substr(kProxied.size()), "/", path);
  absl::StatusOr<HttpResponse> response = http_.Put(url, bytes);
  if (!response.ok()) return response.status();
  if (response->status / 100 != 2) {
    return absl::UnavailableError(absl::StrCat("MLflow artifact upload of ", path, ": HTTP ", response->status));
  }
  return absl::OkStatus();
}

}  // namespace qlora::tracking
