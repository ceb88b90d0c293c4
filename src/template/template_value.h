// Values of the chat-template engine with Python semantics: None/True/False rendering, int vs
// float printing (repr), str() of lists and dicts (Python repr, insertion order kept),
// truthiness, equality and ordering, and json.dumps for the tojson filter.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace turbokv::jinja {

// Bounds of one render, so that no template (they come from model files) can exhaust memory,
// the stack or the CPU. Exceeding one is a TemplateError naming it.
inline constexpr size_t kMaxTextBytes = size_t(16) << 20;  // the output and any one string
inline constexpr size_t kMaxListItems = size_t(1) << 20;   // any one list or dict
inline constexpr int kMaxValueDepth = 512;                 // lists/dicts inside lists/dicts
// Work units of a render: one per expression evaluated, loop iteration, macro call and item
// visited, four per list item and one per 16 bytes of every string built (a second of CPU and a
// few hundred MB at most).
inline constexpr int64_t kMaxRenderWork = 10'000'000;

// Throws TemplateError when a string of `bytes` (or a list of `items`) would pass the bounds.
void check_text_size(size_t bytes);
void check_list_size(size_t items);
// Counts work against the current render's budget (no-op outside a render); throws
// TemplateError once kMaxRenderWork is used up.
void charge_work(int64_t units);

// The work budget of the renders on this thread while it lives (renders may nest: a
// caller's budget is restored afterwards).
class RenderBudget {
 public:
  RenderBudget();
  ~RenderBudget();
  RenderBudget(const RenderBudget&) = delete;
  RenderBudget& operator=(const RenderBudget&) = delete;

 private:
  int64_t saved_;
  bool saved_active_;
};

class Value;
using ValueList = std::vector<Value>;
using KwArgs = std::vector<std::pair<std::string, Value>>;
using Function = std::function<Value(const ValueList& args, const KwArgs& kwargs)>;

// An insertion-ordered string-keyed dict (Python dict order).
// Only namespaces change after they are built (set() from `set ns.x = ...`); the renderer
// keeps every namespace it creates and empties them when the render ends, which ends any
// cycle and keeps destruction shallow.
struct ValueDict {
  std::vector<std::pair<std::string, Value>> entries;
  bool is_namespace = false;  // namespace(): attributes can be assigned with `set ns.x = ...`
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value value);
};

class Value {
 public:
  enum class Type { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };

  Value() = default;  // undefined
  static Value undefined(std::string message) {
    Value v;
    v.text_ = std::make_shared<const std::string>(std::move(message));
    return v;
  }
  static Value none() { return Value(Type::kNone); }
  Value(bool b) : type_(Type::kBool), int_(b) {}
  Value(int64_t i) : type_(Type::kInt), int_(i) {}
  Value(int i) : type_(Type::kInt), int_(i) {}
  Value(double f) : type_(Type::kFloat), float_(f) {}
  Value(std::string s);  // charged to the render's budget (by length), as lists are
  Value(const char* s) : Value(std::string(s)) {}
  // Throw TemplateError past kMaxListItems items or kMaxValueDepth levels.
  Value(ValueList list, bool is_tuple = false);
  Value(std::shared_ptr<ValueDict> dict);
  Value(Function fn, std::string name)
      : type_(Type::kFunction),
        text_(std::make_shared<const std::string>(std::move(name))),
        fn_(std::make_shared<Function>(std::move(fn))) {}

  template <typename Json>
  static Value from_json(const Json& j);

  Type type() const { return type_; }
  bool is_undefined() const { return type_ == Type::kUndefined; }
  bool is_none() const { return type_ == Type::kNone; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_int() const { return type_ == Type::kInt; }
  bool is_float() const { return type_ == Type::kFloat; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return type_ == Type::kString; }
  bool is_list() const { return type_ == Type::kList; }
  bool is_tuple() const { return is_list() && tuple_; }
  bool is_dict() const { return type_ == Type::kDict; }
  bool is_function() const { return type_ == Type::kFunction; }

  bool as_bool() const { return int_ != 0; }
  int64_t as_int() const { return int_; }  // int or bool
  double as_double() const { return is_float() ? float_ : static_cast<double>(int_); }
  // A string's text, an undefined's message.
  const std::string& str() const { return text_ ? *text_ : empty_text(); }
  const ValueList& list() const { return *list_; }
  ValueDict& dict() const { return *dict_; }
  const Function& function() const { return *fn_; }
  // Levels of lists/dicts in this value (0 for a scalar, 1 for a namespace: its entries are
  // held by the renderer too).
  int depth() const { return depth_; }

  bool truthy() const;
  // Python type name for messages: str, int, float, bool, NoneType, list, tuple, dict, ...
  std::string type_name() const;
  // str(value) as Jinja prints it ({{ value }}): undefined -> "".
  std::string to_string() const;
  // repr(value): strings quoted, used inside list/dict printing.
  std::string repr() const;
  // json.dumps(value, ensure_ascii=False, indent=indent, separators=..., sort_keys=...).
  std::string to_json(std::optional<int> indent, const std::string& item_separator,
                      const std::string& key_separator, bool sort_keys) const;

  bool equals(const Value& other) const;  // Python ==
  // Python <; throws TemplateError for unorderable types.
  bool less(const Value& other) const;

 private:
  explicit Value(Type type) : type_(type) {}
  void write_json(std::string& out, std::optional<int> indent, int depth,
                  const std::string& item_separator, const std::string& key_separator,
                  bool sort_keys) const;

  Type type_ = Type::kUndefined;
  int64_t int_ = 0;
  double float_ = 0;
  static const std::string& empty_text();

  // Shared, never modified: copying a Value (into a list, a scope) never copies its text.
  std::shared_ptr<const std::string> text_;
  std::shared_ptr<ValueList> list_;
  std::shared_ptr<ValueDict> dict_;
  std::shared_ptr<Function> fn_;
  bool tuple_ = false;
  int depth_ = 0;
};

std::string python_float_repr(double v);
std::string python_string_repr(const std::string& s);

}  // namespace turbokv::jinja
