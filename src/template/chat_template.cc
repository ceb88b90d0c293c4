// The chat-template evaluator: walks the syntax tree from template_parser.h with Jinja2's
// scoping (a for-loop iteration and a macro call open a scope; if/set do not) and the globals
// transformers provides (raise_exception, strftime_now, namespace, range, dict).
#include "template/chat_template.h"

#include <optional>
#include <unordered_map>

#include "template/template_builtins.h"
#include "template/template_parser.h"

namespace turbokv {

using jinja::Body;
using jinja::Expr;
using jinja::KwArgs;
using jinja::Stmt;
using jinja::Value;
using jinja::ValueList;

namespace {

struct Scope {
  std::unordered_map<std::string, Value> vars;
  Scope* parent = nullptr;
  // Expires with the scope: a macro or caller() that outlives the scope it was defined in
  // (stored in a namespace and called later) fails instead of reading a dead scope.
  std::shared_ptr<char> alive = std::make_shared<char>();

  const Value* lookup(const std::string& name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

enum class Flow { kNormal, kBreak, kContinue };

class Renderer {
 public:
  explicit Renderer(const std::tm& now) : now_(now) {}

  void run(const Body& body, Scope& scope, std::string& out) {
    if (exec(body, scope, out) != Flow::kNormal)
      throw TemplateError("break/continue outside a loop");
  }

  Value strftime_now(const std::string& format) const {
    char buf[512];
    const size_t n = std::strftime(buf, sizeof(buf), format.c_str(), &now_);
    return Value(std::string(buf, n));
  }

 private:
  Flow exec(const Body& body, Scope& scope, std::string& out) {
    for (const auto& stmt : body) {
      const Flow flow = exec(*stmt, scope, out);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  Flow exec(const Stmt& s, Scope& scope, std::string& out) {
    switch (s.kind) {
      case Stmt::Kind::kText:
        out += s.text;
        jinja::check_text_size(out.size());
        return Flow::kNormal;
      case Stmt::Kind::kOutput:
        out += eval(*s.expr, scope).to_string();
        jinja::check_text_size(out.size());
        return Flow::kNormal;
      case Stmt::Kind::kIf:
        for (size_t i = 0; i < s.conditions.size(); ++i) {
          if (eval(*s.conditions[i], scope).truthy()) return exec(s.bodies[i], scope, out);
        }
        if (s.bodies.size() > s.conditions.size()) return exec(s.bodies.back(), scope, out);
        return Flow::kNormal;
      case Stmt::Kind::kFor:
        exec_for(s, scope, out);
        return Flow::kNormal;
      case Stmt::Kind::kSet:
        assign(s, eval(*s.expr, scope), scope);
        return Flow::kNormal;
      case Stmt::Kind::kSetBlock: {
        std::string captured;
        run_nested(s.bodies[0], scope, captured);
        Value value(std::move(captured));
        if (s.expr) value = eval_filters(*s.expr, &value, scope);
        assign(s, value, scope);
        return Flow::kNormal;
      }
      case Stmt::Kind::kMacro:
        scope.vars[s.text] = make_macro(s, scope);
        return Flow::kNormal;
      case Stmt::Kind::kCallBlock: {
        const Expr& call = *s.expr;
        Value caller(
            [this, &s, &scope, defined = std::weak_ptr<char>(scope.alive)](const ValueList& args,
                                                                           const KwArgs& kwargs) {
              if (defined.expired()) fail_out_of_scope("caller");
              Scope local{{}, &scope};
              bind_params(s.params, args, kwargs, local, "caller");
              std::string body;
              run_nested(s.bodies[0], local, body);
              return Value(std::move(body));
            },
            "caller");
        Value callee = eval(*call.items[0], scope);
        ValueList args;
        for (size_t i = 1; i < call.items.size(); ++i) args.push_back(eval(*call.items[i], scope));
        KwArgs kwargs = eval_kwargs(call, scope);
        kwargs.emplace_back("caller", caller);
        out += invoke(callee, args, kwargs).to_string();
        jinja::check_text_size(out.size());
        return Flow::kNormal;
      }
      case Stmt::Kind::kFilterBlock: {
        std::string captured;
        run_nested(s.bodies[0], scope, captured);
        const Value body(std::move(captured));
        out += eval_filters(*s.expr, &body, scope).to_string();
        jinja::check_text_size(out.size());
        return Flow::kNormal;
      }
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
      case Stmt::Kind::kBody:
        return exec(s.bodies[0], scope, out);
    }
    return Flow::kNormal;
  }

  // Bodies that capture output (set blocks, filter blocks, caller) run in the same scope.
  void run_nested(const Body& body, Scope& scope, std::string& out) {
    if (exec(body, scope, out) != Flow::kNormal)
      throw TemplateError("break/continue outside a loop");
  }

  void assign(const Stmt& s, const Value& value, Scope& scope) {
    if (!s.attribute.empty()) {
      const Value* target = scope.lookup(s.targets[0]);
      if (target == nullptr || !target->is_dict() || !target->dict().is_namespace) {
        throw TemplateError(
            str_cat("cannot assign attribute on non-namespace object '", s.targets[0], "'"));
      }
      target->dict().set(s.attribute, value);
      return;
    }
    if (s.targets.size() == 1) {
      scope.vars[s.targets[0]] = value;
      return;
    }
    const ValueList items = jinja::iterate(value);
    if (items.size() != s.targets.size()) {
      throw TemplateError(
          str_cat("cannot unpack ", items.size(), " values into ", s.targets.size(), " names"));
    }
    for (size_t i = 0; i < items.size(); ++i) scope.vars[s.targets[i]] = items[i];
  }

  void bind_targets(const std::vector<std::string>& targets, const Value& item, Scope& scope) {
    if (targets.size() == 1) {
      scope.vars[targets[0]] = item;
      return;
    }
    const ValueList parts = jinja::iterate(item);
    if (parts.size() != targets.size()) {
      throw TemplateError(str_cat("cannot unpack ", parts.size(), " values into ", targets.size(),
                                  " loop variables"));
    }
    for (size_t i = 0; i < parts.size(); ++i) scope.vars[targets[i]] = parts[i];
  }

  void exec_for(const Stmt& s, Scope& scope, std::string& out) {
    const Value iterable = eval(*s.expr, scope);
    if (iterable.is_none()) throw TemplateError("'NoneType' object is not iterable");
    ValueList items = jinja::iterate(iterable);
    if (s.condition) {  // `for x in xs if cond`: the filter sees the loop variables
      ValueList kept;
      for (const Value& item : items) {
        Scope probe{{}, &scope};
        bind_targets(s.targets, item, probe);
        if (eval(*s.condition, probe).truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      if (s.bodies.size() > 1) run_nested(s.bodies[1], scope, out);
      return;
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      jinja::charge_work(1);
      Scope local{{}, &scope};
      bind_targets(s.targets, items[i], local);
      auto loop = std::make_shared<jinja::ValueDict>();
      loop->entries = {
          {"index", Value(i + 1)},
          {"index0", Value(i)},
          {"revindex", Value(n - i)},
          {"revindex0", Value(n - i - 1)},
          {"first", Value(i == 0)},
          {"last", Value(i == n - 1)},
          {"length", Value(n)},
          {"depth", Value(1)},
          {"depth0", Value(0)},
          {"previtem", i > 0 ? items[i - 1] : Value::undefined("there is no previous item")},
          {"nextitem", i + 1 < n ? items[i + 1] : Value::undefined("there is no next item")},
          {"cycle", Value(
                        [i](const ValueList& args, const KwArgs&) {
                          if (args.empty()) throw TemplateError("no items for cycling given");
                          return args[static_cast<size_t>(i) % args.size()];
                        },
                        "cycle")}};
      local.vars["loop"] = Value(loop);
      if (exec(s.bodies[0], local, out) == Flow::kBreak) break;
    }
  }

  void bind_params(const std::vector<jinja::MacroParam>& params, const ValueList& args,
                   const KwArgs& kwargs, Scope& local, const std::string& name) {
    if (args.size() > params.size()) {
      throw TemplateError(
          str_cat("macro '", name, "' takes not more than ", params.size(), " argument(s)"));
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const jinja::MacroParam& p = params[i];
      const Value* given = i < args.size() ? &args[i] : nullptr;
      for (const auto& [key, value] : kwargs) {
        if (key == p.name) given = &value;
      }
      if (given) {
        local.vars[p.name] = *given;
      } else if (p.default_value) {
        local.vars[p.name] = eval(*p.default_value, local);
      } else {
        local.vars[p.name] = Value::undefined(str_cat("'", p.name, "' is undefined"));
      }
    }
    for (const auto& [key, value] : kwargs) {
      const bool known =
          key == "caller" ||
          std::any_of(params.begin(), params.end(),
                      [&key = key](const auto& p) { return p.name == key; });
      if (!known) {
        throw TemplateError(
            str_cat("macro '", name, "' was invoked with an unknown keyword argument '", key, "'"));
      }
      if (key == "caller") local.vars["caller"] = value;
    }
  }

  Value make_macro(const Stmt& s, Scope& scope) {
    return Value(
        [this, &s, &scope, defined = std::weak_ptr<char>(scope.alive)](const ValueList& args,
                                                                       const KwArgs& kwargs) {
          if (defined.expired()) fail_out_of_scope(s.text);
          if (macro_depth_ >= kMaxMacroDepth) {
            throw TemplateError(
                str_cat("macro '", s.text, "' recursed deeper than ", kMaxMacroDepth, " calls"));
          }
          ++macro_depth_;
          jinja::charge_work(1);
          struct DepthRestore {
            int& depth;
            ~DepthRestore() { --depth; }
          } restore{macro_depth_};
          Scope local{{}, &scope};
          bind_params(s.params, args, kwargs, local, s.text);
          std::string body;
          run_nested(s.bodies[0], local, body);
          return Value(std::move(body));
        },
        s.text);
  }

  [[noreturn]] static void fail_out_of_scope(const std::string& name) {
    throw TemplateError(
        str_cat("macro '", name, "' was called after the block that defined it had ended"));
  }

  static Value invoke(const Value& callee, const ValueList& args, const KwArgs& kwargs) {
    if (callee.is_undefined()) jinja::fail_undefined(callee);
    if (!callee.is_function()) {
      throw TemplateError(str_cat("'", callee.type_name(), "' object is not callable"));
    }
    return callee.function()(args, kwargs);
  }

  KwArgs eval_kwargs(const Expr& e, Scope& scope) {
    KwArgs kwargs;
    for (const auto& [key, value] : e.kwargs) kwargs.emplace_back(key, eval(*value, scope));
    return kwargs;
  }

  ValueList eval_args(const Expr& e, Scope& scope) {
    ValueList args;
    for (size_t i = 1; i < e.items.size(); ++i) args.push_back(eval(*e.items[i], scope));
    return args;
  }

  // A filter expression. In filter blocks and block sets the chain's innermost input is null
  // and `input` (the captured body) takes its place.
  Value eval_filters(const Expr& e, const Value* input, Scope& scope) {
    Value inner;
    if (!e.items[0]) {
      inner = *input;
    } else if (input != nullptr && e.items[0]->kind == Expr::Kind::kFilter) {
      inner = eval_filters(*e.items[0], input, scope);
    } else {
      inner = eval(*e.items[0], scope);
    }
    return jinja::apply_filter(e.name, inner, eval_args(e, scope), eval_kwargs(e, scope));
  }

  // Every expression evaluated is charged to the render's budget.
  Value eval(const Expr& e, Scope& scope) {
    jinja::charge_work(1);  // the strings and lists it builds are charged when built
    return eval_unbounded(e, scope);
  }

  Value eval_unbounded(const Expr& e, Scope& scope) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.value;
      case Expr::Kind::kName: {
        if (const Value* v = scope.lookup(e.name)) return *v;
        return Value::undefined(str_cat("'", e.name, "' is undefined"));
      }
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        ValueList items;
        for (const auto& item : e.items) items.push_back(eval(*item, scope));
        return Value(std::move(items), e.kind == Expr::Kind::kTuple);
      }
      case Expr::Kind::kDict: {
        auto dict = std::make_shared<jinja::ValueDict>();
        for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
          const Value key = eval(*e.items[i], scope);
          if (!key.is_string()) throw TemplateError("dict keys must be strings in templates");
          dict->set(key.str(), eval(*e.items[i + 1], scope));
        }
        return Value(dict);
      }
      case Expr::Kind::kAttr:
        return jinja::get_attribute(eval(*e.items[0], scope), e.name);
      case Expr::Kind::kItem:
        return jinja::get_item(eval(*e.items[0], scope), eval(*e.items[1], scope));
      case Expr::Kind::kSlice: {
        auto part = [&](size_t i) { return e.items[i] ? eval(*e.items[i], scope) : Value::none(); };
        return jinja::slice(eval(*e.items[0], scope), part(1), part(2), part(3));
      }
      case Expr::Kind::kCall:
        return invoke(eval(*e.items[0], scope), eval_args(e, scope), eval_kwargs(e, scope));
      case Expr::Kind::kFilter:
        return eval_filters(e, nullptr, scope);
      case Expr::Kind::kTest: {
        const bool result =
            jinja::apply_test(e.name, eval(*e.items[0], scope), eval_args(e, scope));
        return Value(result != e.negated);
      }
      case Expr::Kind::kNot:
        return Value(!eval(*e.items[0], scope).truthy());
      case Expr::Kind::kNegate: {
        const Value v = eval(*e.items[0], scope);
        if (v.is_float()) return Value(-v.as_double());
        if (v.is_int() || v.is_bool()) return Value(jinja::negate_int(v.as_int()));
        if (v.is_undefined()) jinja::fail_undefined(v);
        throw TemplateError(str_cat("bad operand type for unary -: '", v.type_name(), "'"));
      }
      case Expr::Kind::kBinary: {
        if (e.name == "and" || e.name == "or") {
          Value left = eval(*e.items[0], scope);
          if (left.truthy() == (e.name == "or")) return left;
          return eval(*e.items[1], scope);
        }
        const Value left = eval(*e.items[0], scope);
        const Value right = eval(*e.items[1], scope);
        if (e.name == "~") {
          std::string text = left.to_string();
          jinja::check_text_size(text.size());
          text += right.to_string();
          return Value(std::move(text));
        }
        return jinja::arithmetic(e.name, left, right);
      }
      case Expr::Kind::kCompare: {
        Value left = eval(*e.items[0], scope);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.items[i + 1], scope);
          if (!compare(e.ops[i], left, right)) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case Expr::Kind::kCondition: {
        if (eval(*e.items[1], scope).truthy()) return eval(*e.items[0], scope);
        if (e.items[2]) return eval(*e.items[2], scope);
        return Value::undefined(
            "the inline if-expression evaluated to false and no else section was defined.");
      }
    }
    return Value();
  }

  static bool compare(const std::string& op, const Value& left, const Value& right) {
    if (op == "==") return left.equals(right);
    if (op == "!=") return !left.equals(right);
    if (op == "in") return jinja::contains(right, left);
    if (op == "notin") return !jinja::contains(right, left);
    if (left.is_undefined()) jinja::fail_undefined(left);
    if (right.is_undefined()) jinja::fail_undefined(right);
    if (op == "<") return left.less(right);
    if (op == ">") return right.less(left);
    if (op == "<=") return !right.less(left);
    return !left.less(right);  // >=
  }

  static constexpr int kMaxMacroDepth = 100;
  std::tm now_;
  int macro_depth_ = 0;
};

std::tm local_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  return tm;
}

}  // namespace

struct ChatTemplate::Impl {
  Body body;
  std::optional<std::tm> pinned_now;
};

ChatTemplate::ChatTemplate(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

ChatTemplate ChatTemplate::parse(const std::string& source) {
  auto impl = std::make_unique<Impl>();
  impl->body = jinja::parse_template(source);
  return ChatTemplate(std::move(impl));
}

void ChatTemplate::set_now(const std::tm& now) {
  impl_->pinned_now = now;
}

namespace {

template <typename Json>
std::string render_with(const Body& body, const std::optional<std::tm>& pinned, const Json& vars) {
  if (!vars.is_object() && !vars.is_null()) {
    throw InvalidArgument(
        str_cat("template variables must be a JSON object, got ", vars.type_name()));
  }
  const jinja::RenderBudget budget;
  Renderer renderer(pinned ? *pinned : local_now());
  Scope globals;
  globals.vars["raise_exception"] = Value(
      [](const ValueList& args, const KwArgs&) -> Value {
        throw TemplateError(args.empty() ? std::string("raise_exception called")
                                         : args[0].to_string());
      },
      "raise_exception");
  globals.vars["strftime_now"] = Value(
      [&renderer](const ValueList& args, const KwArgs&) {
        if (args.empty() || !args[0].is_string())
          throw TemplateError("strftime_now(format) needs a format string");
        return renderer.strftime_now(args[0].str());
      },
      "strftime_now");
  // Every namespace of this render, emptied when it ends (see ValueDict).
  std::vector<std::shared_ptr<jinja::ValueDict>> namespaces;
  struct EmptyNamespaces {
    std::vector<std::shared_ptr<jinja::ValueDict>>& all;
    ~EmptyNamespaces() {
      for (auto& ns : all) ns->entries.clear();
    }
  } empty_namespaces{namespaces};
  auto dict_from_kwargs = [&namespaces](bool is_namespace) {
    return [is_namespace, &namespaces](const ValueList& args, const KwArgs& kwargs) {
      auto dict = std::make_shared<jinja::ValueDict>();
      dict->is_namespace = is_namespace;
      if (is_namespace) namespaces.push_back(dict);
      for (const Value& arg : args) {
        if (!arg.is_dict())
          throw TemplateError("namespace()/dict() positional argument must be a mapping");
        for (const auto& [k, v] : arg.dict().entries) dict->set(k, v);
      }
      for (const auto& [k, v] : kwargs) dict->set(k, v);
      return Value(dict);
    };
  };
  globals.vars["namespace"] = Value(dict_from_kwargs(true), "namespace");
  globals.vars["dict"] = Value(dict_from_kwargs(false), "dict");
  globals.vars["range"] = Value(
      [](const ValueList& args, const KwArgs&) {
        if (args.empty() || args.size() > 3) throw TemplateError("range expected 1 to 3 arguments");
        for (const Value& a : args) {
          if (!a.is_int())
            throw TemplateError(
                str_cat("'", a.type_name(), "' object cannot be interpreted as an integer"));
        }
        const int64_t start = args.size() > 1 ? args[0].as_int() : 0;
        const int64_t stop = args.size() > 1 ? args[1].as_int() : args[0].as_int();
        const int64_t step = args.size() > 2 ? args[2].as_int() : 1;
        if (step == 0) throw TemplateError("range() arg 3 must not be zero");
        ValueList out;
        for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
          if (out.size() >= jinja::kMaxListItems) {
            throw TemplateError("range() is too long for a template");
          }
          out.emplace_back(i);
          if (__builtin_add_overflow(i, step, &i)) break;  // past INT64 limits: past stop too
        }
        return Value(std::move(out));
      },
      "range");
  Scope context{{}, &globals};
  if (vars.is_object()) {
    for (const auto& [key, value] : vars.items()) context.vars[key] = Value::from_json(value);
  }
  std::string out;
  try {
    renderer.run(body, context, out);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {  // e.g. a number too long for std::stoll
    throw TemplateError(str_cat("template error: ", e.what()));
  }
  return out;
}

}  // namespace

std::string ChatTemplate::render(const nlohmann::json& vars) const {
  return render_with(impl_->body, impl_->pinned_now, vars);
}

std::string ChatTemplate::render_ordered(const nlohmann::ordered_json& vars) const {
  return render_with(impl_->body, impl_->pinned_now, vars);
}

}  // namespace turbokv
