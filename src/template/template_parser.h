// Lexer and parser of the Jinja2 subset used by HF chat templates, configured as transformers
// configures Jinja2: trim_blocks, lstrip_blocks, no trailing newline kept, {%- -%} control.
// Produces the syntax tree that chat_template.cc evaluates. Syntax errors are FormatErrors
// that name line:column.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "template/template_value.h"

namespace turbokv::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Location {
  int line = 1, column = 1;
};

struct Expr {
  enum class Kind {
    kLiteral,   // value
    kName,      // name
    kList,      // items
    kTuple,     // items
    kDict,      // items: key, value, key, value, ...
    kAttr,      // items[0].name
    kItem,      // items[0][items[1]]
    kSlice,     // items[0][items[1]:items[2]:items[3]] (null parts allowed)
    kCall,      // items[0](items[1..], kwargs)
    kFilter,    // items[0] | name(items[1..], kwargs); items[0] null in a filter block
    kTest,      // items[0] is [not] name(items[1..])
    kNot,       // not items[0]
    kNegate,    // -items[0]
    kBinary,    // items[0] op items[1]: + - * / // % ** ~ and or
    kCompare,   // items[0] ops[0] items[1] ops[1] items[2] ...
    kCondition  // items[0] if items[1] else items[2] (else part may be null)
  };
  Kind kind;
  Location where;
  Value value;
  std::string name;              // name, attribute, filter/test name or binary operator
  std::vector<std::string> ops;  // comparison operators: == != < <= > >= in notin
  bool negated = false;          // `is not`
  std::vector<ExprPtr> items;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // may be null
};

struct Stmt {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // conditions[i] -> bodies[i]; bodies.back() is the else when longer
    kFor,          // for targets in expr [if condition]: bodies[0] [else bodies[1]]
    kSet,          // set targets = expr | set target.attr = expr
    kSetBlock,     // set target %}bodies[0]{% endset (expr: optional filter chain)
    kMacro,        // macro name(params) bodies[0]
    kCallBlock,    // call(params) expr: bodies[0] becomes caller()
    kFilterBlock,  // filter expr: bodies[0]
    kBreak,
    kContinue,
    kBody  // bodies[0] as is (e.g. {% generation %})
  };
  Kind kind;
  Location where;
  std::string text;
  std::vector<std::string> targets;
  std::string attribute;  // set ns.attribute = ...
  ExprPtr expr, condition;
  std::vector<ExprPtr> conditions;
  std::vector<Body> bodies;
  std::vector<MacroParam> params;
};

// Parses a whole template. Throws FormatError("template syntax error at line:column: ...").
Body parse_template(const std::string& source);

}  // namespace turbokv::jinja
