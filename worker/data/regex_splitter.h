// The Split pre-tokenizer of HF tokenizers with a Unicode regex, on PCRE2 (UTF + UCP, JIT):
// behavior "Isolated" keeps matches and the text between them as separate pieces, "Removed"
// drops the matches. std::regex cannot express the patterns (\p{L}, lookahead, (?i:...)).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace qlora::data {

class RegexSplitter {
 public:
  enum class Behavior { kIsolated, kRemoved };

  static absl::StatusOr<RegexSplitter> Compile(const std::string& pattern, Behavior behavior);
  // A pattern that matches `literal` exactly (Split with a String pattern).
  static std::string QuoteLiteral(absl::string_view literal);

  // Appends the pieces of `text` (views into it) to *pieces.
  void Split(absl::string_view text, std::vector<absl::string_view>* pieces) const;

 private:
  struct Code;
  RegexSplitter(std::shared_ptr<const Code> code, Behavior behavior)
      : code_(std::move(code)), behavior_(behavior) {}

  std::shared_ptr<const Code> code_;
  Behavior behavior_;
};

// GPT-2's pattern, which ByteLevel(use_regex=true) applies.
extern const char kGpt2SplitPattern[];

}  // namespace qlora::data
