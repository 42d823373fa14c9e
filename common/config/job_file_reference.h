// The job-file reference, rendered from the parser's own key table (job_config_schema.h): the
// Markdown of docs/job-file.md and the plain text of `qloractl explain [KEY]`. One source of
// truth: a key added to the table appears here, and a test fails when docs/job-file.md lags.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace qlora {

// The whole reference as Markdown: one table per top-level section.
std::string JobFileReferenceMarkdown();

// One key, by its dotted path ("trainer.batch_size", "adapter"), as plain text: its type,
// default, meaning and origin, then its sub-keys one line each. "" lists the top-level keys.
// An unknown path is NOT_FOUND with the closest valid key.
absl::StatusOr<std::string> ExplainJobFileKey(const std::string& path);

}  // namespace qlora
