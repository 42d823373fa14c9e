// qloractl watch -o json's lines (see event_json.h).
#include "cli/event_json.h"

#include <algorithm>
#include <cmath>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/reflection.h>

#include "cli/progress.h"
#include "nlohmann/json.hpp"

namespace qlora::cli {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

nlohmann::ordered_json Number(double v) {
  return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr);
}

nlohmann::ordered_json ToJson(const Message& message);

nlohmann::ordered_json FieldValue(const Message& m, const FieldDescriptor* f, int index) {
  const Reflection* r = m.GetReflection();
  const bool repeated = f->is_repeated();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return repeated ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f);
    case FieldDescriptor::CPPTYPE_INT64:
      return repeated ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f);
    case FieldDescriptor::CPPTYPE_UINT32:
      return repeated ? r->GetRepeatedUInt32(m, f, index) : r->GetUInt32(m, f);
    case FieldDescriptor::CPPTYPE_UINT64:
      return repeated ? r->GetRepeatedUInt64(m, f, index) : r->GetUInt64(m, f);
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return Number(repeated ? r->GetRepeatedDouble(m, f, index) : r->GetDouble(m, f));
    case FieldDescriptor::CPPTYPE_FLOAT:
      return Number(repeated ? r->GetRepeatedFloat(m, f, index) : r->GetFloat(m, f));
    case FieldDescriptor::CPPTYPE_BOOL:
      return repeated ? r->GetRepeatedBool(m, f, index) : r->GetBool(m, f);
    case FieldDescriptor::CPPTYPE_ENUM:
      return std::string((repeated ? r->GetRepeatedEnum(m, f, index) : r->GetEnum(m, f))->name());
    case FieldDescriptor::CPPTYPE_STRING:
      return repeated ? r->GetRepeatedString(m, f, index) : r->GetString(m, f);
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return ToJson(repeated ? r->GetRepeatedMessage(m, f, index) : r->GetMessage(m, f));
  }
  return nullptr;
}

nlohmann::ordered_json ToJson(const Message& message) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  const google::protobuf::Descriptor* d = message.GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) {
      nlohmann::ordered_json items = nlohmann::ordered_json::array();
      const int n = message.GetReflection()->FieldSize(message, f);
      for (int k = 0; k < n; ++k) items.push_back(FieldValue(message, f, k));
      out[std::string(f->name())] = std::move(items);
    } else {
      out[std::string(f->name())] = FieldValue(message, f, 0);
    }
  }
  return out;
}

}  // namespace

std::string MessageJson(const google::protobuf::Message& message) { return ToJson(message).dump(); }

std::vector<std::string> EventJson::Add(const v1::WatchJobResponse& response) {
  std::vector<std::string> lines;
  job_id_ = response.job().id();
  const v1::JobEvent& event = response.event();
  if (event.has_progress() && event.progress().step() > 0) {
    const v1::Progress& p = event.progress();
    pending_[p.step()][p.rank()] = p;
    const int world = p.strategy().world_size() > 0 ? p.strategy().world_size()
                                                    : response.job().num_workers();
    if (static_cast<int>(pending_[p.step()].size()) >= std::max(world, 1)) {
      // This step is whole: it and any earlier one some rank never reported go out in order.
      while (!pending_.empty() && pending_.begin()->first <= p.step()) {
        lines.push_back(StepLine(pending_.begin()->first));
        pending_.erase(pending_.begin());
      }
    }
    return lines;
  }
  if (event.has_progress()) return lines;  // a report before the first step: nothing to say
  lines = Flush();
  nlohmann::ordered_json state = {{"type", "state"},
                                  {"job", job_id_},
                                  {"sequence", event.sequence()},
                                  {"time_unix", event.time_unix()},
                                  {"state", v1::JobState_Name(event.state())},
                                  {"reason_code", event.reason_code()},
                                  {"message", event.message()}};
  if (IsTerminal(event.state())) {
    state["output_dir"] = response.job().output_dir();
    state["adapter_path"] = response.job().adapter_path();
  }
  lines.push_back(state.dump());
  return lines;
}

std::vector<std::string> EventJson::Flush() {
  std::vector<std::string> lines;
  for (const auto& [step, ranks] : pending_) lines.push_back(StepLine(step));
  pending_.clear();
  return lines;
}

std::string EventJson::StepLine(int64_t step) const {
  const std::map<int, v1::Progress>& ranks = pending_.at(step);
  const v1::Progress& first = ranks.begin()->second;
  double tokens_per_second = 0, elapsed = 0;
  nlohmann::ordered_json each = nlohmann::ordered_json::array();
  for (const auto& [rank, p] : ranks) {
    tokens_per_second += p.tokens_per_second();
    elapsed = std::max(elapsed, p.elapsed_seconds());
    each.push_back(ToJson(p));
  }
  nlohmann::ordered_json line = {{"type", "step"},
                                 {"job", job_id_},
                                 {"step", step},
                                 {"total_steps", first.total_steps()},
                                 {"epoch", first.epoch()},
                                 {"loss", Number(first.loss())},
                                 {"learning_rate", Number(first.learning_rate())},
                                 {"eval_loss", Number(first.eval_loss())},
                                 {"tokens_per_second", Number(tokens_per_second)},
                                 {"elapsed_seconds", Number(elapsed)},
                                 {"ranks", std::move(each)}};
  return line.dump();
}

}  // namespace qlora::cli
