// Typed, checked reads from one YAML mapping of the job file.
#include "common/config/yaml_map_reader.h"

#include <cmath>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/text/utf8.h"

namespace qlora::config_internal {
namespace {

std::string FormatNumber(double v) {
  // Integers print without a fraction; others with up to 6 significant digits.
  if (std::abs(v) < 1e15 && v == std::floor(v)) return absl::StrCat(static_cast<int64_t>(v));
  return absl::StrCat(v);
}

std::string RangeText(Bound min, Bound max) {
  const bool has_min = std::isfinite(min.value);
  const bool has_max = std::isfinite(max.value);
  std::string text;
  if (has_min) absl::StrAppend(&text, min.inclusive ? ">= " : "> ", FormatNumber(min.value));
  if (has_min && has_max) absl::StrAppend(&text, " and ");
  if (has_max) absl::StrAppend(&text, max.inclusive ? "<= " : "< ", FormatNumber(max.value));
  return text;
}

}  // namespace

int LineOf(const YAML::Node& node) {
  if (!node.IsDefined()) return 0;
  const YAML::Mark mark = node.Mark();
  return mark.is_null() || mark.line < 0 ? 0 : mark.line + 1;
}

absl::Status ErrorSite::Error(int line, const std::string& path,
                              const std::string& problem) const {
  std::string text = source_;
  if (line > 0) absl::StrAppend(&text, ":", line);
  absl::StrAppend(&text, ": ");
  if (!path.empty()) absl::StrAppend(&text, path, ": ");
  absl::StrAppend(&text, problem);
  return absl::InvalidArgumentError(text);
}

absl::Status ErrorSite::ErrorAt(const std::string& path, const std::string& problem) const {
  return Error(Line(path), path, problem);
}

int ErrorSite::Line(const std::string& path) const {
  auto it = lines_.find(path);
  return it == lines_.end() ? 0 : it->second;
}

bool IsPlainScalar(const YAML::Node& node) { return node.IsScalar() && node.Tag() != "!"; }

std::string Describe(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "nothing (null)";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  // An error quotes the value, not all of it: a value of megabytes would make an error message
  // that no client can receive (gRPC's metadata limit).
  constexpr size_t kQuoted = 64;
  std::string value = node.Scalar();
  if (value.size() > kQuoted) {
    value = absl::StrCat(std::string(Utf8Prefix(value, kQuoted)), "... (", value.size(), " bytes)");
  }
  if (!IsPlainScalar(node)) return absl::StrCat("the string \"", value, "\"");
  return absl::StrCat("'", value, "'");
}

bool DecodeNumber(const YAML::Node& node, double* out) {
  double value = 0;
  if (!IsPlainScalar(node) || !YAML::convert<double>::decode(node, value)) return false;
  if (!std::isfinite(value)) return false;
  *out = value;
  return true;
}

absl::StatusOr<MapReader> MapReader::Open(ErrorSite* site, const YAML::Node& node,
                                          const SchemaNode& schema, std::string path) {
  MapReader reader(site, YAML::Node(YAML::NodeType::Map), &schema, std::move(path));
  if (!node.IsDefined() || node.IsNull()) return reader;
  if (!node.IsMap()) {
    return site->Error(LineOf(node), reader.path_,
                       absl::StrCat("must be a mapping (key: value), got ", Describe(node)));
  }
  std::set<std::string> seen;
  for (const auto& entry : node) {
    const YAML::Node& key = entry.first;
    if (!key.IsScalar()) {
      return site->Error(LineOf(key), reader.path_,
                         absl::StrCat("keys must be plain names, got ", Describe(key)));
    }
    const std::string name = key.Scalar();
    const std::string key_path = reader.PathOf(name);
    if (name == "<<") {
      return site->Error(LineOf(key), key_path, "YAML merge keys ('<<') are not supported; "
                                                "write the fields out");
    }
    if (!seen.insert(name).second) {
      return site->Error(LineOf(key), key_path,
                         absl::StrCat("duplicate key (first given at line ",
                                      site->Line(key_path), ")"));
    }
    const SchemaNode* child = schema.Child(name);
    if (child == nullptr) {
      return site->Error(LineOf(key), key_path, UnknownKeyProblem(schema, reader.path_, name));
    }
    if (!child->refused_because.empty()) {
      return site->Error(LineOf(key), key_path,
                         absl::StrCat("not supported: ", child->refused_because));
    }
    site->Record(key_path, LineOf(key));
    reader.node_.force_insert(name, entry.second);
  }
  return reader;
}

bool MapReader::Has(const std::string& key) const {
  const YAML::Node value = Get(key);
  return value.IsDefined() && !value.IsNull();
}

YAML::Node MapReader::Get(const std::string& key) const {
  const YAML::Node& map = node_;
  return map[key];
}

std::string MapReader::PathOf(const std::string& key) const {
  return path_.empty() ? key : absl::StrCat(path_, ".", key);
}

const SchemaNode& MapReader::SchemaOf(const std::string& key) const {
  const SchemaNode* child = schema_->Child(key);
  return child != nullptr ? *child : *schema_;
}

absl::Status MapReader::Error(const std::string& key, const std::string& problem) const {
  const std::string key_path = PathOf(key);
  const int value_line = LineOf(Get(key));
  const int line = value_line > 0 ? value_line : site_->Line(key_path);
  return site_->Error(line > 0 ? line : site_->Line(path_), key_path, problem);
}

absl::Status MapReader::ErrorHere(const std::string& problem) const {
  return site_->ErrorAt(path_, problem);
}

absl::Status MapReader::ReadBool(const std::string& key, bool* out) const {
  if (!Has(key)) return absl::OkStatus();
  const YAML::Node value = Get(key);
  bool decoded = false;
  if (!IsPlainScalar(value) || !YAML::convert<bool>::decode(value, decoded)) {
    return Error(key, absl::StrCat("must be true or false, got ", Describe(value)));
  }
  *out = decoded;
  return absl::OkStatus();
}

absl::Status MapReader::ReadString(const std::string& key, std::string* out) const {
  if (!Has(key)) return absl::OkStatus();
  const YAML::Node value = Get(key);
  if (!value.IsScalar()) {
    return Error(key, absl::StrCat("must be a string, got ", Describe(value)));
  }
  *out = value.Scalar();
  return absl::OkStatus();
}

absl::Status MapReader::ReadChoice(const std::string& key, const std::vector<std::string>& choices,
                                   std::string* out) const {
  std::string value = *out;
  const bool had = Has(key);
  if (absl::Status s = ReadString(key, &value); !s.ok()) return s;
  if (!had) return absl::OkStatus();
  for (const std::string& choice : choices) {
    if (value == choice) {
      *out = value;
      return absl::OkStatus();
    }
  }
  if (choices.size() == 1) {
    return Error(key, absl::StrCat("must be '", choices[0], "', got '", value, "'"));
  }
  return Error(key, absl::StrCat("must be one of ", absl::StrJoin(choices, ", "), "; got '",
                                 value, "'"));
}

absl::Status MapReader::ReadInt(const std::string& key, int64_t min, int64_t max,
                                int64_t* out) const {
  if (!Has(key)) return absl::OkStatus();
  const YAML::Node value = Get(key);
  const std::string range =
      max >= std::numeric_limits<int32_t>::max()  // "no upper bound" for practical purposes
          ? absl::StrCat(">= ", min)
          : absl::StrCat("between ", min, " and ", max);
  int64_t decoded = 0;
  double as_double = 0;
  if (IsPlainScalar(value) && YAML::convert<int64_t>::decode(value, decoded)) {
    // decoded as written
  } else if (DecodeNumber(value, &as_double) && as_double == std::floor(as_double) &&
             std::abs(as_double) < 9.0e18) {
    decoded = static_cast<int64_t>(as_double);
  } else {
    return Error(key, absl::StrCat("must be an integer ", range, ", got ", Describe(value)));
  }
  if (decoded < min || decoded > max) {
    return Error(key, absl::StrCat("must be an integer ", range, ", got ", decoded));
  }
  *out = decoded;
  return absl::OkStatus();
}

absl::Status MapReader::ReadInt(const std::string& key, int min, int max, int* out) const {
  int64_t wide = *out;
  if (absl::Status s = ReadInt(key, int64_t{min}, int64_t{max}, &wide); !s.ok()) return s;
  *out = static_cast<int>(wide);
  return absl::OkStatus();
}

absl::Status MapReader::ReadUint(const std::string& key, uint64_t* out) const {
  if (!Has(key)) return absl::OkStatus();
  const YAML::Node value = Get(key);
  uint64_t decoded = 0;
  if (!IsPlainScalar(value) || value.Scalar().find('-') != std::string::npos ||
      !YAML::convert<uint64_t>::decode(value, decoded)) {
    return Error(key, absl::StrCat("must be an integer >= 0, got ", Describe(value)));
  }
  *out = decoded;
  return absl::OkStatus();
}

absl::Status MapReader::ReadNumber(const std::string& key, Bound min, Bound max,
                                   double* out) const {
  if (!Has(key)) return absl::OkStatus();
  const YAML::Node value = Get(key);
  const std::string range = RangeText(min, max);
  double decoded = 0;
  if (!DecodeNumber(value, &decoded)) {
    return Error(key, absl::StrCat("must be a number ", range, ", got ", Describe(value)));
  }
  const bool low_ok = !std::isfinite(min.value) ||
                      (min.inclusive ? decoded >= min.value : decoded > min.value);
  const bool high_ok = !std::isfinite(max.value) ||
                       (max.inclusive ? decoded <= max.value : decoded < max.value);
  if (!low_ok || !high_ok) {
    return Error(key, absl::StrCat("must be a number ", range, ", got ", value.Scalar()));
  }
  *out = decoded;
  return absl::OkStatus();
}

absl::StatusOr<MapReader> MapReader::OpenMap(const std::string& key) const {
  return Open(site_, Get(key), SchemaOf(key), PathOf(key));
}

}  // namespace qlora::config_internal
