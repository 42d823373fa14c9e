// The hparams plugin's summaries, encoded by hand (see hparams_summary.h).
#include "common/tensorboard/hparams_summary.h"

#include "common/tensorboard/wire_format.h"

namespace qlora::tensorboard {
namespace {

using wire::PutBytes;
using wire::PutDouble;
using wire::PutUint;

// tensorboard.hparams.DataType and Status.
constexpr int kTypeString = 1, kTypeBool = 2, kTypeFloat64 = 3;
constexpr int kStatusSuccess = 1, kStatusFailure = 2;

// google.protobuf.Value: number_value 2, string_value 3, bool_value 4.
std::string ProtobufValue(const HParam& p) {
  std::string out;
  if (const double* number = std::get_if<double>(&p.value)) {
    PutDouble(2, *number, &out);
  } else if (const bool* flag = std::get_if<bool>(&p.value)) {
    PutUint(4, *flag ? 1 : 0, &out);
  } else {
    PutBytes(3, std::get<std::string>(p.value), &out);
  }
  return out;
}

int TypeOf(const HParam& p) {
  if (std::holds_alternative<double>(p.value)) return kTypeFloat64;
  return std::holds_alternative<bool>(p.value) ? kTypeBool : kTypeString;
}

// Summary { value { tag, metadata { plugin_data { plugin_name, content } }, tensor } }.
std::string PluginSummary(const std::string& tag, const char* plugin_name, const std::string& content,
                          const std::string& tensor) {
  std::string plugin_data;
  PutBytes(1, plugin_name, &plugin_data);
  if (!content.empty()) PutBytes(2, content, &plugin_data);
  std::string metadata;
  PutBytes(1, plugin_data, &metadata);
  std::string value;
  PutBytes(1, tag, &value);
  PutBytes(9, metadata, &value);
  PutBytes(8, tensor, &value);
  std::string summary;
  PutBytes(1, value, &summary);
  return summary;
}

// The hparams plugin's summary: the empty DT_FLOAT tensor around HParamsPluginData
// { version: 0, <field>: message }.
std::string Summary(const char* tag, int plugin_data_field, const std::string& message) {
  std::string plugin_data_content;
  PutUint(1, 0, &plugin_data_content);  // version
  PutBytes(plugin_data_field, message, &plugin_data_content);
  std::string shape;  // TensorShapeProto { dim {} }: one dimension of size 0
  PutBytes(2, "", &shape);
  std::string tensor;
  PutUint(1, 1, &tensor);  // DT_FLOAT
  PutBytes(2, shape, &tensor);
  return PluginSummary(tag, "hparams", plugin_data_content, tensor);
}

}  // namespace

std::string HParamsExperimentSummary(const std::vector<HParam>& hparams, const std::vector<std::string>& metric_tags,
                                     double time_created) {
  std::string experiment;
  PutDouble(3, time_created, &experiment);
  for (const HParam& p : hparams) {
    std::string info;  // HParamInfo { name 1, type 4 }
    PutBytes(1, p.name, &info);
    PutUint(4, static_cast<uint64_t>(TypeOf(p)), &info);
    PutBytes(4, info, &experiment);
  }
  for (const std::string& tag : metric_tags) {
    std::string name;  // MetricName { group 1, tag 2 }: the group is the run's subfolder, none here
    PutBytes(2, tag, &name);
    std::string info;  // MetricInfo { name 1 }
    PutBytes(1, name, &info);
    PutBytes(5, info, &experiment);
  }
  return Summary("_hparams_/experiment", 2, experiment);
}

std::string HParamsSessionStartSummary(const std::vector<HParam>& hparams, double start_time) {
  std::string start;
  for (const HParam& p : hparams) {
    std::string entry;  // map<string, Value> entry { key 1, value 2 }
    PutBytes(1, p.name, &entry);
    PutBytes(2, ProtobufValue(p), &entry);
    PutBytes(1, entry, &start);
  }
  PutDouble(5, start_time, &start);
  return Summary("_hparams_/session_start_info", 3, start);
}

std::string HParamsSessionEndSummary(bool succeeded, double end_time) {
  std::string end;
  PutUint(1, succeeded ? kStatusSuccess : kStatusFailure, &end);
  PutDouble(2, end_time, &end);
  return Summary("_hparams_/session_end_info", 4, end);
}

std::string TextSummary(const std::string& tag, const std::string& markdown) {
  std::string tensor;
  PutUint(1, 7, &tensor);           // DT_STRING
  PutBytes(2, "", &tensor);         // a scalar: a shape without dimensions
  PutBytes(8, markdown, &tensor);   // string_val
  return PluginSummary(tag, "text", "", tensor);  // the text plugin's content stays empty
}

}  // namespace qlora::tensorboard
