// Renders parsed statements with Jinja's semantics: a for loop's body is its own scope per
// iteration (so `set` inside a loop does not leak; templates use namespace() for that), `loop`
// carries index/index0/revindex/revindex0/first/last/length/previtem/nextitem, attribute access
// on a dict reads its key, a missing key or index is undefined, and using an undefined value in
// arithmetic or taking its attribute is an error. Work, output and value sizes are bounded by
// RenderLimits.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/chat_template/ast.h"
#include "worker/data/chat_template/limits.h"
#include "worker/data/chat_template/value.h"

namespace qlora::data::jinja {

struct RenderResult {
  std::string text;
  // Byte ranges of the output written inside {% generation %} blocks (transformers' assistant
  // mask markers), in order.
  std::vector<std::pair<size_t, size_t>> generation_spans;
};

// `source` is the normalized template source (for positions in errors); `variables` are the
// template's top-level names.
absl::StatusOr<RenderResult> Evaluate(const Body& body, const std::string& source,
                                      const Dict& variables, const RenderLimits& limits);

}  // namespace qlora::data::jinja
