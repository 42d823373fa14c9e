// Added-token splitting (see added_tokens.h).
#include "worker/data/added_tokens.h"

#include <algorithm>

#include "worker/data/byte_level.h"

namespace qlora::data {
namespace {

// The previous character's start (UTF-8), or npos at 0.
size_t PreviousCharStart(absl::string_view text, size_t pos) {
  if (pos == 0) return absl::string_view::npos;
  do {
    --pos;
  } while (pos > 0 && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80);
  return pos;
}

bool IsWordChar(char32_t cp) {
  // Rust's char::is_alphanumeric for ASCII, and any non-ASCII letter-like character.
  return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
         cp == '_' || (cp >= 0x80 && !IsUnicodeWhitespace(cp));
}

}  // namespace

bool IsUnicodeWhitespace(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

AddedTokenSplitter::AddedTokenSplitter(std::vector<AddedToken> tokens)
    : tokens_(std::move(tokens)) {
  for (size_t i = 0; i < tokens_.size(); ++i)
    if (!tokens_[i].content.empty())
      by_first_byte_[static_cast<unsigned char>(tokens_[i].content[0])].push_back(
          static_cast<int>(i));
  for (auto& list : by_first_byte_)
    std::stable_sort(list.begin(), list.end(), [&](int a, int b) {
      return tokens_[a].content.size() > tokens_[b].content.size();
    });
}

int32_t AddedTokenSplitter::Find(absl::string_view content) const {
  for (const AddedToken& token : tokens_)
    if (token.content == content) return token.id;
  return -1;
}

void AddedTokenSplitter::Split(absl::string_view text,
                               const std::function<void(absl::string_view)>& on_text,
                               const std::function<void(int32_t)>& on_token) const {
  size_t emitted = 0;  // text before this offset has been handed out
  size_t pos = 0;
  while (pos < text.size()) {
    const auto& candidates = by_first_byte_[static_cast<unsigned char>(text[pos])];
    const AddedToken* match = nullptr;
    for (int index : candidates) {
      const AddedToken& token = tokens_[index];
      if (text.compare(pos, token.content.size(), token.content) != 0) continue;
      if (token.single_word) {
        size_t before = PreviousCharStart(text, pos);
        size_t after = pos + token.content.size();
        if (before != absl::string_view::npos && IsWordChar(NextUtf8(text, &before))) continue;
        if (after < text.size() && IsWordChar(NextUtf8(text, &after))) continue;
      }
      match = &token;
      break;
    }
    if (match == nullptr) {
      ++pos;
      continue;
    }
    size_t start = pos;
    size_t end = pos + match->content.size();
    if (match->lstrip) {
      while (start > emitted) {
        size_t prev = PreviousCharStart(text, start);
        size_t probe = prev;
        if (!IsUnicodeWhitespace(NextUtf8(text, &probe))) break;
        start = prev;
      }
    }
    if (match->rstrip) {
      while (end < text.size()) {
        size_t probe = end;
        if (!IsUnicodeWhitespace(NextUtf8(text, &probe))) break;
        end = probe;
      }
    }
    if (start > emitted) on_text(text.substr(emitted, start - emitted));
    on_token(match->id);
    emitted = pos = end;
  }
  if (emitted < text.size()) on_text(text.substr(emitted));
}

}  // namespace qlora::data
