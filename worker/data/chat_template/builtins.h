// The filters, tests, string/dict methods and global functions chat templates use, with
// Python/Jinja semantics (as transformers' sandboxed environment provides them). Errors carry
// no position; the evaluator adds it.
//
// Filters: trim, length/count, tojson(indent, sort_keys), string, lower, upper, capitalize,
//   title, first, last, list, join(sep), default/d(value, boolean), selectattr/rejectattr(attr
//   [, test, arg]), select/reject(test[, arg]), map(attribute=/filter name), replace, int,
//   float, abs, items, safe.
// Tests: defined, undefined, none, string, number, integer, float, boolean, true, false,
//   mapping, iterable, sequence, callable, even, odd, divisibleby, equalto/eq/==, ne/!=,
//   lt/<, le/<=, gt/>, ge/>=, in, lower, upper.
// Methods: str.strip/lstrip/rstrip(chars), split(sep, maxsplit), startswith, endswith,
//   replace, lower, upper, title, capitalize; dict.get, keys, values, items.
// Globals: raise_exception(message), namespace(**kw), range(...), dict(**kw),
//   strftime_now(format).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/data/chat_template/limits.h"
#include "worker/data/chat_template/value.h"

namespace qlora::data::jinja {

struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // The argument at `index` or named `name`, or nullptr.
  const Value* Get(size_t index, absl::string_view name) const;
};

absl::StatusOr<Value> ApplyFilter(absl::string_view name, const Value& input, const Args& args,
                                  const RenderLimits& limits);
absl::StatusOr<bool> ApplyTest(absl::string_view name, const Value& input, const Args& args);
absl::StatusOr<Value> CallMethod(const Value& object, absl::string_view name, const Args& args,
                                 const RenderLimits& limits);
bool IsGlobalFunction(absl::string_view name);
// raise_exception fails with FAILED_PRECONDITION and the template's message.
absl::StatusOr<Value> CallGlobal(absl::string_view name, const Args& args, const RenderLimits& limits);

// Python's str.strip(): Unicode whitespace (as Jinja's trim) or the code points of `chars`.
std::string PyStrip(absl::string_view s, const std::string* chars, bool left, bool right);
// Code points of a UTF-8 string (invalid bytes count as one each).
std::vector<std::string> CodePoints(absl::string_view s);

}  // namespace qlora::data::jinja
