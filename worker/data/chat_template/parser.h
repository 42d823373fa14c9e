// Parses lexer tokens into statements (parser.cc lists the grammar). Anything outside the
// supported subset (macros, includes, block set, recursive loops, *args) is UNIMPLEMENTED, and
// a syntax error INVALID_ARGUMENT, both naming the line and column.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/chat_template/ast.h"
#include "worker/data/chat_template/lexer.h"

namespace qlora::data::jinja {

// Nesting deeper than this (blocks, brackets, unary operators) is refused: templates are
// untrusted input and the parser and evaluator recurse.
constexpr int kMaxNesting = 64;

// `source` is the normalized source the tokens came from (for positions in errors).
absl::StatusOr<Body> Parse(const std::vector<Token>& tokens, const std::string& source);

}  // namespace qlora::data::jinja
