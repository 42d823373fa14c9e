// Command-line overrides of a job file: `qloractl submit job.yaml trainer.learning_rate=1e-4
// adapter.r=16` rewrites the YAML before it is validated or sent.
//
//   KEY.PATH=VALUE   KEY.PATH is dot-separated map keys from the top of the file; VALUE is read
//                    as YAML (`1e-4`, `true`, `null`, `"text"`, `[q_proj, v_proj]`), so it takes
//                    the type the same text would have in the file. A missing (or null) map on
//                    the path is created; a path through a scalar or a list is an error naming
//                    the part that is not a map. Later overrides of the same key win.
//
// Unknown keys are not checked here: the job-file parser rejects them with its did-you-mean
// message, as it would in the file.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace qlora {

struct YamlOverride {
  std::vector<std::string> path;  // {"trainer", "learning_rate"}
  std::string value;              // "1e-4", YAML text
};

// Whether `arg` has the KEY.PATH=VALUE form (a key of letters, digits, '_' and '-' before the
// first '=', dots between keys): tells an override from a file name on the command line.
bool IsOverrideArgument(absl::string_view arg);

// "trainer.learning_rate=1e-4" -> {{"trainer", "learning_rate"}, "1e-4"}; INVALID_ARGUMENT when
// `arg` is not of that form.
absl::StatusOr<YamlOverride> ParseOverride(absl::string_view arg);

// The job file `yaml` with every override applied in order, emitted as YAML (comments and layout
// are not kept; without overrides, use the file as it is). INVALID_ARGUMENT "override K=V: ..."
// when the file is not one YAML mapping, a value is not YAML, or a path runs through a scalar or
// a list.
absl::StatusOr<std::string> ApplyOverrides(absl::string_view yaml, const std::vector<YamlOverride>& overrides);

}  // namespace qlora
