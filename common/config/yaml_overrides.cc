// KEY.PATH=VALUE overrides of a job file (see yaml_overrides.h).
#include "common/config/yaml_overrides.h"

#include <yaml-cpp/yaml.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace qlora {
namespace {

bool IsKeyChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

std::string Describe(const YamlOverride& o) { return absl::StrCat(absl::StrJoin(o.path, "."), "=", o.value); }

const char* KindOf(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Scalar: return "a scalar";
    default: return "not a map";
  }
}

absl::Status Apply(YAML::Node root, const YamlOverride& o) {
  YAML::Node value;
  try {
    value = YAML::Load(o.value);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("override ", Describe(o), ": the value is not YAML: ", e.msg));
  }
  YAML::Node map = root;
  for (size_t i = 0; i + 1 < o.path.size(); ++i) {
    const std::string& key = o.path[i];
    if (!map[key].IsDefined() || map[key].IsNull()) map[key] = YAML::Node(YAML::NodeType::Map);
    YAML::Node child = map[key];
    if (!child.IsMap()) {
      const std::string where = absl::StrJoin(o.path.begin(), o.path.begin() + i + 1, ".");
      return absl::InvalidArgumentError(absl::StrCat("override ", Describe(o), ": ", where, " is ", KindOf(child),
                                                     ", not a map (set it whole: ", where, "=...)"));
    }
    map.reset(child);  // rebinds; `map = child` would assign the value
  }
  map[o.path.back()] = value;
  return absl::OkStatus();
}

}  // namespace

bool IsOverrideArgument(absl::string_view arg) { return ParseOverride(arg).ok(); }

absl::StatusOr<YamlOverride> ParseOverride(absl::string_view arg) {
  const size_t eq = arg.find('=');
  if (eq == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("'", arg, "' is not KEY.PATH=VALUE"));
  }
  YamlOverride o;
  o.value = std::string(arg.substr(eq + 1));
  for (absl::string_view key : absl::StrSplit(arg.substr(0, eq), '.')) {
    bool valid = !key.empty();
    for (char c : key) valid = valid && IsKeyChar(c);
    if (!valid) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", arg, "' is not KEY.PATH=VALUE (keys are letters, digits, '_' and '-', joined by '.')"));
    }
    o.path.emplace_back(key);
  }
  return o;
}

absl::StatusOr<std::string> ApplyOverrides(absl::string_view yaml, const std::vector<YamlOverride>& overrides) {
  std::vector<YAML::Node> documents;
  try {
    documents = YAML::LoadAll(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("the job file is not YAML: ", e.what()));
  }
  if (documents.size() > 1) return absl::InvalidArgumentError("the job file holds more than one YAML document");
  YAML::Node root = documents.empty() || documents[0].IsNull() ? YAML::Node(YAML::NodeType::Map) : documents[0];
  if (!root.IsMap()) return absl::InvalidArgumentError("the job file is not a YAML mapping");
  for (const YamlOverride& o : overrides) {
    if (absl::Status s = Apply(root, o); !s.ok()) return s;
  }
  YAML::Emitter out;
  out << root;
  if (!out.good()) return absl::InternalError(absl::StrCat("cannot write the overridden job: ", out.GetLastError()));
  return absl::StrCat(out.c_str(), "\n");
}

}  // namespace qlora
