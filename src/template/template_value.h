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

class Value;
using ValueList = std::vector<Value>;
using KwArgs = std::vector<std::pair<std::string, Value>>;
using Function = std::function<Value(const ValueList& args, const KwArgs& kwargs)>;

// An insertion-ordered string-keyed dict (Python dict order).
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
    v.text_ = std::move(message);
    return v;
  }
  static Value none() { return Value(Type::kNone); }
  Value(bool b) : type_(Type::kBool), int_(b) {}
  Value(int64_t i) : type_(Type::kInt), int_(i) {}
  Value(int i) : type_(Type::kInt), int_(i) {}
  Value(double f) : type_(Type::kFloat), float_(f) {}
  Value(std::string s) : type_(Type::kString), text_(std::move(s)) {}
  Value(const char* s) : type_(Type::kString), text_(s) {}
  Value(ValueList list, bool is_tuple = false)
      : type_(Type::kList), list_(std::make_shared<ValueList>(std::move(list))), tuple_(is_tuple) {}
  Value(std::shared_ptr<ValueDict> dict) : type_(Type::kDict), dict_(std::move(dict)) {}
  Value(Function fn, std::string name)
      : type_(Type::kFunction),
        text_(std::move(name)),
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
  const std::string& str() const { return text_; }  // a string's text, an undefined's message
  const ValueList& list() const { return *list_; }
  ValueDict& dict() const { return *dict_; }
  const Function& function() const { return *fn_; }

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
  std::string text_;
  std::shared_ptr<ValueList> list_;
  std::shared_ptr<ValueDict> dict_;
  std::shared_ptr<Function> fn_;
  bool tuple_ = false;
};

std::string python_float_repr(double v);
std::string python_string_repr(const std::string& s);

}  // namespace turbokv::jinja
