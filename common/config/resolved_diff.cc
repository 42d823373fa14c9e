// Leaf-by-leaf comparison of two resolved job files (see resolved_diff.h).
#include "common/config/resolved_diff.h"

#include <map>

#include <yaml-cpp/yaml.h>

#include "absl/strings/str_cat.h"

namespace qlora {
namespace {

// The text of a leaf: a scalar as written, anything else in flow style on one line.
std::string LeafText(const YAML::Node& node) {
  if (node.IsScalar()) return node.Scalar();
  if (node.IsNull()) return "null";
  YAML::Emitter out;
  out << YAML::Flow << node;
  return out.c_str();
}

void Flatten(const YAML::Node& node, const std::string& prefix, std::map<std::string, std::string>* out) {
  if (!node.IsMap()) {
    (*out)[prefix] = LeafText(node);
    return;
  }
  for (const auto& entry : node) {
    const std::string key = entry.first.Scalar();
    Flatten(entry.second, prefix.empty() ? key : absl::StrCat(prefix, ".", key), out);
  }
}

absl::StatusOr<std::map<std::string, std::string>> Leaves(const std::string& yaml, const char* which) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("the ", which, " resolved job file: ", e.what()));
  }
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat("the ", which, " resolved job file is not a mapping"));
  }
  std::map<std::string, std::string> leaves;
  Flatten(root, "", &leaves);
  return leaves;
}

}  // namespace

absl::StatusOr<std::vector<KeyChange>> ChangedKeys(const std::string& before_yaml,
                                                   const std::string& after_yaml) {
  absl::StatusOr<std::map<std::string, std::string>> before = Leaves(before_yaml, "first");
  if (!before.ok()) return before.status();
  absl::StatusOr<std::map<std::string, std::string>> after = Leaves(after_yaml, "second");
  if (!after.ok()) return after.status();
  std::vector<KeyChange> changes;
  auto b = before->begin();
  auto a = after->begin();
  while (b != before->end() || a != after->end()) {
    if (a == after->end() || (b != before->end() && b->first < a->first)) {
      changes.push_back({b->first, b->second, ""});
      ++b;
    } else if (b == before->end() || a->first < b->first) {
      changes.push_back({a->first, "", a->second});
      ++a;
    } else {
      if (b->second != a->second) changes.push_back({b->first, b->second, a->second});
      ++b;
      ++a;
    }
  }
  return changes;
}

}  // namespace qlora
