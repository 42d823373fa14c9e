// Ray's Job Submission REST API (see ray_job_api.h).
#include "coordinator/launch/ray/ray_job_api.h"

#include <nlohmann/json.hpp>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace qlora::coordinator {
namespace {

using nlohmann::json;

std::string StringOr(const json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : "";
}

RayJobInfo InfoOf(const json& j) {
  RayJobInfo info;
  info.submission_id = StringOr(j, "submission_id");
  info.status = StringOr(j, "status");
  info.message = StringOr(j, "message");
  if (auto m = j.find("metadata"); m != j.end() && m->is_object()) {
    for (auto it = m->begin(); it != m->end(); ++it) {
      if (it.value().is_string()) info.metadata[it.key()] = it.value().get<std::string>();
    }
  }
  return info;
}

}  // namespace

bool RayJobInfo::terminal() const {
  return status == "STOPPED" || status == "SUCCEEDED" || status == "FAILED";
}

absl::StatusOr<RayJobInfo> ParseRayJobInfo(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::DataLossError("Ray job info: not a JSON object");
  return InfoOf(j);
}

absl::StatusOr<std::vector<RayJobInfo>> ParseRayJobList(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  if (!j.is_array()) return absl::DataLossError("Ray job list: not a JSON array");
  std::vector<RayJobInfo> jobs;
  for (const json& e : j) {
    if (e.is_object()) jobs.push_back(InfoOf(e));
  }
  return jobs;
}

absl::StatusOr<LauncherCapacity> ParseRayClusterCapacity(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  const json* usage = nullptr;
  if (j.is_object()) {
    const json::json_pointer path("/data/clusterStatus/loadMetricsReport/usage");
    if (j.contains(path) && j.at(path).is_object()) usage = &j.at(path);
  }
  if (usage == nullptr) return absl::DataLossError("Ray cluster status: no loadMetricsReport.usage");
  LauncherCapacity capacity;
  auto total = [&](const char* resource) {
    auto it = usage->find(resource);
    if (it == usage->end() || !it->is_array() || it->size() != 2 || !(*it)[1].is_number()) return 0;
    return static_cast<int>((*it)[1].get<double>());
  };
  capacity.cpus = total("CPU");
  capacity.gpus = total("GPU");
  // Every live node has the resource "node:<its address>" (the head also "node:InternalHead"
  // or "node:__internal_head__", which are not addresses).
  for (auto it = usage->begin(); it != usage->end(); ++it) {
    const std::string& key = it.key();
    if (key.rfind("node:", 0) == 0 && key.find("nternal") == std::string::npos) ++capacity.hosts;
  }
  capacity.known = true;
  return capacity;
}

std::string RaySubmissionJson(const RaySubmission& s) {
  json j;
  j["submission_id"] = s.submission_id;
  j["entrypoint"] = s.entrypoint;
  j["runtime_env"]["env_vars"] = s.env_vars;
  j["metadata"] = s.metadata;
  return j.dump();
}

RayJobApi::RayJobApi(std::string address, const HttpClient* http)
    : address_(std::string(absl::StripSuffix(address, "/"))), http_(http) {}

absl::StatusOr<std::string> RayJobApi::Call(const std::string& what, const std::string& path,
                                            const std::string* post_json) const {
  const std::string url = absl::StrCat(address_, path);
  absl::StatusOr<HttpResponse> r = post_json ? http_->PostJson(url, *post_json) : http_->Get(url);
  if (!r.ok()) {
    return absl::UnavailableError(absl::StrCat("Ray cluster at ", address_, ": ", what, ": ", r.status().message()));
  }
  if (r->status != 200) {
    const absl::StatusCode code = r->status == 404 ? absl::StatusCode::kNotFound : absl::StatusCode::kUnavailable;
    return absl::Status(code, absl::StrCat("Ray cluster at ", address_, ": ", what, ": HTTP ", r->status, ": ",
                                           r->body.substr(0, 300)));
  }
  return std::move(r->body);
}

absl::Status RayJobApi::Submit(const RaySubmission& submission) const {
  const std::string body = RaySubmissionJson(submission);
  return Call(absl::StrCat("submit ", submission.submission_id), "/api/jobs/", &body).status();
}

absl::StatusOr<RayJobInfo> RayJobApi::Get(const std::string& id) const {
  absl::StatusOr<std::string> body = Call(absl::StrCat("status of ", id), absl::StrCat("/api/jobs/", id), nullptr);
  if (!body.ok()) return body.status();
  return ParseRayJobInfo(*body);
}

absl::StatusOr<std::string> RayJobApi::Logs(const std::string& id) const {
  absl::StatusOr<std::string> body = Call(absl::StrCat("logs of ", id), absl::StrCat("/api/jobs/", id, "/logs"), nullptr);
  if (!body.ok()) return body.status();
  json j = json::parse(*body, nullptr, false);
  if (!j.is_object() || !j.contains("logs") || !j["logs"].is_string()) {
    return absl::DataLossError(absl::StrCat("logs of ", id, ": no \"logs\" string in the answer"));
  }
  return j["logs"].get<std::string>();
}

absl::Status RayJobApi::Stop(const std::string& id) const {
  const std::string empty = "{}";
  return Call(absl::StrCat("stop ", id), absl::StrCat("/api/jobs/", id, "/stop"), &empty).status();
}

absl::StatusOr<std::vector<RayJobInfo>> RayJobApi::List() const {
  absl::StatusOr<std::string> body = Call("list jobs", "/api/jobs/", nullptr);
  if (!body.ok()) return body.status();
  return ParseRayJobList(*body);
}

absl::StatusOr<LauncherCapacity> RayJobApi::Capacity() const {
  absl::StatusOr<std::string> body = Call("cluster status", "/api/cluster_status", nullptr);
  if (!body.ok()) return body.status();
  return ParseRayClusterCapacity(*body);
}

}  // namespace qlora::coordinator
