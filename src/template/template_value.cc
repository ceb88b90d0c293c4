// Python semantics of template values (see template_value.h).
#include "template/template_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "template/chat_template.h"

namespace turbokv::jinja {

namespace {

thread_local int64_t t_work_left = 0;
thread_local bool t_budget_active = false;
thread_local int t_recursion = 0;  // nesting of the recursive walks below

// Bounds the recursion of printing, JSON and comparison: cycles through namespaces and deep
// nesting end in a TemplateError, not a stack overflow.
class RecursionGuard {
 public:
  RecursionGuard() {
    if (++t_recursion > kMaxValueDepth) {
      --t_recursion;
      throw TemplateError(
          str_cat("a value nests deeper than ", kMaxValueDepth, " levels (or contains itself)"));
    }
  }
  ~RecursionGuard() { --t_recursion; }
  RecursionGuard(const RecursionGuard&) = delete;
  RecursionGuard& operator=(const RecursionGuard&) = delete;
};

}  // namespace

void check_text_size(size_t bytes) {
  if (bytes > kMaxTextBytes) {
    throw TemplateError(str_cat("the template built a string of ", bytes,
                                " bytes, more than the limit of ", kMaxTextBytes));
  }
}

void check_list_size(size_t items) {
  if (items > kMaxListItems) {
    throw TemplateError(str_cat("the template built a list of ", items,
                                " items, more than the limit of ", kMaxListItems));
  }
}

void charge_work(int64_t units) {
  if (!t_budget_active) return;
  t_work_left -= units;
  if (t_work_left < 0) {
    t_work_left = 0;
    throw TemplateError(str_cat("the template ran longer than its budget of ", kMaxRenderWork,
                                " steps (loop iterations, expressions, bytes built)"));
  }
}

RenderBudget::RenderBudget() : saved_(t_work_left), saved_active_(t_budget_active) {
  t_work_left = kMaxRenderWork;
  t_budget_active = true;
}

RenderBudget::~RenderBudget() {
  t_work_left = saved_;
  t_budget_active = saved_active_;
}

Value::Value(std::string s) : type_(Type::kString) {
  check_text_size(s.size());
  charge_work(1 + static_cast<int64_t>(s.size() / 16));
  text_ = std::make_shared<const std::string>(std::move(s));
}

const std::string& Value::empty_text() {
  static const std::string empty;
  return empty;
}

Value::Value(ValueList list, bool is_tuple) : type_(Type::kList), tuple_(is_tuple) {
  check_list_size(list.size());
  charge_work(1 + 4 * static_cast<int64_t>(list.size()));
  for (const Value& item : list) depth_ = std::max(depth_, item.depth_);
  if (++depth_ > kMaxValueDepth) {
    throw TemplateError(str_cat("lists and dicts nest deeper than ", kMaxValueDepth, " levels"));
  }
  list_ = std::make_shared<ValueList>(std::move(list));
}

Value::Value(std::shared_ptr<ValueDict> dict) : type_(Type::kDict), dict_(std::move(dict)) {
  check_list_size(dict_->entries.size());
  if (!dict_->is_namespace) {
    for (const auto& entry : dict_->entries) depth_ = std::max(depth_, entry.second.depth_);
  }
  if (++depth_ > kMaxValueDepth) {
    throw TemplateError(str_cat("lists and dicts nest deeper than ", kMaxValueDepth, " levels"));
  }
}

const Value* ValueDict::find(std::string_view key) const {
  for (const auto& [k, v] : entries) {
    if (k == key) return &v;
  }
  return nullptr;
}

void ValueDict::set(const std::string& key, Value value) {
  for (auto& [k, v] : entries) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  check_list_size(entries.size() + 1);
  entries.emplace_back(key, std::move(value));
}

template <typename Json>
Value Value::from_json(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null:
      return none();
    case Json::value_t::boolean:
      return Value(j.template get<bool>());
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return Value(j.template get<int64_t>());
    case Json::value_t::number_float:
      return Value(j.template get<double>());
    case Json::value_t::string:
      return Value(j.template get<std::string>());
    case Json::value_t::array: {
      ValueList list;
      for (const auto& item : j) list.push_back(from_json(item));
      return Value(std::move(list));
    }
    case Json::value_t::object: {
      auto dict = std::make_shared<ValueDict>();
      for (const auto& [key, item] : j.items()) dict->entries.emplace_back(key, from_json(item));
      return Value(std::move(dict));
    }
    default:
      return none();
  }
}
template Value Value::from_json<nlohmann::json>(const nlohmann::json&);
template Value Value::from_json<nlohmann::ordered_json>(const nlohmann::ordered_json&);

bool Value::truthy() const {
  switch (type_) {
    case Type::kUndefined:
    case Type::kNone:
      return false;
    case Type::kBool:
    case Type::kInt:
      return int_ != 0;
    case Type::kFloat:
      return float_ != 0.0;
    case Type::kString:
      return !str().empty();
    case Type::kList:
      return !list_->empty();
    case Type::kDict:
      return dict_->is_namespace || !dict_->entries.empty();
    case Type::kFunction:
      return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (type_) {
    case Type::kUndefined:
      return "Undefined";
    case Type::kNone:
      return "NoneType";
    case Type::kBool:
      return "bool";
    case Type::kInt:
      return "int";
    case Type::kFloat:
      return "float";
    case Type::kString:
      return "str";
    case Type::kList:
      return tuple_ ? "tuple" : "list";
    case Type::kDict:
      return dict_->is_namespace ? "Namespace" : "dict";
    case Type::kFunction:
      return "function";
  }
  return "object";
}

std::string python_float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string sci(buf, result.ptr);  // shortest round-trip digits: [-]d[.ddd]e[+-]xx
  const bool negative = sci[0] == '-';
  const size_t e = sci.find('e');
  std::string digits;
  for (size_t i = negative ? 1 : 0; i < e; ++i) {
    if (sci[i] != '.') digits += sci[i];
  }
  const int exponent = std::stoi(sci.substr(e + 1));
  const int decpt = exponent + 1;  // position of the decimal point after the first digit
  std::string out = negative ? "-" : "";
  if (decpt <= -4 || decpt > 16) {
    out += digits[0];
    if (digits.size() > 1) out.append(".").append(digits.substr(1));
    char exp_buf[16];
    std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+',
                  std::abs(exponent));
    return out + exp_buf;
  }
  if (decpt <= 0) {
    return out + "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
  }
  if (static_cast<size_t>(decpt) >= digits.size()) {
    return out + digits + std::string(decpt - digits.size(), '0') + ".0";
  }
  return out + digits.substr(0, decpt) + "." + digits.substr(decpt);
}

std::string python_string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == quote || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\r') {
      out += "\\r";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  out += quote;
  return out;
}

std::string Value::to_string() const {
  switch (type_) {
    case Type::kUndefined:
      return "";
    case Type::kNone:
      return "None";
    case Type::kBool:
      return int_ ? "True" : "False";
    case Type::kInt:
      return std::to_string(int_);
    case Type::kFloat:
      return python_float_repr(float_);
    case Type::kString:
      return str();
    case Type::kList: {
      const RecursionGuard guard;
      std::string out = tuple_ ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        out.append(i ? ", " : "").append((*list_)[i].repr());
        check_text_size(out.size());
      }
      if (tuple_ && list_->size() == 1) out += ",";
      return out + (tuple_ ? ")" : "]");
    }
    case Type::kDict: {
      const RecursionGuard guard;
      std::string out = dict_->is_namespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, v] : dict_->entries) {
        out.append(first ? "" : ", ").append(python_string_repr(k)).append(": ").append(v.repr());
        check_text_size(out.size());
        first = false;
      }
      return out + (dict_->is_namespace ? "}>" : "}");
    }
    case Type::kFunction:
      return "<function " + str() + ">";
  }
  return "";
}

std::string Value::repr() const {
  if (is_string()) return python_string_repr(str());
  if (is_undefined()) return "Undefined";
  return to_string();
}

namespace {

void write_json_string(std::string& out, const std::string& s) {
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

}  // namespace

std::string Value::to_json(std::optional<int> indent, const std::string& item_separator,
                           const std::string& key_separator, bool sort_keys) const {
  std::string out;
  write_json(out, indent, 0, item_separator, key_separator, sort_keys);
  return out;
}

void Value::write_json(std::string& out, std::optional<int> indent, int depth,
                       const std::string& item_separator, const std::string& key_separator,
                       bool sort_keys) const {
  const RecursionGuard guard;
  check_text_size(out.size());
  auto newline = [&](int level) {
    if (indent) out.append("\n").append(static_cast<size_t>(*indent * level), ' ');
  };
  switch (type_) {
    case Type::kNone:
      out += "null";
      return;
    case Type::kBool:
      out += int_ ? "true" : "false";
      return;
    case Type::kInt:
      out += std::to_string(int_);
      return;
    case Type::kFloat:
      if (std::isnan(float_)) {
        out += "NaN";
      } else if (std::isinf(float_)) {
        out += float_ > 0 ? "Infinity" : "-Infinity";
      } else {
        out += python_float_repr(float_);
      }
      return;
    case Type::kString:
      write_json_string(out, str());
      return;
    case Type::kList: {
      if (list_->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i) out += item_separator;
        newline(depth + 1);
        (*list_)[i].write_json(out, indent, depth + 1, item_separator, key_separator, sort_keys);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Type::kDict: {
      if (dict_->entries.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& entry : dict_->entries) items.push_back(&entry);
      if (sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      }
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += item_separator;
        newline(depth + 1);
        write_json_string(out, items[i]->first);
        out += key_separator;
        items[i]->second.write_json(out, indent, depth + 1, item_separator, key_separator,
                                    sort_keys);
      }
      newline(depth);
      out += '}';
      return;
    }
    case Type::kUndefined:
    case Type::kFunction:
      throw TemplateError(str_cat("Object of type ", type_name(), " is not JSON serializable"));
  }
}

bool Value::equals(const Value& other) const {
  const RecursionGuard guard;
  if (is_number() && other.is_number()) {
    if (is_float() || other.is_float()) return as_double() == other.as_double();
    return int_ == other.int_;
  }
  if (type_ != other.type_) return false;
  switch (type_) {
    case Type::kUndefined:
    case Type::kNone:
      return true;
    case Type::kString:
      return str() == other.str();
    case Type::kList: {
      if (list_->size() != other.list_->size()) return false;
      for (size_t i = 0; i < list_->size(); ++i) {
        if (!(*list_)[i].equals((*other.list_)[i])) return false;
      }
      return true;
    }
    case Type::kDict: {
      if (dict_ == other.dict_) return true;
      if (dict_->entries.size() != other.dict_->entries.size()) return false;
      for (const auto& [k, v] : dict_->entries) {
        const Value* o = other.dict_->find(k);
        if (o == nullptr || !v.equals(*o)) return false;
      }
      return true;
    }
    case Type::kFunction:
      return fn_ == other.fn_;
    default:
      return false;
  }
}

bool Value::less(const Value& other) const {
  const RecursionGuard guard;
  if (is_number() && other.is_number()) {
    if (is_float() || other.is_float()) return as_double() < other.as_double();
    return int_ < other.int_;
  }
  if (is_string() && other.is_string()) return str() < other.str();  // UTF-8 order = code points
  if (is_list() && other.is_list()) {
    const size_t n = std::min(list_->size(), other.list_->size());
    for (size_t i = 0; i < n; ++i) {
      if (!(*list_)[i].equals((*other.list_)[i])) return (*list_)[i].less((*other.list_)[i]);
    }
    return list_->size() < other.list_->size();
  }
  throw TemplateError(str_cat("'<' not supported between instances of '", type_name(), "' and '",
                              other.type_name(), "'"));
}

}  // namespace turbokv::jinja
