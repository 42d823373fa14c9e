// Bounds on rendering one chat template: templates come from user-supplied model folders and
// are untrusted, so output size, string/list sizes and work are capped.
#pragma once

#include <cstddef>
#include <cstdint>

namespace qlora::data::jinja {

struct RenderLimits {
  size_t max_output_bytes = 64u << 20;  // also the cap on any one string or list built
  int64_t max_steps = 20'000'000;       // expression evaluations + loop iterations + list items
};

}  // namespace qlora::data::jinja
