// Filters, tests, methods and global functions (see builtins.h).
#include "worker/data/chat_template/builtins.h"

#include <cmath>
#include <ctime>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace qlora::data::jinja {
namespace {

absl::Status TypeError(absl::string_view what, const Value& v) {
  return absl::InvalidArgumentError(absl::StrCat(what, " does not accept a ", v.TypeName()));
}

absl::Status CheckSize(size_t bytes, const RenderLimits& limits) {
  if (bytes > limits.max_output_bytes)
    return absl::ResourceExhaustedError(
        absl::StrCat("a value grew past ", limits.max_output_bytes, " bytes"));
  return absl::OkStatus();
}

// Decodes the code point at s[i] (invalid bytes decode as themselves); *len is its byte length.
uint32_t DecodeAt(absl::string_view s, size_t i, size_t* len) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
  if (i + n > s.size()) n = 1;
  uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < n; ++k) {
    const unsigned char cc = static_cast<unsigned char>(s[i + k]);
    if ((cc >> 6) != 0x2) {
      *len = 1;
      return c;
    }
    cp = (cp << 6) | (cc & 0x3F);
  }
  *len = n;
  return cp;
}

bool IsPyWhitespace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

std::string AsciiTitle(absl::string_view s, bool only_first) {
  std::string out(s);
  bool start = true;
  for (char& c : out) {
    const bool alpha = absl::ascii_isalpha(static_cast<unsigned char>(c));
    if (only_first) {
      c = start ? absl::ascii_toupper(c) : absl::ascii_tolower(c);
      start = false;
      continue;
    }
    c = start && alpha ? absl::ascii_toupper(c) : alpha ? absl::ascii_tolower(c) : c;
    start = !alpha;
  }
  return out;
}

absl::StatusOr<Value> ToList(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kList: return v;
    case Value::Kind::kUndefined: return Value::MakeList({});
    case Value::Kind::kString: {
      List items;
      for (std::string& cp : CodePoints(v.str())) items.push_back(Value::String(std::move(cp)));
      return Value::MakeList(std::move(items));
    }
    case Value::Kind::kDict: {
      List items;
      for (const auto& [key, unused] : v.dict()) items.push_back(Value::String(key));
      return Value::MakeList(std::move(items));
    }
    default: return TypeError("list()", v);
  }
}

// Jinja's attribute/item lookup for selectattr/map: dict key, else undefined.
Value Attribute(const Value& item, const std::string& name) {
  const Value* found = item.Find(name);
  return found ? *found : Value();
}

absl::StatusOr<std::string> ReplaceAll(const std::string& s, const std::string& from,
                                       const std::string& to, int64_t count,
                                       const RenderLimits& limits) {
  std::string out;
  size_t pos = 0;
  int64_t done = 0;
  if (from.empty()) {  // Python inserts `to` between code points
    std::vector<std::string> cps = CodePoints(s);
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      if (i < cps.size()) out += cps[i];
      QLORA_RETURN_IF_ERROR(CheckSize(out.size(), limits));
    }
    return out;
  }
  while (count < 0 || done < count) {
    const size_t at = s.find(from, pos);
    if (at == std::string::npos) break;
    out.append(s, pos, at - pos);
    out += to;
    pos = at + from.size();
    ++done;
    QLORA_RETURN_IF_ERROR(CheckSize(out.size(), limits));
  }
  out.append(s, pos, std::string::npos);
  QLORA_RETURN_IF_ERROR(CheckSize(out.size(), limits));
  return out;
}

absl::StatusOr<int64_t> IntArg(const Value* v, int64_t fallback, absl::string_view what) {
  if (v == nullptr || v->is_none()) return fallback;
  if (v->kind() != Value::Kind::kInt && v->kind() != Value::Kind::kBool)
    return absl::InvalidArgumentError(absl::StrCat(what, " must be an integer"));
  return v->integer();
}

}  // namespace

const Value* Args::Get(size_t index, absl::string_view name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [key, value] : keyword)
    if (key == name) return &value;
  return nullptr;
}

std::vector<std::string> CodePoints(absl::string_view s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t len;
    DecodeAt(s, i, &len);
    out.emplace_back(s.substr(i, len));
    i += len;
  }
  return out;
}

std::string PyStrip(absl::string_view s, const std::string* chars, bool left, bool right) {
  std::vector<uint32_t> strip_set;
  if (chars != nullptr)
    for (size_t i = 0; i < chars->size();) {
      size_t len;
      strip_set.push_back(DecodeAt(*chars, i, &len));
      i += len;
    }
  auto strip = [&](uint32_t cp) {
    if (chars == nullptr) return IsPyWhitespace(cp);
    for (uint32_t c : strip_set)
      if (c == cp) return true;
    return false;
  };
  std::vector<std::pair<size_t, uint32_t>> cps;  // (offset, code point)
  for (size_t i = 0; i < s.size();) {
    size_t len;
    cps.emplace_back(i, DecodeAt(s, i, &len));
    i += len;
  }
  size_t begin = 0, end = cps.size();
  if (left)
    while (begin < end && strip(cps[begin].second)) ++begin;
  if (right)
    while (end > begin && strip(cps[end - 1].second)) --end;
  const size_t from = begin < cps.size() ? cps[begin].first : s.size();
  const size_t to = end < cps.size() ? cps[end].first : s.size();
  return std::string(s.substr(from, to - from));
}

absl::StatusOr<bool> ApplyTest(absl::string_view name, const Value& v, const Args& args) {
  using Kind = Value::Kind;
  const Value* arg = args.Get(0, "");
  auto need_arg = [&]() -> absl::Status {
    if (arg == nullptr) return absl::InvalidArgumentError(absl::StrCat("test '", name, "' needs an argument"));
    return absl::OkStatus();
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.kind() == Kind::kInt || v.kind() == Kind::kFloat || v.kind() == Kind::kBool;
  if (name == "integer") return v.kind() == Kind::kInt;
  if (name == "float") return v.kind() == Kind::kFloat;
  if (name == "boolean") return v.kind() == Kind::kBool;
  if (name == "true") return v.kind() == Kind::kBool && v.boolean();
  if (name == "false") return v.kind() == Kind::kBool && !v.boolean();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  if (name == "sequence") return v.is_list() || v.is_dict() || v.is_string();
  if (name == "callable") return v.kind() == Kind::kFunction;
  if (name == "lower") return v.is_string() && absl::AsciiStrToLower(v.str()) == v.str();
  if (name == "upper") return v.is_string() && absl::AsciiStrToUpper(v.str()) == v.str();
  if (name == "even" || name == "odd" || name == "divisibleby") {
    if (v.kind() != Kind::kInt && v.kind() != Kind::kBool) return TypeError(absl::StrCat("test '", name, "'"), v);
    int64_t divisor = 2;
    if (name == "divisibleby") {
      QLORA_RETURN_IF_ERROR(need_arg());
      QLORA_ASSIGN_OR_RETURN(divisor, IntArg(arg, 0, "divisibleby's argument"));
      if (divisor == 0) return absl::InvalidArgumentError("divisibleby 0");
    }
    const int64_t rem = v.integer() % divisor;
    return name == "odd" ? rem != 0 : rem == 0;
  }
  if (name == "equalto" || name == "eq" || name == "==" || name == "sameas") {
    QLORA_RETURN_IF_ERROR(need_arg());
    return v.Equals(*arg);
  }
  if (name == "ne" || name == "!=") {
    QLORA_RETURN_IF_ERROR(need_arg());
    return !v.Equals(*arg);
  }
  if (name == "lt" || name == "<" || name == "le" || name == "<=" || name == "gt" || name == ">" ||
      name == "ge" || name == ">=") {
    QLORA_RETURN_IF_ERROR(need_arg());
    int cmp;
    if (v.is_number() && arg->is_number()) cmp = v.number() < arg->number() ? -1 : v.number() > arg->number() ? 1 : 0;
    else if (v.is_string() && arg->is_string()) cmp = v.str().compare(arg->str());
    else return absl::InvalidArgumentError(absl::StrCat("cannot compare ", v.TypeName(), " and ", arg->TypeName()));
    if (name == "lt" || name == "<") return cmp < 0;
    if (name == "le" || name == "<=") return cmp <= 0;
    if (name == "gt" || name == ">") return cmp > 0;
    return cmp >= 0;
  }
  if (name == "in") {
    QLORA_RETURN_IF_ERROR(need_arg());
    if (arg->is_string()) return v.is_string() && arg->str().find(v.str()) != std::string::npos;
    if (arg->is_list()) {
      for (const Value& item : arg->list())
        if (item.Equals(v)) return true;
      return false;
    }
    if (arg->is_dict()) return v.is_string() && arg->Find(v.str()) != nullptr;
    return TypeError("test 'in'", *arg);
  }
  return absl::UnimplementedError(absl::StrCat("test '", name, "'"));
}

absl::StatusOr<Value> ApplyFilter(absl::string_view name, const Value& v, const Args& args,
                                  const RenderLimits& limits) {
  using Kind = Value::Kind;
  if (name == "safe") return v;
  if (name == "trim") {
    if (!v.is_string() && !v.is_undefined()) return TypeError("trim", v);
    const Value* chars = args.Get(0, "chars");
    const std::string* chars_str = chars && chars->is_string() ? &chars->str() : nullptr;
    return Value::String(PyStrip(v.is_string() ? v.str() : "", chars_str, true, true));
  }
  if (name == "length" || name == "count") {
    switch (v.kind()) {
      case Kind::kString: return Value::Int(static_cast<int64_t>(CodePoints(v.str()).size()));
      case Kind::kList: return Value::Int(static_cast<int64_t>(v.list().size()));
      case Kind::kDict: return Value::Int(static_cast<int64_t>(v.dict().size()));
      case Kind::kUndefined: return Value::Int(0);
      default: return TypeError("length", v);
    }
  }
  if (name == "tojson") {
    const Value* ensure_ascii = args.Get(1, "ensure_ascii");
    const Value* separators = args.Get(2, "separators");
    if ((ensure_ascii && ensure_ascii->Truthy()) || (separators && !separators->is_none()))
      return absl::UnimplementedError("tojson with ensure_ascii or separators");
    const Value* indent = args.Get(0, "indent");
    const Value* sort_keys = args.Get(3, "sort_keys");
    QLORA_ASSIGN_OR_RETURN(const int64_t width, IntArg(indent, -1, "tojson's indent"));
    if (width > 64) return absl::InvalidArgumentError("tojson's indent is above 64");
    QLORA_ASSIGN_OR_RETURN(std::string json, v.ToJson(static_cast<int>(width), sort_keys && sort_keys->Truthy()));
    QLORA_RETURN_IF_ERROR(CheckSize(json.size(), limits));
    return Value::String(std::move(json));
  }
  if (name == "string") return v.is_string() ? v : Value::String(v.ToString());
  if (name == "lower" || name == "upper" || name == "capitalize" || name == "title") {
    const std::string s = v.ToString();
    if (name == "lower") return Value::String(absl::AsciiStrToLower(s));
    if (name == "upper") return Value::String(absl::AsciiStrToUpper(s));
    return Value::String(AsciiTitle(s, name == "capitalize"));
  }
  if (name == "first" || name == "last") {
    QLORA_ASSIGN_OR_RETURN(Value list, ToList(v));
    if (list.list().empty()) return Value();
    return name == "first" ? list.list().front() : list.list().back();
  }
  if (name == "list") return ToList(v);
  if (name == "items") {
    if (v.is_undefined()) return Value::MakeList({});
    if (!v.is_dict()) return TypeError("items", v);
    List items;
    for (const auto& [key, value] : v.dict()) items.push_back(Value::MakeList({Value::String(key), value}));
    return Value::MakeList(std::move(items));
  }
  if (name == "join") {
    QLORA_ASSIGN_OR_RETURN(Value list, ToList(v));
    const Value* sep = args.Get(0, "d");
    const Value* attribute = args.Get(1, "attribute");
    std::string out;
    for (size_t i = 0; i < list.list().size(); ++i) {
      if (i && sep) out += sep->ToString();
      const Value& item = list.list()[i];
      out += attribute ? Attribute(item, attribute->ToString()).ToString() : item.ToString();
      QLORA_RETURN_IF_ERROR(CheckSize(out.size(), limits));
    }
    return Value::String(std::move(out));
  }
  if (name == "default" || name == "d") {
    const Value* fallback = args.Get(0, "default_value");
    const Value* boolean = args.Get(1, "boolean");
    const bool use_fallback = v.is_undefined() || (boolean && boolean->Truthy() && !v.Truthy());
    if (!use_fallback) return v;
    return fallback ? *fallback : Value::String("");
  }
  if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
    const bool by_attr = name == "selectattr" || name == "rejectattr";
    const bool keep = name == "selectattr" || name == "select";
    QLORA_ASSIGN_OR_RETURN(Value list, ToList(v));
    const size_t first_test_arg = by_attr ? 1 : 0;
    if (by_attr && args.positional.empty()) return absl::InvalidArgumentError(absl::StrCat(name, " needs an attribute"));
    const std::string attribute = by_attr ? args.positional[0].ToString() : "";
    const Value* test = first_test_arg < args.positional.size() ? &args.positional[first_test_arg] : nullptr;
    Args test_args;
    for (size_t i = first_test_arg + 1; i < args.positional.size(); ++i) test_args.positional.push_back(args.positional[i]);
    List out;
    for (const Value& item : list.list()) {
      const Value subject = by_attr ? Attribute(item, attribute) : item;
      bool passed = subject.Truthy();
      if (test != nullptr) {
        QLORA_ASSIGN_OR_RETURN(passed, ApplyTest(test->ToString(), subject, test_args));
      }
      if (passed == keep) out.push_back(item);
    }
    return Value::MakeList(std::move(out));
  }
  if (name == "map") {
    QLORA_ASSIGN_OR_RETURN(Value list, ToList(v));
    const Value* attribute = args.Get(SIZE_MAX, "attribute");
    List out;
    if (attribute != nullptr) {
      const Value* fallback = args.Get(SIZE_MAX, "default");
      for (const Value& item : list.list()) {
        Value got = Attribute(item, attribute->ToString());
        out.push_back(got.is_undefined() && fallback ? *fallback : got);
      }
      return Value::MakeList(std::move(out));
    }
    if (args.positional.empty()) return absl::InvalidArgumentError("map needs a filter name or attribute=");
    Args filter_args;
    filter_args.positional.assign(args.positional.begin() + 1, args.positional.end());
    filter_args.keyword = args.keyword;
    for (const Value& item : list.list()) {
      QLORA_ASSIGN_OR_RETURN(Value mapped, ApplyFilter(args.positional[0].ToString(), item, filter_args, limits));
      out.push_back(std::move(mapped));
    }
    return Value::MakeList(std::move(out));
  }
  if (name == "replace") {
    const Value* from = args.Get(0, "old");
    const Value* to = args.Get(1, "new");
    if (from == nullptr || to == nullptr) return absl::InvalidArgumentError("replace needs old and new");
    QLORA_ASSIGN_OR_RETURN(const int64_t count, IntArg(args.Get(2, "count"), -1, "replace's count"));
    QLORA_ASSIGN_OR_RETURN(std::string out, ReplaceAll(v.ToString(), from->ToString(), to->ToString(), count, limits));
    return Value::String(std::move(out));
  }
  if (name == "int") {
    if (v.kind() == Kind::kInt || v.kind() == Kind::kBool) return Value::Int(v.integer());
    if (v.kind() == Kind::kFloat && std::isfinite(v.number()) && std::fabs(v.number()) < 9e18)
      return Value::Int(static_cast<int64_t>(v.number()));
    if (v.is_string()) {
      try {
        size_t used = 0;
        const std::string s = PyStrip(v.str(), nullptr, true, true);
        const int64_t i = std::stoll(s, &used);
        if (used == s.size()) return Value::Int(i);
      } catch (const std::exception&) {
      }
    }
    const Value* fallback = args.Get(0, "default");
    return fallback ? *fallback : Value::Int(0);
  }
  if (name == "float") {
    if (v.is_number()) return Value::Float(v.number());
    if (v.is_string()) {
      try {
        size_t used = 0;
        const std::string s = PyStrip(v.str(), nullptr, true, true);
        const double f = std::stod(s, &used);
        if (used == s.size()) return Value::Float(f);
      } catch (const std::exception&) {
      }
    }
    const Value* fallback = args.Get(0, "default");
    return fallback ? *fallback : Value::Float(0.0);
  }
  if (name == "abs") {
    if (v.kind() == Kind::kFloat) return Value::Float(std::fabs(v.number()));
    if (v.kind() == Kind::kInt || v.kind() == Kind::kBool) {
      if (v.integer() == INT64_MIN) return absl::InvalidArgumentError("integer overflow in abs");
      return Value::Int(v.integer() < 0 ? -v.integer() : v.integer());
    }
    return TypeError("abs", v);
  }
  return absl::UnimplementedError(absl::StrCat("filter '", name, "'"));
}

absl::StatusOr<Value> CallMethod(const Value& object, absl::string_view name, const Args& args,
                                 const RenderLimits& limits) {
  if (object.is_string()) {
    const std::string& s = object.str();
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const Value* chars = args.Get(0, "chars");
      const std::string* chars_str = chars && chars->is_string() ? &chars->str() : nullptr;
      return Value::String(PyStrip(s, chars_str, name != "rstrip", name != "lstrip"));
    }
    if (name == "lower" || name == "upper" || name == "title" || name == "capitalize") {
      Args none;
      return ApplyFilter(name, object, none, limits);
    }
    if (name == "startswith" || name == "endswith") {
      const Value* arg = args.Get(0, "prefix");
      if (arg == nullptr) return absl::InvalidArgumentError(absl::StrCat(name, " needs an argument"));
      List options = arg->is_list() ? arg->list() : List{*arg};
      for (const Value& option : options) {
        if (!option.is_string()) return TypeError(name, option);
        const std::string& o = option.str();
        const bool hit = name == "startswith" ? s.compare(0, o.size(), o) == 0
                                              : s.size() >= o.size() && s.compare(s.size() - o.size(), o.size(), o) == 0;
        if (hit) return Value::Bool(true);
      }
      return Value::Bool(false);
    }
    if (name == "replace") return ApplyFilter("replace", object, args, limits);
    if (name == "split") {
      const Value* sep = args.Get(0, "sep");
      QLORA_ASSIGN_OR_RETURN(int64_t maxsplit, IntArg(args.Get(1, "maxsplit"), -1, "split's maxsplit"));
      List parts;
      if (sep == nullptr || sep->is_none()) {  // runs of whitespace, no empty parts
        std::vector<std::string> cps = CodePoints(s);
        std::string current;
        bool in_word = false;
        size_t i = 0;
        for (; i < cps.size(); ++i) {
          size_t len;
          const bool space = IsPyWhitespace(DecodeAt(cps[i], 0, &len));
          if (space && in_word) {
            parts.push_back(Value::String(std::move(current)));
            current.clear();
            in_word = false;
            if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) break;
          } else if (!space) {
            in_word = true;
            current += cps[i];
          }
        }
        if (i < cps.size()) {  // maxsplit reached: the rest, left-stripped
          std::string rest;
          for (; i < cps.size(); ++i) rest += cps[i];
          rest = PyStrip(rest, nullptr, true, false);
          if (!rest.empty()) parts.push_back(Value::String(std::move(rest)));
        } else if (in_word) {
          parts.push_back(Value::String(std::move(current)));
        }
        return Value::MakeList(std::move(parts));
      }
      if (!sep->is_string() || sep->str().empty()) return absl::InvalidArgumentError("split's separator must be a non-empty string");
      size_t pos = 0;
      while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
        const size_t at = s.find(sep->str(), pos);
        if (at == std::string::npos) break;
        parts.push_back(Value::String(s.substr(pos, at - pos)));
        pos = at + sep->str().size();
      }
      parts.push_back(Value::String(s.substr(pos)));
      return Value::MakeList(std::move(parts));
    }
  }
  if (object.is_dict()) {
    if (name == "get") {
      const Value* key = args.Get(0, "key");
      if (key == nullptr) return absl::InvalidArgumentError("get needs a key");
      const Value* fallback = args.Get(1, "default");
      const Value* found = key->is_string() ? object.Find(key->str()) : nullptr;
      return found ? *found : fallback ? *fallback : Value::None();
    }
    if (name == "items") return ApplyFilter("items", object, args, limits);
    if (name == "keys" || name == "values") {
      List out;
      for (const auto& [key, value] : object.dict()) out.push_back(name == "keys" ? Value::String(key) : value);
      return Value::MakeList(std::move(out));
    }
  }
  return absl::UnimplementedError(absl::StrCat("method '", name, "' of a ", object.TypeName()));
}

bool IsGlobalFunction(absl::string_view name) {
  return name == "raise_exception" || name == "namespace" || name == "range" || name == "dict" ||
         name == "strftime_now";
}

absl::StatusOr<Value> CallGlobal(absl::string_view name, const Args& args, const RenderLimits& limits) {
  if (name == "raise_exception") {
    const Value* message = args.Get(0, "message");
    return absl::FailedPreconditionError(message ? message->ToString() : "raise_exception()");
  }
  if (name == "namespace" || name == "dict") {
    Dict attrs;
    for (const Value& positional : args.positional) {
      if (!positional.is_dict()) return TypeError(name, positional);
      attrs.insert(attrs.end(), positional.dict().begin(), positional.dict().end());
    }
    for (const auto& [key, value] : args.keyword) {
      bool replaced = false;
      for (auto& [k, v] : attrs)
        if (k == key) {
          v = value;
          replaced = true;
        }
      if (!replaced) attrs.emplace_back(key, value);
    }
    return name == "namespace" ? Value::MakeNamespace(std::move(attrs)) : Value::MakeDict(std::move(attrs));
  }
  if (name == "range") {
    int64_t start = 0, stop = 0, step = 1;
    for (const Value& a : args.positional)
      if (a.kind() != Value::Kind::kInt && a.kind() != Value::Kind::kBool) return TypeError("range", a);
    if (args.positional.size() == 1) {
      stop = args.positional[0].integer();
    } else if (args.positional.size() == 2 || args.positional.size() == 3) {
      start = args.positional[0].integer();
      stop = args.positional[1].integer();
      if (args.positional.size() == 3) step = args.positional[2].integer();
    } else {
      return absl::InvalidArgumentError("range takes 1 to 3 integers");
    }
    if (step == 0) return absl::InvalidArgumentError("range's step is 0");
    const double count = std::ceil((static_cast<double>(stop) - static_cast<double>(start)) / static_cast<double>(step));
    if (count > static_cast<double>(limits.max_steps))
      return absl::ResourceExhaustedError(absl::StrCat("range of ", count, " items"));
    List items;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) items.push_back(Value::Int(i));
    return Value::MakeList(std::move(items));
  }
  if (name == "strftime_now") {  // transformers: datetime.now().strftime(format)
    const Value* format = args.Get(0, "format");
    if (format == nullptr || !format->is_string()) return absl::InvalidArgumentError("strftime_now needs a format string");
    const std::time_t now = std::time(nullptr);
    std::tm local;
    localtime_r(&now, &local);
    char buf[256];
    const size_t n = std::strftime(buf, sizeof(buf), format->str().c_str(), &local);
    return Value::String(std::string(buf, n));
  }
  return absl::UnimplementedError(absl::StrCat("function '", name, "'"));
}

}  // namespace qlora::data::jinja
