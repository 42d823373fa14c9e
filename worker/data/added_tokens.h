// Splits text on HF added tokens before any other tokenization (tokenizers
// added_vocabulary.rs): leftmost match first, the longest token at that position, with
// lstrip/rstrip swallowing neighbouring whitespace and single_word requiring non-word
// neighbours. Each matched token maps straight to its id.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace qlora::data {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool special = false;
};

class AddedTokenSplitter {
 public:
  AddedTokenSplitter() = default;
  explicit AddedTokenSplitter(std::vector<AddedToken> tokens);

  // Calls on_text for each (possibly empty-free) stretch of plain text and on_token for each
  // token, in order.
  void Split(absl::string_view text, const std::function<void(absl::string_view)>& on_text,
             const std::function<void(int32_t)>& on_token) const;

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  int32_t Find(absl::string_view content) const;  // id or -1

 private:
  std::vector<AddedToken> tokens_;
  std::array<std::vector<int>, 256> by_first_byte_;  // token indices, longest first
};

// Rust char::is_whitespace (Unicode White_Space).
bool IsUnicodeWhitespace(char32_t cp);

}  // namespace qlora::data
