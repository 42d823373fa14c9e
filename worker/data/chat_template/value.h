// The values a chat template computes with, with Python/Jinja semantics: undefined, none, bool,
// int, float, string, list, dict (insertion-ordered, string keys), namespace, and the name of a
// global function. Strings, lists and dicts are shared (copying a Value is cheap); the sandbox
// never mutates a list or dict in place, only a namespace's attributes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json_fwd.hpp"

namespace qlora::data::jinja {

class Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kFunction };

  Value() = default;  // undefined
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double f);
  static Value String(std::string s);
  static Value MakeList(List items);
  static Value MakeDict(Dict items);
  static Value MakeNamespace(Dict attrs);
  static Value Function(std::string name);  // a global function, by name
  // JSON to Value (null is none; integers that fit int64 are ints, other numbers floats).
  static Value FromJson(const nlohmann::ordered_json& json);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }

  bool boolean() const { return bool_; }
  int64_t integer() const { return kind_ == Kind::kBool ? bool_ : int_; }
  double number() const { return kind_ == Kind::kFloat ? float_ : static_cast<double>(integer()); }
  const std::string& str() const { return *str_; }
  const List& list() const { return *list_; }
  const Dict& dict() const { return *dict_; }
  Dict* mutable_namespace() { return dict_.get(); }  // namespaces only

  // Python truthiness.
  bool Truthy() const;
  // A dict's or namespace's entry, or nullptr.
  const Value* Find(absl::string_view key) const;
  // Python str(): what {{ value }} prints (undefined prints nothing, none "None").
  std::string ToString() const;
  // Python repr() (how a string prints inside a printed list).
  std::string Repr() const;
  // Python ==.
  bool Equals(const Value& other) const;
  // json.dumps(value, ensure_ascii=False, indent=indent (<0: none), sort_keys=sort_keys), as
  // transformers' tojson filter. Undefined and functions cannot be serialized.
  absl::StatusOr<std::string> ToJson(int indent, bool sort_keys) const;
  // The type's name, for error messages.
  const char* TypeName() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool bool_ = false;
  int64_t int_ = 0;
  double float_ = 0;
  std::shared_ptr<const std::string> str_;
  std::shared_ptr<const List> list_;
  std::shared_ptr<Dict> dict_;  // dict (never mutated) or namespace (mutable attributes)
};

// Python's repr() of a float ("1.0", "0.1", "1e-05", "inf").
std::string FloatRepr(double value);

}  // namespace qlora::data::jinja
