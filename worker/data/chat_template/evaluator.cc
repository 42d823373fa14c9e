// Statement execution and expression evaluation (see evaluator.h).
#include "worker/data/chat_template/evaluator.h"

#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/data/chat_template/builtins.h"
#include "worker/data/chat_template/lexer.h"

namespace qlora::data::jinja {
namespace {

using Kind = Value::Kind;

bool IsInt(const Value& v) { return v.kind() == Kind::kInt || v.kind() == Kind::kBool; }

// Python's slice of a sequence of n items: the selected indices.
std::vector<int64_t> SliceIndices(int64_t n, const Value& start_v, const Value& stop_v, const Value& step_v) {
  const int64_t step = step_v.is_none() || step_v.is_undefined() ? 1 : step_v.integer();
  auto clamp = [&](const Value& v, int64_t fallback) {
    if (v.is_none() || v.is_undefined()) return fallback;
    int64_t i = v.integer();
    if (i < 0) i += n;
    if (step > 0) return std::max<int64_t>(0, std::min(i, n));
    return std::max<int64_t>(-1, std::min(i, n - 1));
  };
  const int64_t start = clamp(start_v, step > 0 ? 0 : n - 1);
  const int64_t stop = clamp(stop_v, step > 0 ? n : -1);
  std::vector<int64_t> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(i);
  return out;
}

class Evaluator {
 public:
  Evaluator(const std::string& source, const RenderLimits& limits) : src_(source), limits_(limits) {}

  absl::StatusOr<RenderResult> Run(const Body& body, const Dict& variables) {
    scopes_.emplace_back();
    for (const auto& [name, value] : variables) scopes_[0][name] = value;
    QLORA_ASSIGN_OR_RETURN(const Flow flow, Exec(body));
    if (flow != Flow::kNormal) return absl::InvalidArgumentError("chat_template: break/continue outside a loop");
    return std::move(result_);
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  absl::Status Error(size_t pos, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("chat_template: ", what, " at ", Where(src_, pos)));
  }
  // A builtin's error with the template position added.
  absl::Status At(size_t pos, const absl::Status& status) const {
    if (status.ok()) return status;
    if (status.code() == absl::StatusCode::kFailedPrecondition)  // raise_exception
      return absl::FailedPreconditionError(absl::StrCat("chat_template raised an exception at ",
                                                        Where(src_, pos), ": ", status.message()));
    if (status.code() == absl::StatusCode::kUnimplemented)
      return absl::UnimplementedError(absl::StrCat("chat_template: ", status.message(),
                                                   " is not supported (at ", Where(src_, pos), ")"));
    return absl::Status(status.code(), absl::StrCat("chat_template: ", status.message(), " at ", Where(src_, pos)));
  }
  absl::Status Step(size_t pos, int64_t n = 1) {
    steps_ += n;
    if (steps_ > limits_.max_steps)
      return absl::ResourceExhaustedError(absl::StrCat("chat_template: more than ", limits_.max_steps,
                                                       " evaluation steps (at ", Where(src_, pos), ")"));
    return absl::OkStatus();
  }
  absl::Status CheckSize(size_t pos, size_t bytes) const {
    if (bytes > limits_.max_output_bytes)
      return absl::ResourceExhaustedError(absl::StrCat("chat_template: output or a value grew past ",
                                                       limits_.max_output_bytes, " bytes (at ",
                                                       Where(src_, pos), ")"));
    return absl::OkStatus();
  }

  Value Lookup(const std::string& name) const {
    for (auto scope = scopes_.rbegin(); scope != scopes_.rend(); ++scope) {
      auto it = scope->find(name);
      if (it != scope->end()) return it->second;
    }
    if (IsGlobalFunction(name)) return Value::Function(name);
    return Value();
  }

  absl::Status Bind(const std::vector<std::string>& targets, const Value& value, size_t pos) {
    if (targets.size() == 1) {
      scopes_.back()[targets[0]] = value;
      return absl::OkStatus();
    }
    if (!value.is_list() || value.list().size() != targets.size())
      return Error(pos, absl::StrCat("cannot unpack a ", value.TypeName(), " into ", targets.size(), " names"));
    for (size_t i = 0; i < targets.size(); ++i) scopes_.back()[targets[i]] = value.list()[i];
    return absl::OkStatus();
  }

  absl::StatusOr<Flow> Exec(const Body& body) {
    for (const auto& stmt : body) {
      QLORA_ASSIGN_OR_RETURN(const Flow flow, ExecStmt(*stmt));
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  absl::StatusOr<Flow> ExecStmt(const Stmt& stmt) {
    QLORA_RETURN_IF_ERROR(Step(stmt.pos));
    switch (stmt.kind) {
      case Stmt::Kind::kText:
        result_.text += stmt.text;
        QLORA_RETURN_IF_ERROR(CheckSize(stmt.pos, result_.text.size()));
        return Flow::kNormal;
      case Stmt::Kind::kOutput: {
        QLORA_ASSIGN_OR_RETURN(const Value v, Eval(*stmt.expr));
        if (v.is_string()) result_.text += v.str();
        else result_.text += v.ToString();
        QLORA_RETURN_IF_ERROR(CheckSize(stmt.pos, result_.text.size()));
        return Flow::kNormal;
      }
      case Stmt::Kind::kIf: {
        for (size_t i = 0; i < stmt.conditions.size(); ++i) {
          QLORA_ASSIGN_OR_RETURN(const Value v, Eval(*stmt.conditions[i]));
          if (v.Truthy()) return Exec(stmt.bodies[i]);
        }
        if (stmt.bodies.size() > stmt.conditions.size()) return Exec(stmt.bodies.back());
        return Flow::kNormal;
      }
      case Stmt::Kind::kFor: return ExecFor(stmt);
      case Stmt::Kind::kSet: {
        QLORA_ASSIGN_OR_RETURN(const Value v, Eval(*stmt.expr));
        if (stmt.attribute.empty()) {
          QLORA_RETURN_IF_ERROR(Bind(stmt.targets, v, stmt.pos));
          return Flow::kNormal;
        }
        Value ns = Lookup(stmt.targets[0]);
        if (!ns.is_namespace())
          return Error(stmt.pos, absl::StrCat("cannot set an attribute of '", stmt.targets[0], "' (a ",
                                              ns.TypeName(), ", not a namespace())"));
        Dict* attrs = ns.mutable_namespace();
        for (auto& [key, value] : *attrs)
          if (key == stmt.attribute) {
            value = v;
            return Flow::kNormal;
          }
        attrs->emplace_back(stmt.attribute, v);
        return Flow::kNormal;
      }
      case Stmt::Kind::kBreak: return Flow::kBreak;
      case Stmt::Kind::kContinue: return Flow::kContinue;
      case Stmt::Kind::kGeneration: {
        const size_t start = result_.text.size();
        QLORA_ASSIGN_OR_RETURN(const Flow flow, Exec(stmt.bodies[0]));
        result_.generation_spans.emplace_back(start, result_.text.size());
        return flow;
      }
    }
    return Error(stmt.pos, "unknown statement");
  }

  absl::StatusOr<Flow> ExecFor(const Stmt& stmt) {
    QLORA_ASSIGN_OR_RETURN(const Value iterable, Eval(*stmt.expr));
    List items;
    switch (iterable.kind()) {
      case Kind::kList: items = iterable.list(); break;
      case Kind::kUndefined: break;
      case Kind::kDict:
        for (const auto& [key, unused] : iterable.dict()) items.push_back(Value::String(key));
        break;
      case Kind::kString:
        for (std::string& cp : CodePoints(iterable.str())) items.push_back(Value::String(std::move(cp)));
        break;
      default: return Error(stmt.expr->pos, absl::StrCat("cannot loop over a ", iterable.TypeName()));
    }
    if (stmt.condition) {  // {% for x in xs if cond %}: filtered before loop.* is computed
      List kept;
      for (const Value& item : items) {
        QLORA_RETURN_IF_ERROR(Step(stmt.pos));
        scopes_.emplace_back();
        absl::Status bound = Bind(stmt.targets, item, stmt.pos);
        absl::StatusOr<Value> keep = bound.ok() ? Eval(*stmt.condition) : absl::StatusOr<Value>(bound);
        scopes_.pop_back();
        if (!keep.ok()) return keep.status();
        if (keep->Truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      QLORA_RETURN_IF_ERROR(Step(stmt.pos));
      scopes_.emplace_back();
      Dict loop = {{"index0", Value::Int(i)},
                   {"index", Value::Int(i + 1)},
                   {"revindex0", Value::Int(n - i - 1)},
                   {"revindex", Value::Int(n - i)},
                   {"first", Value::Bool(i == 0)},
                   {"last", Value::Bool(i == n - 1)},
                   {"length", Value::Int(n)},
                   {"depth", Value::Int(1)},
                   {"depth0", Value::Int(0)},
                   {"previtem", i > 0 ? items[i - 1] : Value()},
                   {"nextitem", i + 1 < n ? items[i + 1] : Value()}};
      scopes_.back()["loop"] = Value::MakeDict(std::move(loop));
      absl::Status bound = Bind(stmt.targets, items[i], stmt.pos);
      absl::StatusOr<Flow> flow = bound.ok() ? Exec(stmt.bodies[0]) : absl::StatusOr<Flow>(bound);
      scopes_.pop_back();
      if (!flow.ok()) return flow.status();
      if (*flow == Flow::kBreak) break;
    }
    if (n == 0 && stmt.bodies.size() > 1) {
      scopes_.emplace_back();
      absl::StatusOr<Flow> flow = Exec(stmt.bodies[1]);
      scopes_.pop_back();
      if (!flow.ok()) return flow.status();
      if (*flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  absl::Status EvalArgs(const Expr& e, size_t first, Args* args) {
    for (size_t i = first; i < e.items.size(); ++i) {
      QLORA_ASSIGN_OR_RETURN(Value v, Eval(*e.items[i]));
      args->positional.push_back(std::move(v));
    }
    for (size_t i = 0; i < e.kwarg_names.size(); ++i) {
      QLORA_ASSIGN_OR_RETURN(Value v, Eval(*e.kwarg_values[i]));
      args->keyword.emplace_back(e.kwarg_names[i], std::move(v));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Value> Eval(const Expr& e) {
    QLORA_RETURN_IF_ERROR(Step(e.pos));
    switch (e.kind) {
      case Expr::Kind::kLiteral: return e.value;
      case Expr::Kind::kName: return Lookup(e.name);
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        List items;
        for (const auto& item : e.items) {
          QLORA_ASSIGN_OR_RETURN(Value v, Eval(*item));
          items.push_back(std::move(v));
        }
        return Value::MakeList(std::move(items));
      }
      case Expr::Kind::kDict: {
        Dict items;
        for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
          QLORA_ASSIGN_OR_RETURN(const Value key, Eval(*e.items[i]));
          if (!key.is_string()) return Error(e.items[i]->pos, "dict keys must be strings");
          QLORA_ASSIGN_OR_RETURN(Value v, Eval(*e.items[i + 1]));
          items.emplace_back(key.str(), std::move(v));
        }
        return Value::MakeDict(std::move(items));
      }
      case Expr::Kind::kAttr: {
        QLORA_ASSIGN_OR_RETURN(const Value object, Eval(*e.items[0]));
        if (object.is_undefined())
          return Error(e.pos, absl::StrCat("attribute '", e.name, "' of an undefined value"));
        const Value* found = object.Find(e.name);
        return found ? *found : Value();
      }
      case Expr::Kind::kItem: return EvalItem(e);
      case Expr::Kind::kSlice: return EvalSlice(e);
      case Expr::Kind::kCall: return EvalCall(e);
      case Expr::Kind::kFilter: {
        QLORA_ASSIGN_OR_RETURN(const Value input, Eval(*e.items[0]));
        Args args;
        QLORA_RETURN_IF_ERROR(EvalArgs(e, 1, &args));
        absl::StatusOr<Value> out = ApplyFilter(e.name, input, args, limits_);
        if (!out.ok()) return At(e.pos, out.status());
        return out;
      }
      case Expr::Kind::kTest: {
        QLORA_ASSIGN_OR_RETURN(const Value input, Eval(*e.items[0]));
        Args args;
        QLORA_RETURN_IF_ERROR(EvalArgs(e, 1, &args));
        absl::StatusOr<bool> passed = ApplyTest(e.name, input, args);
        if (!passed.ok()) return At(e.pos, passed.status());
        return Value::Bool(*passed != e.negated);
      }
      case Expr::Kind::kUnary: {
        QLORA_ASSIGN_OR_RETURN(const Value v, Eval(*e.items[0]));
        if (e.name == "not") return Value::Bool(!v.Truthy());
        if (v.kind() == Kind::kFloat) return Value::Float(e.name == "-" ? -v.number() : v.number());
        if (!IsInt(v)) return Error(e.pos, absl::StrCat("bad operand type for unary ", e.name, ": ", v.TypeName()));
        if (e.name == "-" && v.integer() == INT64_MIN) return Error(e.pos, "integer overflow");
        return Value::Int(e.name == "-" ? -v.integer() : v.integer());
      }
      case Expr::Kind::kBinary: {
        QLORA_ASSIGN_OR_RETURN(const Value left, Eval(*e.items[0]));
        if (e.name == "and") return left.Truthy() ? Eval(*e.items[1]) : left;
        if (e.name == "or") return left.Truthy() ? left : Eval(*e.items[1]);
        QLORA_ASSIGN_OR_RETURN(const Value right, Eval(*e.items[1]));
        return Binary(e, left, right);
      }
      case Expr::Kind::kCondition: {
        QLORA_ASSIGN_OR_RETURN(const Value test, Eval(*e.items[0]));
        if (test.Truthy()) return Eval(*e.items[1]);
        if (e.items[2]) return Eval(*e.items[2]);
        return Value();
      }
    }
    return Error(e.pos, "unknown expression");
  }

  absl::StatusOr<Value> EvalItem(const Expr& e) {
    QLORA_ASSIGN_OR_RETURN(const Value object, Eval(*e.items[0]));
    QLORA_ASSIGN_OR_RETURN(const Value key, Eval(*e.items[1]));
    if (object.is_undefined()) return Error(e.pos, "subscript of an undefined value");
    if (object.is_dict() || object.is_namespace()) {
      const Value* found = key.is_string() ? object.Find(key.str()) : nullptr;
      return found ? *found : Value();
    }
    if ((object.is_list() || object.is_string()) && IsInt(key)) {
      std::vector<std::string> cps;
      if (object.is_string()) cps = CodePoints(object.str());
      const int64_t n = object.is_list() ? static_cast<int64_t>(object.list().size()) : static_cast<int64_t>(cps.size());
      int64_t i = key.integer();
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value();
      return object.is_list() ? object.list()[i] : Value::String(cps[i]);
    }
    return Value();
  }

  absl::StatusOr<Value> EvalSlice(const Expr& e) {
    QLORA_ASSIGN_OR_RETURN(const Value object, Eval(*e.items[0]));
    Value bounds[3];
    for (int i = 0; i < 3; ++i) {
      if (!e.items[i + 1]) continue;
      QLORA_ASSIGN_OR_RETURN(bounds[i], Eval(*e.items[i + 1]));
      if (!bounds[i].is_none() && !IsInt(bounds[i])) return Error(e.pos, "slice bounds must be integers");
    }
    if (!bounds[2].is_none() && !bounds[2].is_undefined() && bounds[2].integer() == 0)
      return Error(e.pos, "slice step cannot be zero");
    if (object.is_list()) {
      List out;
      for (int64_t i : SliceIndices(static_cast<int64_t>(object.list().size()), bounds[0], bounds[1], bounds[2]))
        out.push_back(object.list()[i]);
      return Value::MakeList(std::move(out));
    }
    if (object.is_string()) {
      std::vector<std::string> cps = CodePoints(object.str());
      std::string out;
      for (int64_t i : SliceIndices(static_cast<int64_t>(cps.size()), bounds[0], bounds[1], bounds[2])) out += cps[i];
      return Value::String(std::move(out));
    }
    return Error(e.pos, absl::StrCat("cannot slice a ", object.TypeName()));
  }

  absl::StatusOr<Value> EvalCall(const Expr& e) {
    const Expr& callee = *e.items[0];
    Args args;
    if (callee.kind == Expr::Kind::kAttr) {  // a method: object.name(...)
      QLORA_ASSIGN_OR_RETURN(const Value object, Eval(*callee.items[0]));
      if (object.is_undefined())
        return Error(callee.pos, absl::StrCat("method '", callee.name, "' of an undefined value"));
      QLORA_RETURN_IF_ERROR(EvalArgs(e, 1, &args));
      absl::StatusOr<Value> out = CallMethod(object, callee.name, args, limits_);
      if (!out.ok()) return At(e.pos, out.status());
      return out;
    }
    QLORA_ASSIGN_OR_RETURN(const Value function, Eval(callee));
    if (function.kind() != Kind::kFunction)
      return Error(e.pos, absl::StrCat("a ", function.TypeName(), " is not callable"));
    QLORA_RETURN_IF_ERROR(EvalArgs(e, 1, &args));
    absl::StatusOr<Value> out = CallGlobal(function.str(), args, limits_);
    if (!out.ok()) return At(e.pos, out.status());
    if (out->is_list()) QLORA_RETURN_IF_ERROR(Step(e.pos, static_cast<int64_t>(out->list().size())));
    return out;
  }

  absl::StatusOr<Value> Binary(const Expr& e, const Value& l, const Value& r) {
    const std::string& op = e.name;
    if (op == "==") return Value::Bool(l.Equals(r));
    if (op == "!=") return Value::Bool(!l.Equals(r));
    if (op == "~") {
      std::string s = l.ToString() + r.ToString();
      QLORA_RETURN_IF_ERROR(CheckSize(e.pos, s.size()));
      return Value::String(std::move(s));
    }
    if (op == "in" || op == "notin") {
      bool found = false;
      if (r.is_string()) {
        if (!l.is_string()) return Error(e.pos, absl::StrCat("'in <string>' needs a string on the left, not a ", l.TypeName()));
        found = r.str().find(l.str()) != std::string::npos;
      } else if (r.is_list()) {
        for (const Value& item : r.list()) found = found || item.Equals(l);
      } else if (r.is_dict() || r.is_namespace()) {
        found = l.is_string() && r.Find(l.str()) != nullptr;
      } else if (!r.is_undefined()) {
        return Error(e.pos, absl::StrCat("'in' a ", r.TypeName()));
      }
      return Value::Bool(found != (op == "notin"));
    }
    if (l.is_undefined() || r.is_undefined())
      return Error(e.pos, absl::StrCat("an undefined value in '", op, "'"));
    auto type_error = [&]() {
      return Error(e.pos, absl::StrCat("unsupported operand types for ", op, ": ", l.TypeName(), " and ", r.TypeName()));
    };
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int cmp;
      if (l.is_number() && r.is_number()) cmp = l.number() < r.number() ? -1 : l.number() > r.number() ? 1 : 0;
      else if (l.is_string() && r.is_string()) cmp = l.str().compare(r.str());
      else return type_error();
      return Value::Bool(op == "<" ? cmp < 0 : op == ">" ? cmp > 0 : op == "<=" ? cmp <= 0 : cmp >= 0);
    }
    if (op == "+") {
      if (l.is_string() && r.is_string()) {
        QLORA_RETURN_IF_ERROR(CheckSize(e.pos, l.str().size() + r.str().size()));
        return Value::String(l.str() + r.str());
      }
      if (l.is_list() && r.is_list()) {
        QLORA_RETURN_IF_ERROR(Step(e.pos, static_cast<int64_t>(l.list().size() + r.list().size())));
        List items = l.list();
        items.insert(items.end(), r.list().begin(), r.list().end());
        return Value::MakeList(std::move(items));
      }
    }
    if (op == "*" && ((l.is_string() || l.is_list()) && IsInt(r) || IsInt(l) && (r.is_string() || r.is_list()))) {
      const Value& seq = IsInt(l) ? r : l;
      const int64_t times = std::max<int64_t>(0, IsInt(l) ? l.integer() : r.integer());
      const size_t unit = seq.is_string() ? seq.str().size() : seq.list().size();
      if (unit != 0 && static_cast<uint64_t>(times) > limits_.max_output_bytes / unit)
        return CheckSize(e.pos, limits_.max_output_bytes + 1);
      if (seq.is_string()) {
        std::string out;
        for (int64_t i = 0; i < times; ++i) out += seq.str();
        return Value::String(std::move(out));
      }
      QLORA_RETURN_IF_ERROR(Step(e.pos, static_cast<int64_t>(unit) * times));
      List items;
      for (int64_t i = 0; i < times; ++i) items.insert(items.end(), seq.list().begin(), seq.list().end());
      return Value::MakeList(std::move(items));
    }
    if (!l.is_number() || !r.is_number()) return type_error();
    const bool ints = IsInt(l) && IsInt(r);
    const int64_t a = l.integer(), b = r.integer();
    const double x = l.number(), y = r.number();
    int64_t result;
    if (op == "+") {
      if (!ints) return Value::Float(x + y);
      if (__builtin_add_overflow(a, b, &result)) return Error(e.pos, "integer overflow");
      return Value::Int(result);
    }
    if (op == "-") {
      if (!ints) return Value::Float(x - y);
      if (__builtin_sub_overflow(a, b, &result)) return Error(e.pos, "integer overflow");
      return Value::Int(result);
    }
    if (op == "*") {
      if (!ints) return Value::Float(x * y);
      if (__builtin_mul_overflow(a, b, &result)) return Error(e.pos, "integer overflow");
      return Value::Int(result);
    }
    if (op == "/") {
      if (y == 0) return Error(e.pos, "division by zero");
      return Value::Float(x / y);
    }
    if (op == "//" || op == "%") {
      if (y == 0) return Error(e.pos, op == "%" ? "modulo by zero" : "division by zero");
      if (ints) {
        if (a == INT64_MIN && b == -1) return Error(e.pos, "integer overflow");
        int64_t q = a / b, m = a % b;
        if (m != 0 && ((m < 0) != (b < 0))) {
          --q;
          m += b;
        }
        return Value::Int(op == "//" ? q : m);
      }
      const double q = std::floor(x / y);
      return Value::Float(op == "//" ? q : x - q * y);
    }
    if (op == "**") {
      if (ints && b >= 0) {
        if (a == 0 || a == 1) return Value::Int(b == 0 ? 1 : a);
        if (a == -1) return Value::Int(b % 2 ? -1 : 1);
        int64_t out = 1;  // |a| >= 2: overflows within 63 steps
        for (int64_t i = 0; i < b; ++i)
          if (__builtin_mul_overflow(out, a, &out)) return Error(e.pos, "integer overflow");
        return Value::Int(out);
      }
      return Value::Float(std::pow(x, y));
    }
    return type_error();
  }

  const std::string& src_;
  const RenderLimits& limits_;
  std::vector<absl::flat_hash_map<std::string, Value>> scopes_;
  RenderResult result_;
  int64_t steps_ = 0;
};

}  // namespace

absl::StatusOr<RenderResult> Evaluate(const Body& body, const std::string& source,
                                      const Dict& variables, const RenderLimits& limits) {
  return Evaluator(source, limits).Run(body, variables);
}

}  // namespace qlora::data::jinja
