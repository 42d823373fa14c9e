// The parsed form of a chat template: expression and statement nodes, each with its source
// offset for error messages.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "worker/data/chat_template/value.h"

namespace qlora::data::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,   // value
    kName,      // name
    kList,      // items
    kTuple,     // items
    kDict,      // items: key0, value0, key1, value1, ...
    kAttr,      // items[0].name
    kItem,      // items[0][items[1]]
    kSlice,     // items[0][items[1]:items[2]:items[3]] (null where left out)
    kCall,      // items[0](items[1..], kwarg_names/kwarg_values)
    kFilter,    // items[0] | name(items[1..], kwargs)
    kTest,      // items[0] is [not] name(items[1..])
    kUnary,     // op in {"-", "+", "not"}: op items[0]
    kBinary,    // items[0] op items[1]; op one of + - * / // % ** ~ == != < > <= >= in notin and or
    kCondition  // items[1] if items[0] else items[2] (items[2] null: undefined)
  };
  Kind kind;
  size_t pos = 0;
  Value value;
  std::string name;  // name, attribute, callee-free filter/test name, or operator
  bool negated = false;  // kTest
  std::vector<ExprPtr> items;
  std::vector<std::string> kwarg_names;
  std::vector<ExprPtr> kwarg_values;
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum class Kind {
    kText,        // text
    kOutput,      // {{ expr }}
    kIf,          // conditions[i] -> bodies[i]; bodies.back() is the else body when it has
                  // one more entry than conditions
    kFor,         // for targets in expr [if condition] bodies[0] [else bodies[1]]
    kSet,         // set targets = expr, or set targets[0].attribute = expr
    kBreak,
    kContinue,
    kGeneration,  // transformers' {% generation %}: bodies[0]
  };
  Kind kind;
  size_t pos = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;              // kFor's filter
  std::vector<ExprPtr> conditions;  // kIf
  std::vector<Body> bodies;
  std::vector<std::string> targets;
  std::string attribute;  // kSet on a namespace attribute
};

}  // namespace qlora::data::jinja
