// Recursive-descent parser for the chat-template subset, with Jinja's precedence
// (jinja2/parser.py), lowest first:
//   condition:  or_expr ["if" or_expr ["else" condition]]
//   or / and / not / comparison (== != < > <= >= in, not in)
//   + -   then   ~   then   * / // %   then   **
//   unary - +, then a primary with postfixes (.attr, [index], [a:b:c], (call)) and then
//   filters (| name(args)) and tests (is [not] name [arg]).
// Statements: if/elif/else, for [if filter]/else, set (name, a, b, ns.attr), break, continue,
// generation.
#include "worker/data/chat_template/parser.h"

#include <initializer_list>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace qlora::data::jinja {
namespace {

using K = Token::Kind;

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, const std::string& source) : tokens_(tokens), src_(source) {}

  absl::StatusOr<Body> Run() {
    std::string end;
    QLORA_ASSIGN_OR_RETURN(Body body, ParseBody({}, &end));
    return body;
  }

 private:
  // Depth guard for recursion.
  struct Nest {
    explicit Nest(int* depth) : depth_(depth) { ++*depth_; }
    ~Nest() { --*depth_; }
    int* depth_;
  };
  absl::Status CheckDepth(size_t pos) {
    if (depth_ > kMaxNesting)
      return Error(pos, absl::StrCat("nesting deeper than ", kMaxNesting, " levels"));
    return absl::OkStatus();
  }

  const Token& Peek(size_t ahead = 0) const {
    const size_t i = index_ + ahead;
    return i < tokens_.size() ? tokens_[i] : tokens_.back();
  }
  const Token& Next() { return tokens_[index_ < tokens_.size() - 1 ? index_++ : index_]; }
  bool IsOp(absl::string_view op, size_t ahead = 0) const {
    return Peek(ahead).kind == K::kOp && Peek(ahead).text == op;
  }
  bool IsName(absl::string_view name, size_t ahead = 0) const {
    return Peek(ahead).kind == K::kName && Peek(ahead).text == name;
  }
  absl::Status Error(size_t pos, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("chat_template: ", what, " at ", Where(src_, pos)));
  }
  absl::Status Unsupported(size_t pos, absl::string_view what) const {
    return absl::UnimplementedError(
        absl::StrCat("chat_template: ", what, " is not supported (at ", Where(src_, pos), ")"));
  }
  absl::Status ExpectOp(absl::string_view op) {
    if (!IsOp(op)) return Error(Peek().pos, absl::StrCat("expected '", op, "'"));
    Next();
    return absl::OkStatus();
  }
  absl::Status Expect(K kind, absl::string_view what) {
    if (Peek().kind != kind) return Error(Peek().pos, absl::StrCat("expected ", what));
    Next();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Peek().kind != K::kName) return Error(Peek().pos, "expected a name");
    return Next().text;
  }

  // Statements up to `{% <one of ends> ...`; *end is that name ("" at the end of the template).
  absl::StatusOr<Body> ParseBody(std::initializer_list<const char*> ends, std::string* end) {
    Nest nest(&depth_);
    QLORA_RETURN_IF_ERROR(CheckDepth(Peek().pos));
    Body body;
    while (true) {
      const Token& token = Peek();
      if (token.kind == K::kEnd) {
        if (ends.size() != 0)
          return Error(token.pos, absl::StrCat("missing {% ", *ends.begin() == std::string("elif") ? "endif" : *(ends.end() - 1), " %}"));
        *end = "";
        return body;
      }
      if (token.kind == K::kText) {
        auto stmt = std::make_unique<Stmt>();
        stmt->kind = Stmt::Kind::kText;
        stmt->pos = token.pos;
        stmt->text = token.text;
        body.push_back(std::move(stmt));
        Next();
        continue;
      }
      if (token.kind == K::kVarBegin) {
        Next();
        auto stmt = std::make_unique<Stmt>();
        stmt->kind = Stmt::Kind::kOutput;
        stmt->pos = token.pos;
        QLORA_ASSIGN_OR_RETURN(stmt->expr, ParseTuple(true));
        QLORA_RETURN_IF_ERROR(Expect(K::kVarEnd, "'}}'"));
        body.push_back(std::move(stmt));
        continue;
      }
      if (token.kind != K::kBlockBegin) return Error(token.pos, "unexpected token");
      const Token& keyword = Peek(1);
      if (keyword.kind != K::kName) return Error(keyword.pos, "expected a statement name");
      for (const char* name : ends) {
        if (keyword.text == name) {
          *end = keyword.text;
          Next();
          Next();
          return body;
        }
      }
      Next();
      QLORA_ASSIGN_OR_RETURN(std::unique_ptr<Stmt> stmt, ParseStatement());
      body.push_back(std::move(stmt));
    }
  }

  absl::StatusOr<std::unique_ptr<Stmt>> ParseStatement() {
    const Token& keyword = Next();
    auto stmt = std::make_unique<Stmt>();
    stmt->pos = keyword.pos;
    const std::string& name = keyword.text;
    if (name == "if") {
      stmt->kind = Stmt::Kind::kIf;
      std::string end = "elif";
      while (end == "elif") {
        QLORA_ASSIGN_OR_RETURN(ExprPtr condition, ParseTuple(true));
        stmt->conditions.push_back(std::move(condition));
        QLORA_RETURN_IF_ERROR(Expect(K::kBlockEnd, "'%}'"));
        QLORA_ASSIGN_OR_RETURN(Body body, ParseBody({"elif", "else", "endif"}, &end));
        stmt->bodies.push_back(std::move(body));
      }
      if (end == "else") {
        QLORA_RETURN_IF_ERROR(Expect(K::kBlockEnd, "'%}'"));
        QLORA_ASSIGN_OR_RETURN(Body body, ParseBody({"endif"}, &end));
        stmt->bodies.push_back(std::move(body));
      }
      QLORA_RETURN_IF_ERROR(Expect(K::kBlockEnd, "'%}'"));
      return stmt;
    }
    if (name == "for") {
      stmt->kind = Stmt::Kind::kFor;
      do {
        if (!stmt->targets.empty()) Next();  // ','
        QLORA_ASSIGN_OR_RETURN(std::string target, ExpectName());
        stmt->targets.push_back(std::move(target));
      } while (IsOp(","));
      if (!IsName("in")) return Error(Peek().pos, "expected 'in'");
      Next();
      QLORA_ASSIGN_OR_RETURN(stmt->expr, ParseTuple(false));
      if (IsName("if")) {
        Next();
        QLORA_ASSIGN_OR_RETURN(stmt->condition, ParseCondition(true));
      }
      if (IsName("recursive")) return Unsupported(Peek().pos, "a recursive loop");
      QLORA_RETURN_IF_ERROR(Expect(K::kBlockEnd, "'%}'"));
      std::string end;
      QLORA_ASSIGN_OR_RETURN(Body body, ParseBody({"else", "endfor"}, &end));
      stmt->bodies.push_back(std::move(body));
      if (end == "else") {
        QLORA_RETURN_IF_ERROR(Expect(K::kBlockEnd, "'%}'"));
        QLORA_ASSIGN_OR_RETURN(Body else_body, ParseBody({"endfor"}, &end));
        stmt->bodies.push_back(std::move(else_body));
      }
      QLORA_RETURN_IF_ERROR(Expect(K::kBlockEnd, "'%}'"));
      return stmt;
    }
    if (name == "set") {
      stmt->kind = Stmt::Kind::kSet;
      QLORA_ASSIGN_OR_RETURN(std::string target, ExpectName());
      stmt->targets.push_back(std::move(target));
      if (IsOp(".")) {
        Next();
        QLORA_ASSIGN_OR_RETURN(stmt->attribute, ExpectName());
      } else {
        while (IsOp(",")) {
          Next();
          QLORA_ASSIGN_OR_RETURN(std::string more, ExpectName());
          stmt->targets.push_back(std::move(more));
        }
      }
      if (!IsOp("=")) return Unsupported(Peek().pos, "a block {% set %} (or a set without '=')");
      Next();
      QLORA_ASSIGN_OR_RETURN(stmt->expr, ParseTuple(true));
      QLORA_RETURN_IF_ERROR(Expect(K::kBlockEnd, "'%}'"));
      return stmt;
    }
    if (name == "break" || name == "continue") {
      stmt->kind = name == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      QLORA_RETURN_IF_ERROR(Expect(K::kBlockEnd, "'%}'"));
      return stmt;
    }
    if (name == "generation") {
      stmt->kind = Stmt::Kind::kGeneration;
      QLORA_RETURN_IF_ERROR(Expect(K::kBlockEnd, "'%}'"));
      std::string end;
      QLORA_ASSIGN_OR_RETURN(Body body, ParseBody({"endgeneration"}, &end));
      stmt->bodies.push_back(std::move(body));
      QLORA_RETURN_IF_ERROR(Expect(K::kBlockEnd, "'%}'"));
      return stmt;
    }
    for (const char* known : {"macro", "call", "filter", "include", "import", "from", "extends",
                              "block", "raw", "with", "autoescape", "do", "trans"})
      if (name == known) return Unsupported(keyword.pos, absl::StrCat("{% ", name, " %}"));
    return Error(keyword.pos, absl::StrCat("unknown statement '", name, "'"));
  }

  // expr ("," expr)* -> a tuple when there is a comma.
  absl::StatusOr<ExprPtr> ParseTuple(bool with_condition) {
    const size_t pos = Peek().pos;
    QLORA_ASSIGN_OR_RETURN(ExprPtr first, ParseCondition(with_condition));
    if (!IsOp(",")) return first;
    auto tuple = MakeExpr(Expr::Kind::kTuple, pos);
    tuple->items.push_back(std::move(first));
    while (IsOp(",")) {
      Next();
      if (Peek().kind == K::kBlockEnd || Peek().kind == K::kVarEnd || IsOp(")")) break;
      QLORA_ASSIGN_OR_RETURN(ExprPtr item, ParseCondition(with_condition));
      tuple->items.push_back(std::move(item));
    }
    return tuple;
  }

  static ExprPtr MakeExpr(Expr::Kind kind, size_t pos) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->pos = pos;
    return e;
  }
  static ExprPtr Binary(std::string op, ExprPtr left, ExprPtr right, size_t pos) {
    auto e = MakeExpr(Expr::Kind::kBinary, pos);
    e->name = std::move(op);
    e->items.push_back(std::move(left));
    e->items.push_back(std::move(right));
    return e;
  }

  absl::StatusOr<ExprPtr> ParseCondition(bool with_condition = true) {
    Nest nest(&depth_);
    QLORA_RETURN_IF_ERROR(CheckDepth(Peek().pos));
    const size_t pos = Peek().pos;
    QLORA_ASSIGN_OR_RETURN(ExprPtr expr, ParseOr());
    while (with_condition && IsName("if")) {
      Next();
      auto cond = MakeExpr(Expr::Kind::kCondition, pos);
      QLORA_ASSIGN_OR_RETURN(ExprPtr test, ParseOr());
      cond->items.push_back(std::move(test));
      cond->items.push_back(std::move(expr));
      if (IsName("else")) {
        Next();
        QLORA_ASSIGN_OR_RETURN(ExprPtr otherwise, ParseCondition());
        cond->items.push_back(std::move(otherwise));
      } else {
        cond->items.push_back(nullptr);
      }
      expr = std::move(cond);
    }
    return expr;
  }

  // left (op right)*, left-associative, as jinja2 parses its binary operators: `at_operator` says
  // whether the current token is one of the level's operators (a symbol, or a keyword such as
  // `and`), `operand` parses each side (the next level up).
  template <typename AtOperator, typename Operand>
  absl::StatusOr<ExprPtr> ParseLeftAssociative(AtOperator at_operator, Operand operand) {
    QLORA_ASSIGN_OR_RETURN(ExprPtr left, operand());
    while (at_operator()) {
      const Token& op = Next();
      QLORA_ASSIGN_OR_RETURN(ExprPtr right, operand());
      left = Binary(op.text, std::move(left), std::move(right), op.pos);
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseOr() {
    return ParseLeftAssociative([this] { return IsName("or"); }, [this] { return ParseAnd(); });
  }

  absl::StatusOr<ExprPtr> ParseAnd() {
    return ParseLeftAssociative([this] { return IsName("and"); }, [this] { return ParseNot(); });
  }

  absl::StatusOr<ExprPtr> ParseNot() {
    if (!IsName("not")) return ParseCompare();
    Nest nest(&depth_);
    const size_t pos = Next().pos;
    QLORA_RETURN_IF_ERROR(CheckDepth(pos));
    auto e = MakeExpr(Expr::Kind::kUnary, pos);
    e->name = "not";
    QLORA_ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
    e->items.push_back(std::move(operand));
    return e;
  }

  absl::StatusOr<ExprPtr> ParseCompare() {
    QLORA_ASSIGN_OR_RETURN(ExprPtr left, ParseMath1());
    bool compared = false;
    while (true) {
      std::string op;
      const size_t pos = Peek().pos;
      if (Peek().kind == K::kOp &&
          (Peek().text == "==" || Peek().text == "!=" || Peek().text == "<" || Peek().text == ">" ||
           Peek().text == "<=" || Peek().text == ">=")) {
        op = Next().text;
      } else if (IsName("in")) {
        Next();
        op = "in";
      } else if (IsName("not") && IsName("in", 1)) {
        Next();
        Next();
        op = "notin";
      } else {
        return left;
      }
      if (compared) return Unsupported(pos, "a chained comparison (a < b < c)");
      compared = true;
      QLORA_ASSIGN_OR_RETURN(ExprPtr right, ParseMath1());
      left = Binary(op, std::move(left), std::move(right), pos);
    }
  }

  absl::StatusOr<ExprPtr> ParseMath1() {
    return ParseLeftAssociative([this] { return IsOp("+") || IsOp("-"); },
                                [this] { return ParseConcat(); });
  }

  absl::StatusOr<ExprPtr> ParseConcat() {
    return ParseLeftAssociative([this] { return IsOp("~"); }, [this] { return ParseMath2(); });
  }

  absl::StatusOr<ExprPtr> ParseMath2() {
    return ParseLeftAssociative(
        [this] { return IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%"); },
        [this] { return ParsePow(); });
  }

  absl::StatusOr<ExprPtr> ParsePow() {
    return ParseLeftAssociative([this] { return IsOp("**"); },
                                [this] { return ParseUnary(true); });
  }

  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    Nest nest(&depth_);
    QLORA_RETURN_IF_ERROR(CheckDepth(Peek().pos));
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      const Token& op = Next();
      node = MakeExpr(Expr::Kind::kUnary, op.pos);
      node->name = op.text;
      QLORA_ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
      node->items.push_back(std::move(operand));
    } else {
      QLORA_ASSIGN_OR_RETURN(node, ParsePrimary());
    }
    QLORA_ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    if (!with_filter) return node;
    return ParseFilters(std::move(node));
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    const Token& token = Peek();
    switch (token.kind) {
      case K::kName: {
        Next();
        const std::string& n = token.text;
        auto e = MakeExpr(Expr::Kind::kLiteral, token.pos);
        if (n == "true" || n == "True") e->value = Value::Bool(true);
        else if (n == "false" || n == "False") e->value = Value::Bool(false);
        else if (n == "none" || n == "None") e->value = Value::None();
        else {
          e->kind = Expr::Kind::kName;
          e->name = n;
        }
        return e;
      }
      case K::kString: {
        std::string text;
        while (Peek().kind == K::kString) text += Next().text;  // adjacent literals concatenate
        auto e = MakeExpr(Expr::Kind::kLiteral, token.pos);
        e->value = Value::String(std::move(text));
        return e;
      }
      case K::kInt:
      case K::kFloat: {
        Next();
        auto e = MakeExpr(Expr::Kind::kLiteral, token.pos);
        e->value = token.kind == K::kInt ? Value::Int(token.int_value) : Value::Float(token.float_value);
        return e;
      }
      case K::kOp: {
        if (token.text == "(") {
          Next();
          if (IsOp(")")) {
            Next();
            return MakeExpr(Expr::Kind::kTuple, token.pos);
          }
          QLORA_ASSIGN_OR_RETURN(ExprPtr inner, ParseTuple(true));
          QLORA_RETURN_IF_ERROR(ExpectOp(")"));
          return inner;
        }
        if (token.text == "[" || token.text == "{") {
          const bool is_list = token.text == "[";
          Next();
          auto e = MakeExpr(is_list ? Expr::Kind::kList : Expr::Kind::kDict, token.pos);
          const char* close = is_list ? "]" : "}";
          while (!IsOp(close)) {
            if (!e->items.empty()) {
              QLORA_RETURN_IF_ERROR(ExpectOp(","));
              if (IsOp(close)) break;
            }
            QLORA_ASSIGN_OR_RETURN(ExprPtr item, ParseCondition());
            e->items.push_back(std::move(item));
            if (!is_list) {
              QLORA_RETURN_IF_ERROR(ExpectOp(":"));
              QLORA_ASSIGN_OR_RETURN(ExprPtr value, ParseCondition());
              e->items.push_back(std::move(value));
            }
          }
          Next();
          return e;
        }
        break;
      }
      default: break;
    }
    return Error(token.pos, "expected an expression");
  }

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node) {
    while (true) {
      if (IsOp(".")) {
        const size_t pos = Next().pos;
        if (Peek().kind == K::kInt) {  // x.0 is x[0]
          auto e = MakeExpr(Expr::Kind::kItem, pos);
          auto index = MakeExpr(Expr::Kind::kLiteral, Peek().pos);
          index->value = Value::Int(Next().int_value);
          e->items.push_back(std::move(node));
          e->items.push_back(std::move(index));
          node = std::move(e);
          continue;
        }
        auto e = MakeExpr(Expr::Kind::kAttr, pos);
        QLORA_ASSIGN_OR_RETURN(e->name, ExpectName());
        e->items.push_back(std::move(node));
        node = std::move(e);
      } else if (IsOp("[")) {
        QLORA_ASSIGN_OR_RETURN(node, ParseSubscript(std::move(node)));
      } else if (IsOp("(")) {
        auto e = MakeExpr(Expr::Kind::kCall, Peek().pos);
        e->items.push_back(std::move(node));
        QLORA_RETURN_IF_ERROR(ParseArgs(e.get()));
        node = std::move(e);
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseSubscript(ExprPtr node) {
    const size_t pos = Next().pos;  // '['
    ExprPtr parts[3];
    int colons = 0;
    while (!IsOp("]")) {
      if (IsOp(":")) {
        if (++colons > 2) return Error(Peek().pos, "too many ':' in a slice");
        Next();
        continue;
      }
      if (parts[colons]) return Error(Peek().pos, "expected ']' or ':'");
      QLORA_ASSIGN_OR_RETURN(parts[colons], ParseCondition());
    }
    Next();
    if (colons == 0) {
      if (!parts[0]) return Error(pos, "empty subscript");
      auto e = MakeExpr(Expr::Kind::kItem, pos);
      e->items.push_back(std::move(node));
      e->items.push_back(std::move(parts[0]));
      return e;
    }
    auto e = MakeExpr(Expr::Kind::kSlice, pos);
    e->items.push_back(std::move(node));
    for (ExprPtr& part : parts) e->items.push_back(std::move(part));
    return e;
  }

  // "(" [arg ("," arg)*] ")" where arg is expr or name=expr.
  absl::Status ParseArgs(Expr* call) {
    QLORA_RETURN_IF_ERROR(ExpectOp("("));
    bool first = true;
    while (!IsOp(")")) {
      if (!first) {
        QLORA_RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp(")")) break;
      }
      first = false;
      if (IsOp("*") || IsOp("**")) return Unsupported(Peek().pos, "*args / **kwargs");
      if (Peek().kind == K::kName && IsOp("=", 1)) {
        call->kwarg_names.push_back(Next().text);
        Next();
        QLORA_ASSIGN_OR_RETURN(ExprPtr value, ParseCondition());
        call->kwarg_values.push_back(std::move(value));
      } else {
        if (!call->kwarg_names.empty())
          return Error(Peek().pos, "positional argument after a keyword argument");
        QLORA_ASSIGN_OR_RETURN(ExprPtr value, ParseCondition());
        call->items.push_back(std::move(value));
      }
    }
    Next();
    return absl::OkStatus();
  }

  absl::StatusOr<ExprPtr> ParseFilters(ExprPtr node) {
    while (true) {
      if (IsOp("|")) {
        const size_t pos = Next().pos;
        auto e = MakeExpr(Expr::Kind::kFilter, pos);
        QLORA_ASSIGN_OR_RETURN(e->name, ExpectName());
        while (IsOp(".")) {
          Next();
          QLORA_ASSIGN_OR_RETURN(std::string part, ExpectName());
          e->name += "." + part;
        }
        e->items.push_back(std::move(node));
        if (IsOp("(")) QLORA_RETURN_IF_ERROR(ParseArgs(e.get()));
        node = std::move(e);
      } else if (IsName("is")) {
        const size_t pos = Next().pos;
        auto e = MakeExpr(Expr::Kind::kTest, pos);
        if (IsName("not")) {
          Next();
          e->negated = true;
        }
        QLORA_ASSIGN_OR_RETURN(e->name, ExpectName());
        e->items.push_back(std::move(node));
        const Token& next = Peek();
        if (IsOp("(")) {
          QLORA_RETURN_IF_ERROR(ParseArgs(e.get()));
        } else if ((next.kind == K::kName || next.kind == K::kString || next.kind == K::kInt ||
                    next.kind == K::kFloat || IsOp("[") || IsOp("{")) &&
                   !IsName("else") && !IsName("or") && !IsName("and")) {
          if (IsName("is")) return Error(next.pos, "tests cannot be chained with 'is'");
          QLORA_ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
          QLORA_ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
          e->items.push_back(std::move(arg));
        }
        node = std::move(e);
      } else if (IsOp("(")) {
        auto e = MakeExpr(Expr::Kind::kCall, Peek().pos);
        e->items.push_back(std::move(node));
        QLORA_RETURN_IF_ERROR(ParseArgs(e.get()));
        node = std::move(e);
      } else {
        return node;
      }
    }
  }

  const std::vector<Token>& tokens_;
  const std::string& src_;
  size_t index_ = 0;
  int depth_ = 0;
};

}  // namespace

absl::StatusOr<Body> Parse(const std::vector<Token>& tokens, const std::string& source) {
  return Parser(tokens, source).Run();
}

}  // namespace qlora::data::jinja
