// What differs between two resolved job files (EmitResolvedJobYaml's text): the dotted key of
// every leaf whose value changed, was added or was removed, with both values as written. Used to
// say what a continued job changes from the job it continues.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace qlora {

struct KeyChange {
  std::string key;     // dotted, from the top: "trainer.learning_rate", "adapter.r"
  std::string before;  // the value in the first file, "" when absent there
  std::string after;   // the value in the second file, "" when absent there
};

// The changed leaves in key order. A sequence is one leaf (its flow-style text). Either text
// failing to parse as a YAML mapping is an INVALID_ARGUMENT naming which.
absl::StatusOr<std::vector<KeyChange>> ChangedKeys(const std::string& before_yaml,
                                                   const std::string& after_yaml);

}  // namespace qlora
