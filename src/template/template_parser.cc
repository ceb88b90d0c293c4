// Jinja2 lexer and recursive-descent parser (see template_parser.h). The expression grammar and
// its precedence follow jinja2/parser.py: condexpr > or > and > not > compare > + - > ~ >
// * / // % > ** > unary > postfix (. [] ()) > filters and `is` tests.
#include "template/template_parser.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "core/error.h"
#include "core/utf8.h"

namespace turbokv::jinja {
namespace {

struct Token {
  enum class Type {
    kText,
    kVarBegin,
    kVarEnd,
    kBlockBegin,
    kBlockEnd,
    kName,
    kString,
    kInt,
    kFloat,
    kOp,
    kEnd
  };
  Type type;
  std::string value;
  size_t offset;
};

class SyntaxErrorFactory {
 public:
  explicit SyntaxErrorFactory(const std::string& source) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\n') line_starts_.push_back(i + 1);
    }
  }
  Location locate(size_t offset) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t line = static_cast<size_t>(it - line_starts_.begin());
    return {static_cast<int>(line), static_cast<int>(offset - line_starts_[line - 1] + 1)};
  }
  FormatError error(size_t offset, const std::string& message) const {
    const Location at = locate(offset);
    return FormatError(
        str_cat("template syntax error at ", at.line, ":", at.column, ": ", message));
  }

 private:
  std::vector<size_t> line_starts_;
};

bool is_name_start(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_';
}
bool is_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}

// Python's unicode-escape decoding of a string literal body.
std::string unescape(std::string_view body) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 == body.size()) {
      out += body[i];
      continue;
    }
    const char c = body[++i];
    auto hex = [&](size_t digits) -> bool {
      char32_t cp = 0;
      for (size_t k = 1; k <= digits; ++k) {
        if (i + k >= body.size() || !std::isxdigit(static_cast<unsigned char>(body[i + k])))
          return false;
        cp = cp * 16 + static_cast<char32_t>(std::stoi(std::string(1, body[i + k]), nullptr, 16));
      }
      utf8::append(out, cp);
      i += digits;
      return true;
    };
    switch (c) {
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'v':
        out += '\v';
        break;
      case '0':
        out += '\0';
        break;
      case '\n':
        break;  // line continuation
      case 'x':
        if (!hex(2)) out.append("\\x");
        break;
      case 'u':
        if (!hex(4)) out.append("\\u");
        break;
      case 'U':
        if (!hex(8)) out.append("\\U");
        break;
      default:
        out += '\\';
        out += c;
    }
  }
  return out;
}

class Lexer {
 public:
  Lexer(const std::string& source, const SyntaxErrorFactory& errors)
      : src_(source), errors_(errors) {}

  std::vector<Token> run() {
    size_t pos = 0;
    bool strip_next = false;  // the previous tag ended with '-'
    while (pos < src_.size()) {
      if (strip_next) {
        while (pos < src_.size() && std::isspace(static_cast<unsigned char>(src_[pos]))) ++pos;
        strip_next = false;
        continue;
      }
      const size_t tag = find_tag(pos);
      std::string text = src_.substr(pos, tag - pos);
      if (tag < src_.size()) {
        const char kind = src_[tag + 1];
        const char modifier = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
        if (modifier == '-') {
          const size_t keep = text.find_last_not_of(" \t\n\r\f\v");
          text.resize(keep == std::string::npos ? 0 : keep + 1);
        } else if (kind != '{' && modifier != '+') {
          lstrip_line(text, pos);
        }
      }
      if (!text.empty()) tokens_.push_back({Token::Type::kText, std::move(text), pos});
      if (tag >= src_.size()) break;
      pos = lex_tag(tag, strip_next);
      const size_t n = tokens_.size();
      if (n >= 3 && tokens_[n - 3].type == Token::Type::kBlockBegin &&
          tokens_[n - 2].type == Token::Type::kName && tokens_[n - 2].value == "raw" &&
          tokens_[n - 1].type == Token::Type::kBlockEnd) {
        tokens_.resize(n - 3);
        pos = lex_raw(tag, pos, strip_next);
      }
    }
    tokens_.push_back({Token::Type::kEnd, "", src_.size()});
    return std::move(tokens_);
  }

 private:
  size_t find_tag(size_t pos) const {
    while (true) {
      const size_t at = src_.find('{', pos);
      if (at == std::string::npos || at + 1 >= src_.size()) return src_.size();
      const char next = src_[at + 1];
      if (next == '{' || next == '%' || next == '#') return at;
      pos = at + 1;
    }
  }

  // lstrip_blocks: drop spaces and tabs between the line start and a block or comment tag.
  void lstrip_line(std::string& text, size_t text_begin) const {
    const size_t newline = text.rfind('\n');
    const size_t line_begin = newline == std::string::npos ? 0 : newline + 1;
    const bool at_line_start =
        newline != std::string::npos || text_begin == 0 || src_[text_begin - 1] == '\n';
    if (!at_line_start) return;
    if (text.find_first_not_of(" \t", line_begin) == std::string::npos) text.resize(line_begin);
  }

  // Lexes one tag starting at `tag`; returns the offset after it.
  size_t lex_tag(size_t tag, bool& strip_next) {
    const char kind = src_[tag + 1];
    size_t pos = tag + 2;
    if (pos < src_.size() && (src_[pos] == '-' || src_[pos] == '+')) ++pos;
    if (kind == '#') {
      const size_t end = src_.find("#}", pos);
      if (end == std::string::npos) throw errors_.error(tag, "unterminated comment");
      strip_next = end > pos && src_[end - 1] == '-';
      return trim_newline(end + 2, strip_next);
    }
    const bool block = kind == '%';
    tokens_.push_back({block ? Token::Type::kBlockBegin : Token::Type::kVarBegin, "", tag});
    const char closer = block ? '%' : '}';
    int depth = 0;
    while (true) {
      while (pos < src_.size() && std::isspace(static_cast<unsigned char>(src_[pos]))) ++pos;
      if (pos >= src_.size()) {
        throw errors_.error(tag, block ? "unterminated block tag: expected '%}'"
                                       : "unterminated expression: expected '}}'");
      }
      if (depth == 0) {
        // `-%}` strips the whitespace after the tag; `+%}` keeps the newline trim_blocks drops.
        const std::string end{closer, '}'};
        const bool dash = src_[pos] == '-' && src_.compare(pos + 1, 2, end) == 0;
        const bool plus = block && src_[pos] == '+' && src_.compare(pos + 1, 2, end) == 0;
        if (dash || plus || src_.compare(pos, 2, end) == 0) {
          tokens_.push_back({block ? Token::Type::kBlockEnd : Token::Type::kVarEnd, "", pos});
          strip_next = dash;
          const size_t after = pos + (dash || plus ? 3 : 2);
          return block && !plus ? trim_newline(after, strip_next) : after;
        }
      }
      pos = lex_expression_token(pos, depth);
    }
  }

  // The body of {% raw %} up to {% endraw %} is text, taken literally.
  size_t lex_raw(size_t raw_tag, size_t pos, bool& strip_next) {
    // Unlike other block tags, Jinja keeps the newline after {% raw %}.
    if (!strip_next && pos >= 3 && src_[pos - 1] == '\n' && src_.compare(pos - 3, 2, "%}") == 0) {
      --pos;
    }
    if (strip_next) {
      while (pos < src_.size() && std::isspace(static_cast<unsigned char>(src_[pos]))) ++pos;
    }
    for (size_t at = src_.find("{%", pos); at != std::string::npos; at = src_.find("{%", at + 2)) {
      const char modifier = at + 2 < src_.size() ? src_[at + 2] : '\0';
      size_t q = at + 2 + (modifier == '-' || modifier == '+');
      while (q < src_.size() && std::isspace(static_cast<unsigned char>(src_[q]))) ++q;
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < src_.size() && std::isspace(static_cast<unsigned char>(src_[q]))) ++q;
      const bool dash = q < src_.size() && src_[q] == '-';
      if (src_.compare(q + dash, 2, "%}") != 0) continue;
      std::string text = src_.substr(pos, at - pos);
      if (modifier == '-') {
        const size_t keep = text.find_last_not_of(" \t\n\r\f\v");
        text.resize(keep == std::string::npos ? 0 : keep + 1);
      } else if (modifier != '+') {
        lstrip_line(text, pos);
      }
      if (!text.empty()) tokens_.push_back({Token::Type::kText, std::move(text), pos});
      strip_next = dash;
      return trim_newline(q + dash + 2, strip_next);
    }
    throw errors_.error(raw_tag, "missing '{% endraw %}' for this '{% raw %}'");
  }

  // trim_blocks: a single newline right after a block or comment tag is removed.
  size_t trim_newline(size_t pos, bool strip_next) const {
    if (!strip_next && pos < src_.size() && src_[pos] == '\n') return pos + 1;
    return pos;
  }

  size_t lex_expression_token(size_t pos, int& depth) {
    const char c = src_[pos];
    if (is_name_start(c)) {
      size_t end = pos;
      while (end < src_.size() && is_name_char(src_[end])) ++end;
      tokens_.push_back({Token::Type::kName, src_.substr(pos, end - pos), pos});
      return end;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t end = pos;
      while (end < src_.size() &&
             (std::isdigit(static_cast<unsigned char>(src_[end])) || src_[end] == '_'))
        ++end;
      bool is_float = false;
      if (end + 1 < src_.size() && src_[end] == '.' &&
          std::isdigit(static_cast<unsigned char>(src_[end + 1]))) {
        is_float = true;
        ++end;
        while (end < src_.size() &&
               (std::isdigit(static_cast<unsigned char>(src_[end])) || src_[end] == '_'))
          ++end;
      }
      if (end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
        size_t exp = end + 1;
        if (exp < src_.size() && (src_[exp] == '+' || src_[exp] == '-')) ++exp;
        if (exp < src_.size() && std::isdigit(static_cast<unsigned char>(src_[exp]))) {
          is_float = true;
          end = exp;
          while (end < src_.size() && std::isdigit(static_cast<unsigned char>(src_[end]))) ++end;
        }
      }
      std::string digits = src_.substr(pos, end - pos);
      digits.erase(std::remove(digits.begin(), digits.end(), '_'), digits.end());
      tokens_.push_back({is_float ? Token::Type::kFloat : Token::Type::kInt, digits, pos});
      return end;
    }
    if (c == '\'' || c == '"') {
      size_t end = pos + 1;
      while (end < src_.size() && src_[end] != c) end += src_[end] == '\\' ? 2 : 1;
      if (end >= src_.size()) throw errors_.error(pos, "unterminated string literal");
      tokens_.push_back({Token::Type::kString,
                         unescape(std::string_view(src_).substr(pos + 1, end - pos - 1)), pos});
      return end + 1;
    }
    static const char* const kOperators[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*",
                                             "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                             "]",  "{",  "}",  ".",  ",",  ":",  "|"};
    for (const char* op : kOperators) {
      const size_t len = std::strlen(op);
      if (src_.compare(pos, len, op) == 0) {
        if (*op == '(' || *op == '[' || *op == '{') ++depth;
        if ((*op == ')' || *op == ']' || *op == '}') && depth > 0) --depth;
        tokens_.push_back({Token::Type::kOp, op, pos});
        return pos + len;
      }
    }
    throw errors_.error(pos, str_cat("unexpected character '", std::string(1, c), "'"));
  }

  const std::string& src_;
  const SyntaxErrorFactory& errors_;
  std::vector<Token> tokens_;
};

class Parser {
 public:
  Parser(std::vector<Token> tokens, const SyntaxErrorFactory& errors)
      : tokens_(std::move(tokens)), errors_(errors) {}

  Body parse_all() {
    std::string end_tag;
    return parse_body({}, end_tag);
  }

 private:
  using Type = Token::Type;

  const Token& peek(size_t ahead = 0) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  const Token& advance() { return tokens_[pos_ < tokens_.size() - 1 ? pos_++ : pos_]; }
  bool is_op(const char* op, size_t ahead = 0) const {
    return peek(ahead).type == Type::kOp && peek(ahead).value == op;
  }
  bool is_name(const char* name, size_t ahead = 0) const {
    return peek(ahead).type == Type::kName && peek(ahead).value == name;
  }
  [[noreturn]] void fail(const std::string& message) const {
    throw errors_.error(peek().offset, message);
  }
  // The next token, an integer literal. Python's ints are unbounded, ours are 64-bit: a larger
  // literal is a syntax error at it.
  int64_t int_literal() {
    const Token& t = peek();
    try {
      const int64_t v = std::stoll(t.value);
      advance();
      return v;
    } catch (const std::out_of_range&) {
      const std::string shown = t.value.size() > 32 ? t.value.substr(0, 32) + "..." : t.value;
      fail(str_cat("integer literal ", shown, " is out of the 64-bit range"));
    }
  }
  // The next token, a float literal, as Python reads it: too large is inf, too small 0.
  double float_literal() { return std::strtod(advance().value.c_str(), nullptr); }
  std::string describe(const Token& t) const {
    switch (t.type) {
      case Type::kEnd:
        return "end of template";
      case Type::kBlockEnd:
        return "'%}'";
      case Type::kVarEnd:
        return "'}}'";
      case Type::kText:
        return "template text";
      default:
        return "'" + t.value + "'";
    }
  }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(str_cat("expected '", op, "', got ", describe(peek())));
    advance();
  }
  std::string expect_name() {
    if (peek().type != Type::kName) fail(str_cat("expected a name, got ", describe(peek())));
    return advance().value;
  }
  void expect_block_end(const std::string& tag) {
    if (peek().type != Type::kBlockEnd) {
      fail(str_cat("expected '%}' to close '", tag, "', got ", describe(peek())));
    }
    advance();
  }
  Location where() const { return errors_.locate(peek().offset); }

  ExprPtr make(Expr::Kind kind, Location at) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->where = at;
    return e;
  }

  // Statements until a block whose tag is in `ends`; that tag's name is stored in end_tag
  // (its BlockBegin and name consumed). At top level (no ends) runs to the end.
  Body parse_body(const std::vector<std::string>& ends, std::string& end_tag) {
    const DepthGuard guard(*this);
    Body body;
    while (true) {
      const Token& t = peek();
      if (t.type == Type::kEnd) {
        if (!ends.empty()) {
          std::string expected;
          for (const auto& e : ends) expected += (expected.empty() ? "'" : " or '") + e + "'";
          fail(str_cat("unexpected end of template, expected ", expected));
        }
        return body;
      }
      if (t.type == Type::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kText;
        s->text = advance().value;
        body.push_back(std::move(s));
      } else if (t.type == Type::kVarBegin) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kOutput;
        s->where = errors_.locate(advance().offset);
        s->expr = parse_expression();
        if (peek().type != Type::kVarEnd) fail(str_cat("expected '}}', got ", describe(peek())));
        advance();
        body.push_back(std::move(s));
      } else if (t.type == Type::kBlockBegin) {
        advance();
        if (peek().type != Type::kName) fail("expected a tag name after '{%'");
        const std::string tag = peek().value;
        if (std::find(ends.begin(), ends.end(), tag) != ends.end()) {
          advance();
          end_tag = tag;
          return body;
        }
        body.push_back(parse_statement());
      } else {
        fail(str_cat("unexpected ", describe(t)));
      }
    }
  }

  Body parse_until(const char* end) {
    std::string found;
    Body body = parse_body({end}, found);
    expect_block_end(end);
    return body;
  }

  StmtPtr parse_statement() {
    const Location at = where();
    const size_t tag_offset = peek().offset;
    const std::string tag = advance().value;
    auto s = std::make_unique<Stmt>();
    s->where = at;
    if (tag == "if") {
      s->kind = Stmt::Kind::kIf;
      s->conditions.push_back(parse_expression());
      expect_block_end("if");
      while (true) {
        std::string found;
        s->bodies.push_back(parse_body({"elif", "else", "endif"}, found));
        if (found == "elif") {
          s->conditions.push_back(parse_expression());
          expect_block_end("elif");
        } else if (found == "else") {
          expect_block_end("else");
          s->bodies.push_back(parse_until("endif"));
          break;
        } else {
          expect_block_end("endif");
          break;
        }
      }
    } else if (tag == "for") {
      s->kind = Stmt::Kind::kFor;
      s->targets.push_back(expect_name());
      while (is_op(",")) {
        advance();
        s->targets.push_back(expect_name());
      }
      if (!is_name("in")) fail(str_cat("expected 'in' in for loop, got ", describe(peek())));
      advance();
      s->expr = parse_tuple(/*with_condexpr=*/false);
      if (is_name("if")) {
        advance();
        s->condition = parse_expression();
      }
      if (is_name("recursive")) fail("recursive for loops are not supported");
      expect_block_end("for");
      std::string found;
      s->bodies.push_back(parse_body({"else", "endfor"}, found));
      if (found == "else") {
        expect_block_end("else");
        s->bodies.push_back(parse_until("endfor"));
      } else {
        expect_block_end("endfor");
      }
    } else if (tag == "set") {
      s->targets.push_back(expect_name());
      if (is_op(".")) {
        advance();
        s->attribute = expect_name();
      }
      while (is_op(",")) {
        advance();
        s->targets.push_back(expect_name());
      }
      if (is_op("=")) {
        advance();
        s->kind = Stmt::Kind::kSet;
        s->expr = parse_tuple(/*with_condexpr=*/true);
        expect_block_end("set");
      } else {
        s->kind = Stmt::Kind::kSetBlock;
        if (is_op("|")) s->expr = parse_filter_chain(nullptr);
        expect_block_end("set");
        s->bodies.push_back(parse_until("endset"));
      }
    } else if (tag == "macro") {
      s->kind = Stmt::Kind::kMacro;
      s->text = expect_name();
      s->params = parse_params();
      expect_block_end("macro");
      s->bodies.push_back(parse_until("endmacro"));
    } else if (tag == "call") {
      s->kind = Stmt::Kind::kCallBlock;
      if (is_op("(")) s->params = parse_params();
      s->expr = parse_expression();
      if (s->expr->kind != Expr::Kind::kCall) fail("expected a macro call in 'call' block");
      expect_block_end("call");
      s->bodies.push_back(parse_until("endcall"));
    } else if (tag == "filter") {
      s->kind = Stmt::Kind::kFilterBlock;
      s->expr = parse_filter_chain(nullptr, /*leading_pipe=*/false);
      expect_block_end("filter");
      s->bodies.push_back(parse_until("endfilter"));
    } else if (tag == "break" || tag == "continue") {
      s->kind = tag == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      expect_block_end(tag);
    } else if (tag == "generation") {
      s->kind = Stmt::Kind::kBody;
      expect_block_end(tag);
      s->bodies.push_back(parse_until("endgeneration"));
    } else {
      throw errors_.error(tag_offset, str_cat("unknown tag '", tag, "'"));
    }
    return s;
  }

  std::vector<MacroParam> parse_params() {
    std::vector<MacroParam> params;
    expect_op("(");
    while (!is_op(")")) {
      if (!params.empty()) expect_op(",");
      if (is_op(")")) break;
      MacroParam param;
      param.name = expect_name();
      if (is_op("=")) {
        advance();
        param.default_value = parse_expression();
      }
      params.push_back(std::move(param));
    }
    advance();
    return params;
  }

  ExprPtr parse_expression() { return parse_condexpr(); }

  // `a, b` without brackets (set a = 1, 2 / for x in a, b) makes a tuple.
  ExprPtr parse_tuple(bool with_condexpr) {
    const Location at = where();
    ExprPtr first = with_condexpr ? parse_condexpr() : parse_or();
    if (!is_op(",")) return first;
    auto tuple = make(Expr::Kind::kTuple, at);
    tuple->items.push_back(std::move(first));
    while (is_op(",")) {
      advance();
      if (peek().type == Type::kBlockEnd) break;
      tuple->items.push_back(with_condexpr ? parse_condexpr() : parse_or());
    }
    return tuple;
  }

  ExprPtr parse_condexpr() {
    const DepthGuard guard(*this);
    const Location at = where();
    ExprPtr expr = parse_or();
    ChainDepth chain(*this);
    while (is_name("if")) {
      chain.link();
      advance();
      auto cond = make(Expr::Kind::kCondition, at);
      cond->items.push_back(std::move(expr));
      cond->items.push_back(parse_or());
      if (is_name("else")) {
        advance();
        cond->items.push_back(parse_condexpr());
      } else {
        cond->items.push_back(nullptr);
      }
      expr = std::move(cond);
    }
    return expr;
  }

  ExprPtr binary(const std::string& op, ExprPtr left, ExprPtr right, Location at) {
    auto e = make(Expr::Kind::kBinary, at);
    e->name = op;
    e->items.push_back(std::move(left));
    e->items.push_back(std::move(right));
    return e;
  }

  ExprPtr parse_or() {
    const Location at = where();
    ExprPtr left = parse_and();
    ChainDepth chain(*this);
    while (is_name("or")) {
      chain.link();
      advance();
      left = binary("or", std::move(left), parse_and(), at);
    }
    return left;
  }

  ExprPtr parse_and() {
    const Location at = where();
    ExprPtr left = parse_not();
    ChainDepth chain(*this);
    while (is_name("and")) {
      chain.link();
      advance();
      left = binary("and", std::move(left), parse_not(), at);
    }
    return left;
  }

  ExprPtr parse_not() {
    const DepthGuard guard(*this);
    if (is_name("not")) {
      const Location at = where();
      advance();
      auto e = make(Expr::Kind::kNot, at);
      e->items.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const Location at = where();
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (peek().type == Type::kOp &&
          (peek().value == "==" || peek().value == "!=" || peek().value == "<" ||
           peek().value == "<=" || peek().value == ">" || peek().value == ">=")) {
        op = advance().value;
      } else if (is_name("in")) {
        advance();
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        advance();
        advance();
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(Expr::Kind::kCompare, at);
        cmp->items.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->items.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  ExprPtr parse_math1() {
    const Location at = where();
    ExprPtr left = parse_concat();
    ChainDepth chain(*this);
    while (is_op("+") || is_op("-")) {
      chain.link();
      const std::string op = advance().value;
      left = binary(op, std::move(left), parse_concat(), at);
    }
    return left;
  }

  ExprPtr parse_concat() {
    const Location at = where();
    ExprPtr left = parse_math2();
    ChainDepth chain(*this);
    while (is_op("~")) {
      chain.link();
      advance();
      left = binary("~", std::move(left), parse_math2(), at);
    }
    return left;
  }

  ExprPtr parse_math2() {
    const Location at = where();
    ExprPtr left = parse_pow();
    ChainDepth chain(*this);
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      chain.link();
      const std::string op = advance().value;
      left = binary(op, std::move(left), parse_pow(), at);
    }
    return left;
  }

  ExprPtr parse_pow() {
    const Location at = where();
    ExprPtr left = parse_unary(true);
    ChainDepth chain(*this);
    while (is_op("**")) {
      chain.link();
      advance();
      left = binary("**", std::move(left), parse_unary(true), at);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    const DepthGuard guard(*this);
    const Location at = where();
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      const bool negate = advance().value == "-";
      ExprPtr operand = parse_unary(false);
      if (negate) {
        node = make(Expr::Kind::kNegate, at);
        node->items.push_back(std::move(operand));
      } else {
        node = std::move(operand);
      }
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Location at = where();
    const Token& t = peek();
    if (t.type == Type::kName) {
      const std::string name = advance().value;
      if (name == "true" || name == "True") return literal(Value(true), at);
      if (name == "false" || name == "False") return literal(Value(false), at);
      if (name == "none" || name == "None") return literal(Value::none(), at);
      auto e = make(Expr::Kind::kName, at);
      e->name = name;
      return e;
    }
    if (t.type == Type::kString) {
      std::string text;
      while (peek().type == Type::kString) text += advance().value;
      return literal(Value(std::move(text)), at);
    }
    if (t.type == Type::kInt) return literal(Value(int_literal()), at);
    if (t.type == Type::kFloat) return literal(Value(float_literal()), at);
    if (is_op("(")) {
      advance();
      if (is_op(")")) {
        advance();
        return make(Expr::Kind::kTuple, at);
      }
      ExprPtr inner = parse_expression();
      if (is_op(",")) {
        auto tuple = make(Expr::Kind::kTuple, at);
        tuple->items.push_back(std::move(inner));
        while (is_op(",")) {
          advance();
          if (is_op(")")) break;
          tuple->items.push_back(parse_expression());
        }
        inner = std::move(tuple);
      }
      expect_op(")");
      return inner;
    }
    if (is_op("[")) {
      advance();
      auto list = make(Expr::Kind::kList, at);
      while (!is_op("]")) {
        if (!list->items.empty()) expect_op(",");
        if (is_op("]")) break;
        list->items.push_back(parse_expression());
      }
      advance();
      return list;
    }
    if (is_op("{")) {
      advance();
      auto dict = make(Expr::Kind::kDict, at);
      while (!is_op("}")) {
        if (!dict->items.empty()) expect_op(",");
        if (is_op("}")) break;
        dict->items.push_back(parse_expression());
        expect_op(":");
        dict->items.push_back(parse_expression());
      }
      advance();
      return dict;
    }
    fail(str_cat("unexpected ", describe(t), " in expression"));
  }

  ExprPtr literal(Value v, Location at) {
    auto e = make(Expr::Kind::kLiteral, at);
    e->value = std::move(v);
    return e;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    ChainDepth chain(*this);
    while (true) {
      chain.link();
      const Location at = where();
      if (is_op(".")) {
        advance();
        auto e = make(Expr::Kind::kAttr, at);
        if (peek().type == Type::kInt) {  // x.0 is x[0]
          e->kind = Expr::Kind::kItem;
          e->items.push_back(std::move(node));
          e->items.push_back(literal(Value(int_literal()), at));
        } else {
          e->name = expect_name();
          e->items.push_back(std::move(node));
        }
        node = std::move(e);
      } else if (is_op("[")) {
        advance();
        node = parse_subscript(std::move(node), at);
      } else if (is_op("(")) {
        auto call = make(Expr::Kind::kCall, at);
        call->items.push_back(std::move(node));
        parse_call_args(*call);
        node = std::move(call);
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr target, Location at) {
    ExprPtr parts[3];
    bool is_slice = false;
    int part = 0;
    while (!is_op("]")) {
      if (is_op(":")) {
        is_slice = true;
        advance();
        if (++part > 2) fail("too many ':' in slice");
        continue;
      }
      if (parts[part]) fail(str_cat("expected ':' or ']', got ", describe(peek())));
      parts[part] = parse_expression();
    }
    advance();
    auto e = make(is_slice ? Expr::Kind::kSlice : Expr::Kind::kItem, at);
    e->items.push_back(std::move(target));
    if (!is_slice) {
      if (!parts[0]) fail("empty subscript");
      e->items.push_back(std::move(parts[0]));
    } else {
      for (auto& p : parts) e->items.push_back(std::move(p));
    }
    return e;
  }

  void parse_call_args(Expr& call) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (peek().type == Type::kName && is_op("=", 1)) {
        std::string name = advance().value;
        advance();
        call.kwargs.emplace_back(std::move(name), parse_expression());
      } else {
        if (!call.kwargs.empty()) fail("positional argument follows keyword argument");
        call.items.push_back(parse_expression());
      }
    }
    advance();
  }

  // `| name(args) | name ...`; input may be null (filter blocks, block set).
  ExprPtr parse_filter_chain(ExprPtr input, bool leading_pipe = true) {
    bool need_pipe = leading_pipe;
    ChainDepth chain(*this);
    do {
      chain.link();
      if (need_pipe) expect_op("|");
      need_pipe = true;
      const Location at = where();
      auto f = make(Expr::Kind::kFilter, at);
      f->name = expect_name();
      while (is_op(".")) {  // dotted filter names
        advance();
        f->name.append(".").append(expect_name());
      }
      f->items.push_back(std::move(input));
      if (is_op("(")) parse_call_args(*f);
      input = std::move(f);
    } while (is_op("|"));
    return input;
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    ChainDepth chain(*this);
    while (true) {
      chain.link();
      if (is_op("|")) {
        node = parse_filter_chain(std::move(node));
      } else if (is_name("is")) {
        const Location at = where();
        advance();
        auto test = make(Expr::Kind::kTest, at);
        if (is_name("not")) {
          advance();
          test->negated = true;
        }
        test->name = expect_name();
        test->items.push_back(std::move(node));
        const Token& t = peek();
        if (is_op("(")) {
          parse_call_args(*test);
        } else if ((t.type == Type::kName || t.type == Type::kString || t.type == Type::kInt ||
                    t.type == Type::kFloat || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and") && !is_name("if") &&
                   !is_name("in") && !is_name("is") && !is_name("not")) {
          test->items.push_back(parse_postfix(parse_primary()));
        }
        node = std::move(test);
      } else if (is_op("(")) {
        auto call = make(Expr::Kind::kCall, where());
        call->items.push_back(std::move(node));
        parse_call_args(*call);
        node = std::move(call);
      } else {
        return node;
      }
    }
  }

  // Bounds the parser's recursion so that hostile input cannot overflow the stack.
  class DepthGuard {
   public:
    explicit DepthGuard(Parser& parser) : parser_(parser) {
      if (++parser_.depth_ > kMaxDepth) {
        parser_.fail(str_cat("template nesting is deeper than ", kMaxDepth, " levels"));
      }
    }
    ~DepthGuard() { --parser_.depth_; }

   private:
    static constexpr int kMaxDepth = 200;
    Parser& parser_;
  };

  // Loops that build left-deep trees (a + b + c, x.a.b, x | f | g) add one level per link: the
  // tree, and the evaluator's recursion over it, stay within the same bound.
  class ChainDepth {
   public:
    explicit ChainDepth(Parser& parser) : parser_(parser) {}
    void link() { guards_.emplace_back(std::make_unique<DepthGuard>(parser_)); }

   private:
    Parser& parser_;
    std::vector<std::unique_ptr<DepthGuard>> guards_;
  };

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  const SyntaxErrorFactory& errors_;
};

}  // namespace

Body parse_template(const std::string& source) {
  // Jinja normalizes newlines and drops one trailing newline (keep_trailing_newline=False).
  std::string text;
  text.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      text += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      text += source[i];
    }
  }
  if (!text.empty() && text.back() == '\n') text.pop_back();
  const SyntaxErrorFactory errors(text);
  Lexer lexer(text, errors);
  Parser parser(lexer.run(), errors);
  return parser.parse_all();
}

}  // namespace turbokv::jinja
