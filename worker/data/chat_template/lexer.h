// Splits a chat template into text and tag tokens with Jinja's whitespace rules as transformers
// configures them (trim_blocks, lstrip_blocks, `{%-`/`-%}` stripping, `{%+` opt-out, newlines
// normalized to "\n", one trailing newline dropped), and the inside of tags into expression
// tokens (names, string/number literals, operators). Comments are dropped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace qlora::data::jinja {

struct Token {
  enum class Kind {
    kText,        // literal output; `text`
    kVarBegin,    // {{
    kVarEnd,      // }}
    kBlockBegin,  // {%
    kBlockEnd,    // %}
    kName,        // identifier or keyword; `text`
    kString,      // string literal, unescaped; `text`
    kInt,         // `int_value`
    kFloat,       // `float_value`
    kOp,          // operator or punctuation; `text`
    kEnd,         // end of the template
  };
  Kind kind;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0;
  size_t pos = 0;  // offset in the normalized source (see NormalizeSource)
};

// Jinja's source preparation: "\r\n" and "\r" become "\n"; one trailing newline is dropped.
std::string NormalizeSource(absl::string_view source);

// Tokens of a normalized source, ending with kEnd.
absl::StatusOr<std::vector<Token>> Lex(const std::string& source);

// "line L, column C" of `pos` in `source`, for error messages.
std::string Where(absl::string_view source, size_t pos);

}  // namespace qlora::data::jinja
