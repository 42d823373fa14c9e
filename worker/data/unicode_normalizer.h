// The Unicode normalizers of HF tokenizer.json ("NFC", "NFD", "NFKC", "NFKD", and a "Sequence"
// of them), on ICU's normalizer (Qwen2's tokenizer normalizes to NFC). Torch-free.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace qlora::data {

class UnicodeNormalizer {
 public:
  enum class Form { kNfc, kNfd, kNfkc, kNfkd };

  // The form of a tokenizer.json normalizer type ("NFC", ...); Unimplemented for other types.
  static absl::StatusOr<Form> ParseForm(absl::string_view type);
  // Forms applied in order. Internal if ICU cannot give one (a broken ICU data library).
  static absl::StatusOr<UnicodeNormalizer> Create(std::vector<Form> forms);

  // `utf8` normalized by every form in turn. Invalid UTF-8 sequences become U+FFFD, as
  // tokenizers' Rust strings cannot hold them either.
  std::string Normalize(absl::string_view utf8) const;

 private:
  explicit UnicodeNormalizer(std::vector<const void*> normalizers)
      : normalizers_(std::move(normalizers)) {}
  std::vector<const void*> normalizers_;  // const UNormalizer2*, owned by ICU (never freed)
};

}  // namespace qlora::data
