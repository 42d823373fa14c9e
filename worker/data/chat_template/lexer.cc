// Template lexer (see lexer.h). Follows jinja2/lexer.py: text runs to the next "{{", "{%" or
// "{#"; a tag's end is found outside string literals and brackets, so `{{ "}}" }}` and
// `{{ {'a': 1} }}` work.
#include "worker/data/chat_template/lexer.h"

#include <cctype>

#include "absl/strings/str_cat.h"
#include "worker/data/byte_level.h"

namespace qlora::data::jinja {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }


class Lexer {
 public:
  explicit Lexer(const std::string& source) : src_(source) {}

  absl::StatusOr<std::vector<Token>> Run() {
    size_t pos = 0;
    bool strip_next = false;     // the previous tag ended with '-'
    bool line_starting = true;   // the text starts at the beginning of a line
    while (pos <= src_.size()) {
      size_t at = pos;
      while (at < src_.size() &&
             !(src_[at] == '{' && at + 1 < src_.size() &&
               (src_[at + 1] == '{' || src_[at + 1] == '%' || src_[at + 1] == '#')))
        ++at;
      if (strip_next) {  // `-%}` swallowed the whitespace after it
        while (pos < at && IsSpace(src_[pos])) {
          line_starting = src_[pos] == '\n';
          ++pos;
        }
      }
      std::string text = src_.substr(pos, at - pos);
      if (at >= src_.size()) {
        Emit(Token::Kind::kText, std::move(text), pos);
        break;
      }
      const char kind = src_[at + 1];
      const char sign = at + 2 < src_.size() ? src_[at + 2] : '\0';
      if (sign == '-') {
        while (!text.empty() && IsSpace(text.back())) text.pop_back();
      } else if (sign != '+' && kind != '{') {  // lstrip_blocks: a block/comment alone on its line
        const size_t line = text.rfind('\n');
        const size_t l_pos = line == std::string::npos ? 0 : line + 1;
        if (l_pos > 0 || line_starting) {
          bool blank = true;
          for (size_t i = l_pos; i < text.size(); ++i) blank &= text[i] == ' ' || text[i] == '\t';
          if (blank) text.resize(l_pos);
        }
      }
      Emit(Token::Kind::kText, std::move(text), pos);
      size_t inner = at + 2 + ((sign == '-' || (sign == '+' && kind != '{')) ? 1 : 0);
      bool dash_end = false;
      if (kind == '#') {
        size_t close = src_.find("#}", inner);
        if (close == std::string::npos) return Error(at, "unterminated comment");
        dash_end = close > inner && src_[close - 1] == '-';
        pos = close + 2;
      } else {
        Emit(kind == '{' ? Token::Kind::kVarBegin : Token::Kind::kBlockBegin, "", at);
        absl::StatusOr<size_t> end = LexTag(inner, kind == '{' ? '}' : '%', &dash_end);
        if (!end.ok()) return end.status();
        pos = *end;
      }
      const bool block_like = kind != '{';
      strip_next = dash_end;
      line_starting = false;
      if (!dash_end && block_like && pos < src_.size() && src_[pos] == '\n') {  // trim_blocks
        ++pos;
        line_starting = true;
      }
      if (dash_end && pos == src_.size()) break;
    }
    Emit(Token::Kind::kEnd, "", src_.size());
    return std::move(tokens_);
  }

 private:
  absl::Status Error(size_t pos, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("chat_template: ", what, " at ", Where(src_, pos)));
  }

  void Emit(Token::Kind kind, std::string text, size_t pos) {
    if (kind == Token::Kind::kText && text.empty()) return;
    Token token;
    token.kind = kind;
    token.text = std::move(text);
    token.pos = pos;
    tokens_.push_back(std::move(token));
  }

  // Lexes expression tokens from `pos` to the closing "}}" / "%}" (`close` is '}' or '%');
  // returns the offset after it.
  absl::StatusOr<size_t> LexTag(size_t pos, char close, bool* dash_end) {
    int depth = 0;  // open (, [ and {
    const size_t start = pos;
    while (true) {
      while (pos < src_.size() && IsSpace(src_[pos])) ++pos;
      if (pos >= src_.size()) return Error(start, "unterminated tag");
      const char c = src_[pos];
      if (depth == 0) {
        if (c == '-' && pos + 2 < src_.size() + 0 && src_[pos + 1] == close && src_[pos + 2] == '}') {
          *dash_end = true;
          Emit(close == '}' ? Token::Kind::kVarEnd : Token::Kind::kBlockEnd, "", pos);
          return pos + 3;
        }
        if (c == close && pos + 1 < src_.size() && src_[pos + 1] == '}') {
          *dash_end = false;
          Emit(close == '}' ? Token::Kind::kVarEnd : Token::Kind::kBlockEnd, "", pos);
          return pos + 2;
        }
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t end = pos;
        while (end < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[end])) || src_[end] == '_')) ++end;
        Emit(Token::Kind::kName, src_.substr(pos, end - pos), pos);
        pos = end;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        absl::StatusOr<size_t> end = LexNumber(pos);
        if (!end.ok()) return end.status();
        pos = *end;
      } else if (c == '\'' || c == '"') {
        absl::StatusOr<size_t> end = LexString(pos);
        if (!end.ok()) return end.status();
        pos = *end;
      } else {
        static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%",
                                     "~", "<", ">", "=", ".", ",", ":", "|", "(", ")", "[", "]",
                                     "{", "}"};
        const char* found = nullptr;
        for (const char* op : kOps)
          if (src_.compare(pos, std::char_traits<char>::length(op), op) == 0) {
            found = op;
            break;
          }
        if (found == nullptr) return Error(pos, absl::StrCat("unexpected character '", std::string(1, c), "'"));
        const std::string op(found);
        if (op == "(" || op == "[" || op == "{") ++depth;
        if (op == ")" || op == "]" || op == "}") {
          if (depth == 0) return Error(pos, absl::StrCat("unbalanced '", op, "'"));
          --depth;
        }
        Emit(Token::Kind::kOp, op, pos);
        pos += op.size();
      }
    }
  }

  absl::StatusOr<size_t> LexNumber(size_t pos) {
    size_t end = pos;
    auto digits = [&] {
      while (end < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[end])) || src_[end] == '_')) ++end;
    };
    digits();
    bool is_float = false;
    if (end + 1 < src_.size() && src_[end] == '.' && std::isdigit(static_cast<unsigned char>(src_[end + 1]))) {
      is_float = true;
      ++end;
      digits();
    }
    if (end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
      size_t e = end + 1;
      if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
      if (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) {
        is_float = true;
        end = e;
        digits();
      }
    }
    std::string text;
    for (size_t i = pos; i < end; ++i)
      if (src_[i] != '_') text.push_back(src_[i]);
    Token token;
    token.pos = pos;
    try {
      if (is_float) {
        token.kind = Token::Kind::kFloat;
        token.float_value = std::stod(text);
      } else {
        token.kind = Token::Kind::kInt;
        token.int_value = std::stoll(text);
      }
    } catch (const std::exception&) {
      return Error(pos, "number out of range");
    }
    tokens_.push_back(std::move(token));
    return end;
  }

  // Python's unicode-escape decoding, as Jinja applies to string literals.
  absl::StatusOr<size_t> LexString(size_t pos) {
    const char quote = src_[pos];
    std::string value;
    size_t i = pos + 1;
    while (true) {
      if (i >= src_.size()) return Error(pos, "unterminated string literal");
      const char c = src_[i];
      if (c == quote) break;
      if (c != '\\') {
        value.push_back(c);
        ++i;
        continue;
      }
      if (i + 1 >= src_.size()) return Error(pos, "unterminated string literal");
      const char e = src_[i + 1];
      i += 2;
      switch (e) {
        case '\n': break;  // line continuation
        case '\\': value.push_back('\\'); break;
        case '\'': value.push_back('\''); break;
        case '"': value.push_back('"'); break;
        case 'a': value.push_back('\a'); break;
        case 'b': value.push_back('\b'); break;
        case 'f': value.push_back('\f'); break;
        case 'n': value.push_back('\n'); break;
        case 'r': value.push_back('\r'); break;
        case 't': value.push_back('\t'); break;
        case 'v': value.push_back('\v'); break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (i + n > src_.size()) return Error(i - 2, "truncated \\x/\\u escape");
          uint32_t cp = 0;
          for (size_t k = 0; k < n; ++k) {
            const char h = src_[i + k];
            if (!std::isxdigit(static_cast<unsigned char>(h))) return Error(i - 2, "truncated \\x/\\u escape");
            cp = cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
          }
          if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return Error(i - 2, "escape outside Unicode");
          AppendUtf8(cp, &value);
          i += n;
          break;
        }
        case 'N': return Error(i - 2, "\\N{...} escapes are not supported");
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && i < src_.size() && src_[i] >= '0' && src_[i] <= '7'; ++k, ++i)
              cp = cp * 8 + static_cast<uint32_t>(src_[i] - '0');
            AppendUtf8(cp, &value);
          } else {  // unknown escapes keep their backslash, as Python
            value.push_back('\\');
            value.push_back(e);
          }
      }
    }
    Emit(Token::Kind::kString, "", pos);
    tokens_.back().text = std::move(value);
    return i + 1;
  }

  const std::string& src_;
  std::vector<Token> tokens_;
};

}  // namespace

std::string NormalizeSource(absl::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

absl::StatusOr<std::vector<Token>> Lex(const std::string& source) { return Lexer(source).Run(); }

std::string Where(absl::string_view source, size_t pos) {
  size_t line = 1, column = 1;
  for (size_t i = 0; i < pos && i < source.size(); ++i) {
    if (source[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return absl::StrCat("line ", line, ", column ", column);
}

}  // namespace qlora::data::jinja
