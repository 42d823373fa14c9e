// PCRE2-backed Split pre-tokenizer (see regex_splitter.h).
#include "worker/data/regex_splitter.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/strings/str_cat.h"

namespace qlora::data {

const char kGpt2SplitPattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct RegexSplitter::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

absl::StatusOr<RegexSplitter> RegexSplitter::Compile(const std::string& pattern,
                                                     Behavior behavior) {
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  auto code = std::make_shared<Code>();
  code->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                             PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error,
                             &error_offset, nullptr);
  if (code->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat("pre-tokenizer regex at offset ", error_offset,
                                                   ": ", reinterpret_cast<char*>(message)));
  }
  pcre2_jit_compile(code->code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if absent
  return RegexSplitter(std::move(code), behavior);
}

std::string RegexSplitter::QuoteLiteral(absl::string_view literal) {
  return absl::StrCat("\\Q", literal, "\\E");
}

void RegexSplitter::Split(absl::string_view text, std::vector<absl::string_view>* pieces) const {
  // Match data is per call: a splitter may be shared by threads.
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
      pcre2_match_data_create_from_pattern(code_->code, nullptr), &pcre2_match_data_free);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t last = 0;
  size_t start = 0;
  while (start <= text.size()) {
    int rc = pcre2_match(code_->code, subject, text.size(), start, 0, match.get(), nullptr);
    if (rc < 0) break;  // no further match (or an error: the rest is one piece)
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
    size_t begin = ovector[0], end = ovector[1];
    if (end == begin) {  // empty match: step over one character
      start = begin + 1;
      while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80)
        ++start;
      continue;
    }
    if (begin > last) pieces->push_back(text.substr(last, begin - last));
    if (behavior_ == Behavior::kIsolated) pieces->push_back(text.substr(begin, end - begin));
    last = start = end;
  }
  if (last < text.size()) pieces->push_back(text.substr(last));
}

}  // namespace qlora::data
