// Operations, filters, tests and methods of the template engine (see template_builtins.h).
#include "template/template_builtins.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_set>

#include "core/utf8.h"
#include "template/chat_template.h"

namespace turbokv::jinja {
namespace {

// Positional-or-keyword arguments of a filter, test or method, checked against its signature.
class Args {
 public:
  Args(const std::string& what, const ValueList& args, const KwArgs& kwargs,
       std::vector<std::string> names)
      : args_(args), kwargs_(kwargs), names_(std::move(names)) {
    if (args.size() > names_.size()) {
      throw TemplateError(
          str_cat(what, " takes at most ", names_.size(), " arguments (", args.size(), " given)"));
    }
    for (const auto& [key, value] : kwargs) {
      if (std::find(names_.begin(), names_.end(), key) == names_.end()) {
        throw TemplateError(str_cat(what, " got an unexpected keyword argument '", key, "'"));
      }
    }
  }
  bool has(size_t i) const { return find(i) != nullptr; }
  Value get(size_t i, Value fallback = Value()) const {
    const Value* v = find(i);
    return v ? *v : fallback;
  }

 private:
  const Value* find(size_t i) const {
    if (i < args_.size()) return &args_[i];
    for (const auto& [key, value] : kwargs_) {
      if (key == names_[i]) return &value;
    }
    return nullptr;
  }
  const ValueList& args_;
  const KwArgs& kwargs_;
  std::vector<std::string> names_;
};

const std::string& need_string(const Value& v, const std::string& what) {
  if (!v.is_string()) {
    throw TemplateError(str_cat(what, " must be str, not ", v.type_name()));
  }
  return v.str();
}

int64_t need_int(const Value& v, const std::string& what) {
  if (!v.is_int() && !v.is_bool()) {
    throw TemplateError(
        str_cat("'", v.type_name(), "' object cannot be interpreted as an integer (", what, ")"));
  }
  return v.as_int();
}

std::vector<char32_t> code_points(std::string_view s) {
  std::vector<char32_t> out;
  for (size_t pos = 0; pos < s.size();) out.push_back(utf8::next(s, pos));
  return out;
}

std::string from_code_points(const std::vector<char32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end; ++i) utf8::append(out, cps[i]);
  return out;
}

// str.strip/lstrip/rstrip: chars undefined/None means whitespace.
std::string strip(const std::string& s, const Value& chars, bool left, bool right) {
  const auto cps = code_points(s);
  std::vector<char32_t> set;
  const bool whitespace = chars.is_undefined() || chars.is_none();
  if (!whitespace) set = code_points(need_string(chars, "strip arg"));
  auto strippable = [&](char32_t c) {
    return whitespace ? utf8::is_space(c) : std::find(set.begin(), set.end(), c) != set.end();
  };
  size_t begin = 0, end = cps.size();
  if (left) {
    while (begin < end && strippable(cps[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strippable(cps[end - 1])) --end;
  }
  return from_code_points(cps, begin, end);
}

ValueList split(const std::string& s, const Value& separator, int64_t max_split) {
  ValueList parts;
  if (separator.is_undefined() || separator.is_none()) {  // runs of whitespace, no empties
    const auto cps = code_points(s);
    size_t i = 0;
    while (i < cps.size()) {
      while (i < cps.size() && utf8::is_space(cps[i])) ++i;
      if (i >= cps.size()) break;
      if (max_split >= 0 && static_cast<int64_t>(parts.size()) == max_split) {
        size_t end = cps.size();
        while (end > i && utf8::is_space(cps[end - 1])) --end;
        parts.emplace_back(from_code_points(cps, i, end));
        break;
      }
      const size_t start = i;
      while (i < cps.size() && !utf8::is_space(cps[i])) ++i;
      parts.emplace_back(from_code_points(cps, start, i));
      check_list_size(parts.size());
    }
    return parts;
  }
  const std::string& sep = need_string(separator, "split separator");
  if (sep.empty()) throw TemplateError("empty separator");
  size_t pos = 0;
  while (true) {
    const size_t at = s.find(sep, pos);
    if (at == std::string::npos ||
        (max_split >= 0 && static_cast<int64_t>(parts.size()) == max_split)) {
      parts.emplace_back(s.substr(pos));
      return parts;
    }
    parts.emplace_back(s.substr(pos, at - pos));
    check_list_size(parts.size());
    pos = at + sep.size();
  }
}

std::string replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` around every character
    const auto cps = code_points(s);
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      if (i < cps.size()) utf8::append(out, cps[i]);
      check_text_size(out.size());
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(from, pos);
    if (at == std::string::npos) break;
    out.append(s, pos, at - pos).append(to);
    check_text_size(out.size());
    pos = at + from.size();
    ++done;
  }
  return out.append(s.substr(pos));
}

// str.format with {}, {0}, {name} fields (format specs are not supported).
std::string format(const std::string& s, const ValueList& args, const KwArgs& kwargs) {
  std::string out;
  size_t next_auto = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '{' && i + 1 < s.size() && s[i + 1] == '{') {
      out += '{';
      ++i;
    } else if (s[i] == '}' && i + 1 < s.size() && s[i + 1] == '}') {
      out += '}';
      ++i;
    } else if (s[i] == '{') {
      const size_t close = s.find('}', i);
      if (close == std::string::npos)
        throw TemplateError("Single '{' encountered in format string");
      const std::string field = s.substr(i + 1, close - i - 1);
      if (field.find(':') != std::string::npos || field.find('!') != std::string::npos) {
        throw TemplateError(str_cat("format spec in '{", field, "}' is not supported"));
      }
      const Value* value = nullptr;
      if (field.empty() || std::all_of(field.begin(), field.end(), ::isdigit)) {
        const size_t index = field.empty() ? next_auto++ : std::stoul(field);
        if (index >= args.size())
          throw TemplateError(
              str_cat("Replacement index ", index, " out of range for positional args tuple"));
        value = &args[index];
      } else {
        for (const auto& [key, v] : kwargs) {
          if (key == field) value = &v;
        }
        if (value == nullptr) throw TemplateError(str_cat("'", field, "'"));
      }
      out += value->to_string();
      check_text_size(out.size());
      i = close;
    } else {
      out += s[i];
    }
  }
  return out;
}

bool starts_or_ends(const std::string& s, const Value& affix, bool start) {
  auto one = [&](const Value& v) {
    const std::string& a = need_string(v, start ? "startswith arg" : "endswith arg");
    return start ? s.starts_with(a) : s.ends_with(a);
  };
  if (affix.is_list()) {
    for (const Value& v : affix.list()) {
      if (one(v)) return true;
    }
    return false;
  }
  return one(affix);
}

int64_t code_point_index(const std::string& s, size_t byte) {
  return byte == std::string::npos
             ? -1
             : static_cast<int64_t>(utf8::count_code_points(std::string_view(s).substr(0, byte)));
}

const std::unordered_set<std::string>& string_methods() {
  static const std::unordered_set<std::string> names = {
      "strip",   "lstrip",     "rstrip",  "split",   "startswith", "endswith", "upper",     "lower",
      "title",   "capitalize", "replace", "format",  "join",       "find",     "rfind",     "count",
      "isdigit", "isalpha",    "isalnum", "isspace", "isupper",    "islower",  "splitlines"};
  return names;
}

const std::unordered_set<std::string>& dict_methods() {
  static const std::unordered_set<std::string> names = {"get", "items", "keys", "values"};
  return names;
}

bool all_code_points(const std::string& s, bool (*pred)(char32_t)) {
  if (s.empty()) return false;
  for (const char32_t c : code_points(s)) {
    if (!pred(c)) return false;
  }
  return true;
}

Value call_string_method(const std::string& s, const std::string& name, const ValueList& args,
                         const KwArgs& kwargs) {
  const std::string what = "str." + name + "()";
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    Args a(what, args, kwargs, {"chars"});
    return strip(s, a.get(0), name != "rstrip", name != "lstrip");
  }
  if (name == "split") {
    Args a(what, args, kwargs, {"sep", "maxsplit"});
    return Value(split(s, a.get(0), need_int(a.get(1, Value(-1)), "maxsplit")));
  }
  if (name == "startswith" || name == "endswith") {
    Args a(what, args, kwargs, {"prefix"});
    return Value(starts_or_ends(s, a.get(0), name == "startswith"));
  }
  if (name == "upper") return Value(utf8::to_upper(s));
  if (name == "lower") return Value(utf8::to_lower(s));
  if (name == "title") return Value(utf8::to_title(s));
  if (name == "capitalize") return Value(utf8::capitalize(s));
  if (name == "replace") {
    Args a(what, args, kwargs, {"old", "new", "count"});
    return Value(replace(s, need_string(a.get(0), "replace old"),
                         need_string(a.get(1), "replace new"),
                         need_int(a.get(2, Value(-1)), "count")));
  }
  if (name == "format") return Value(format(s, args, kwargs));
  if (name == "join") {
    Args a(what, args, kwargs, {"iterable"});
    std::string out;
    size_t index = 0;
    for (const Value& item : iterate(a.get(0))) {
      if (!item.is_string()) {
        throw TemplateError(str_cat("sequence item ", index, ": expected str instance, ",
                                    item.type_name(), " found"));
      }
      out.append(index++ ? s : "").append(item.str());
      check_text_size(out.size());
    }
    return Value(out);
  }
  if (name == "find" || name == "rfind" || name == "count") {
    Args a(what, args, kwargs, {"sub"});
    const std::string& sub = need_string(a.get(0), what);
    if (name == "find") return Value(code_point_index(s, s.find(sub)));
    if (name == "rfind") return Value(code_point_index(s, s.rfind(sub)));
    if (sub.empty()) return Value(static_cast<int64_t>(utf8::count_code_points(s) + 1));
    int64_t count = 0;
    for (size_t pos = s.find(sub); pos != std::string::npos; pos = s.find(sub, pos + sub.size()))
      ++count;
    return Value(count);
  }
  if (name == "isdigit")
    return Value(all_code_points(s, [](char32_t c) { return c >= '0' && c <= '9'; }));
  if (name == "isalpha")
    return Value(all_code_points(
        s, [](char32_t c) { return c >= 0x80 || std::isalpha(static_cast<int>(c)) != 0; }));
  if (name == "isalnum")
    return Value(all_code_points(
        s, [](char32_t c) { return c >= 0x80 || std::isalnum(static_cast<int>(c)) != 0; }));
  if (name == "isspace") return Value(all_code_points(s, utf8::is_space));
  if (name == "isupper") return Value(utf8::to_upper(s) == s && utf8::to_lower(s) != s);
  if (name == "islower") return Value(utf8::to_lower(s) == s && utf8::to_upper(s) != s);
  if (name == "splitlines") {
    ValueList lines;
    size_t pos = 0;
    while (pos < s.size()) {
      const size_t at = s.find_first_of("\r\n", pos);
      if (at == std::string::npos) {
        lines.emplace_back(s.substr(pos));
        break;
      }
      lines.emplace_back(s.substr(pos, at - pos));
      check_list_size(lines.size());
      pos = at + ((s[at] == '\r' && at + 1 < s.size() && s[at + 1] == '\n') ? 2 : 1);
    }
    return Value(std::move(lines));
  }
  throw TemplateError(str_cat("'str' object has no attribute '", name, "'"));
}

Value pair(const std::string& key, const Value& value) {
  return Value(ValueList{Value(key), value}, /*is_tuple=*/true);
}

Value call_dict_method(const Value& dict, const std::string& name, const ValueList& args,
                       const KwArgs& kwargs) {
  const std::string what = "dict." + name + "()";
  if (name == "get") {
    Args a(what, args, kwargs, {"key", "default"});
    const Value key = a.get(0);
    const Value* found = key.is_string() ? dict.dict().find(key.str()) : nullptr;
    return found ? *found : a.get(1, Value::none());
  }
  Args a(what, args, kwargs, {});
  ValueList out;
  for (const auto& [k, v] : dict.dict().entries) {
    if (name == "items") out.push_back(pair(k, v));
    if (name == "keys") out.emplace_back(k);
    if (name == "values") out.push_back(v);
  }
  return Value(std::move(out));
}

// Python's floor division and modulo.
Value floor_div_or_mod(const Value& a, const Value& b, bool mod) {
  const bool floats = a.is_float() || b.is_float();
  if (b.as_double() == 0.0) {
    throw TemplateError(!floats ? "integer division or modulo by zero"
                        : mod   ? "float modulo"
                                : "float floor division by zero");
  }
  if (a.is_float() || b.is_float()) {
    const double x = a.as_double(), y = b.as_double();
    const double q = std::floor(x / y);
    return mod ? Value(x - q * y) : Value(q);
  }
  const int64_t x = a.as_int(), y = b.as_int();
  if (x == INT64_MIN && y == -1) {
    if (mod) return Value(int64_t(0));
    throw TemplateError("integer overflow in '//'");
  }
  int64_t q = x / y;
  if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
  return mod ? Value(x - q * y) : Value(q);
}

Value repeat(const Value& seq, int64_t times) {
  const size_t unit = seq.is_string() ? seq.str().size() : seq.list().size();
  if (times > 0 && unit > 0) {
    const size_t limit = seq.is_string() ? kMaxTextBytes : kMaxListItems;
    if (static_cast<uint64_t>(times) > limit / unit) {
      throw TemplateError(str_cat("repeating a ", seq.type_name(), " of length ", unit, " ", times,
                                  " times: more than the limit of ", limit));
    }
    const int64_t size = static_cast<int64_t>(unit) * times;
    charge_work(seq.is_string() ? size / 64 : size);
  }
  if (seq.is_string()) {
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += seq.str();
    return Value(out);
  }
  ValueList out;
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), seq.list().begin(), seq.list().end());
  return Value(std::move(out));
}

Value attribute_path(const Value& item, const std::string& path) {
  Value current = item;
  size_t pos = 0;
  while (true) {
    const size_t dot = path.find('.', pos);
    const std::string part =
        path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    current = numeric && current.is_list()
                  ? get_item(current, Value(static_cast<int64_t>(std::stoll(part))))
                  : get_attribute(current, part);
    if (dot == std::string::npos) return current;
    pos = dot + 1;
  }
}

ValueList sequence_args(const ValueList& args, size_t from) {
  return ValueList(args.begin() + static_cast<ptrdiff_t>(std::min(from, args.size())), args.end());
}

Value select(const Value& input, const ValueList& args, bool attribute, bool keep) {
  ValueList out;
  const size_t first_test = attribute ? 1 : 0;
  if (attribute && args.empty()) throw TemplateError("selectattr/rejectattr need an attribute");
  const std::string test =
      args.size() > first_test ? need_string(args[first_test], "test name") : "";
  const ValueList test_args = sequence_args(args, first_test + 1);
  for (const Value& item : iterate(input)) {
    const Value subject =
        attribute ? attribute_path(item, need_string(args[0], "attribute")) : item;
    const bool passed = test.empty() ? subject.truthy() : apply_test(test, subject, test_args);
    if (passed == keep) out.push_back(item);
  }
  return Value(std::move(out));
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  check_text_size(out.size());
  return out;
}

std::string indent(const std::string& input, const Value& width, bool first, bool blank) {
  const int64_t spaces = width.is_string() ? 0 : need_int(width, "width");
  check_text_size(static_cast<size_t>(std::max<int64_t>(0, spaces)));
  const std::string indention =
      width.is_string() ? width.str()
                        : std::string(static_cast<size_t>(std::max<int64_t>(0, spaces)), ' ');
  std::vector<std::string> lines;
  const std::string s = input + "\n";
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t at = s.find('\n', pos);
    lines.push_back(s.substr(pos, at - pos));
    pos = at + 1;
  }
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      rv.append(i ? "\n" + indention : "").append(lines[i]);
      check_text_size(rv.size());
    }
  } else {
    rv = lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv.append("\n").append(lines[i].empty() ? "" : indention).append(lines[i]);
      check_text_size(rv.size());
    }
  }
  return first ? indention + rv : rv;
}

// int(x) of a float: truncated toward zero; NaN, infinities and values past int64 fail (Python
// has unbounded ints, templates do not).
Value float_to_int(double d) {
  if (!(d > -9223372036854775808.0 && d < 9223372036854775808.0)) {
    throw TemplateError(
        str_cat("cannot convert float ", python_float_repr(d), " to a 64-bit integer"));
  }
  return Value(static_cast<int64_t>(d));
}

Value to_int(const Value& v, const Value& fallback) {
  if (v.is_int() || v.is_bool()) return Value(v.as_int());
  if (v.is_float()) return float_to_int(v.as_double());
  if (v.is_string()) {
    const std::string s = strip(v.str(), Value(), true, true);
    try {
      size_t used = 0;
      const int64_t i = std::stoll(s, &used);
      if (used == s.size()) return Value(i);
      const double d = std::stod(s, &used);
      if (used == s.size()) return float_to_int(d);
    } catch (const std::exception&) {
    }
  }
  return fallback;
}

Value to_float(const Value& v, const Value& fallback) {
  if (v.is_number()) return Value(v.as_double());
  if (v.is_string()) {
    try {
      size_t used = 0;
      const std::string s = strip(v.str(), Value(), true, true);
      const double d = std::stod(s, &used);
      if (used == s.size()) return Value(d);
    } catch (const std::exception&) {
    }
  }
  return fallback;
}

// printf-style formatting as Python's str % args: %s %r %d %i %f %e %g %x %o %c %% with
// flags, width and precision; args is one value or a tuple of values.
std::string percent_format(const std::string& format, const Value& args) {
  const ValueList values = args.is_tuple() ? args.list() : ValueList{args};
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out += format[i];
      continue;
    }
    size_t j = i + 1;
    while (j < format.size() && std::strchr("-+ #0", format[j])) ++j;
    // Width and precision stay below 400 so that every conversion fits the buffer.
    auto digits = [&] {
      const size_t first = j;
      while (j < format.size() && std::isdigit(static_cast<unsigned char>(format[j]))) ++j;
      if (j - first > 3 || (j - first == 3 && format[first] >= '4')) {
        throw TemplateError(str_cat("format width or precision ", format.substr(first, j - first),
                                    " is too large (at most 399)"));
      }
    };
    digits();
    if (j < format.size() && format[j] == '.') {
      ++j;
      digits();
    }
    if (j >= format.size()) throw TemplateError("incomplete format");
    const char conversion = format[j];
    const std::string spec = format.substr(i, j - i);  // "%" plus flags, width, precision
    i = j;
    if (conversion == '%') {
      out += '%';
      continue;
    }
    if (next >= values.size()) throw TemplateError("not enough arguments for format string");
    const Value& v = values[next++];
    char buf[1024];
    switch (conversion) {
      case 's':
      case 'r': {
        const std::string text = conversion == 's' ? v.to_string() : v.repr();
        std::snprintf(buf, sizeof(buf), (spec + "s").c_str(), text.c_str());
        out += text.size() < 256 ? std::string(buf) : text;
        break;
      }
      case 'c': {  // chr(int) or a one-character string
        if (v.is_string() && utf8::count_code_points(v.str()) == 1) {
          out += v.str();
        } else if ((v.is_int() || v.is_bool()) && v.as_int() >= 0 && v.as_int() <= 0x10FFFF) {
          utf8::append(out, static_cast<char32_t>(v.as_int()));
        } else {
          throw TemplateError("%c requires an int in range(0x110000) or a single character");
        }
        break;
      }
      case 'd':
      case 'i':
      case 'x':
      case 'X':
      case 'o':
        if (!v.is_number()) {
          throw TemplateError(str_cat("%", std::string(1, conversion),
                                      " format: a real number is required, not ", v.type_name()));
        }
        std::snprintf(buf, sizeof(buf),
                      (spec + "ll" + (conversion == 'i' ? 'd' : conversion)).c_str(),
                      static_cast<long long>(v.is_float() ? float_to_int(v.as_double()).as_int()
                                                          : v.as_int()));
        out += buf;
        break;
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G':
        if (!v.is_number()) {
          throw TemplateError(str_cat("must be real number, not ", v.type_name()));
        }
        std::snprintf(buf, sizeof(buf), (spec + conversion).c_str(), v.as_double());
        out += buf;
        break;
      default:
        throw TemplateError(
            str_cat("unsupported format character '", std::string(1, conversion), "'"));
    }
    check_text_size(out.size());
  }
  if (next < values.size() && args.is_tuple()) {
    throw TemplateError("not all arguments converted during string formatting");
  }
  return out;
}

}  // namespace

void fail_undefined(const Value& undefined) {
  throw TemplateError(undefined.str().empty() ? "value is undefined" : undefined.str());
}

Value get_attribute(const Value& object, const std::string& name) {
  switch (object.type()) {
    case Value::Type::kUndefined:
      fail_undefined(object);
    case Value::Type::kDict: {
      if (!object.dict().is_namespace && dict_methods().count(name)) {
        return Value(
            [object, name](const ValueList& args, const KwArgs& kwargs) {
              return call_dict_method(object, name, args, kwargs);
            },
            name);
      }
      if (const Value* found = object.dict().find(name)) return *found;
      return Value::undefined(str_cat("'", object.dict().is_namespace ? "Namespace" : "dict object",
                                      "' has no attribute '", name, "'"));
    }
    case Value::Type::kString:
      if (string_methods().count(name)) {
        return Value(
            [s = object.str(), name](const ValueList& args, const KwArgs& kwargs) {
              return call_string_method(s, name, args, kwargs);
            },
            name);
      }
      return Value::undefined(str_cat("'str object' has no attribute '", name, "'"));
    case Value::Type::kNone:
      return Value::undefined(str_cat("'None' has no attribute '", name, "'"));
    default:
      return Value::undefined(
          str_cat("'", object.type_name(), " object' has no attribute '", name, "'"));
  }
}

Value get_item(const Value& object, const Value& key) {
  if (object.is_undefined()) fail_undefined(object);
  if (object.is_dict() && key.is_string()) {
    if (const Value* found = object.dict().find(key.str())) return *found;
    if (!object.dict().is_namespace && dict_methods().count(key.str()))
      return get_attribute(object, key.str());
    return Value::undefined(str_cat("'dict object' has no attribute '", key.str(), "'"));
  }
  if ((object.is_list() || object.is_string()) && (key.is_int() || key.is_bool())) {
    const int64_t n = object.is_list()
                          ? static_cast<int64_t>(object.list().size())
                          : static_cast<int64_t>(utf8::count_code_points(object.str()));
    int64_t index = key.as_int();
    if (index < 0) index += n;
    if (index < 0 || index >= n) {
      return Value::undefined(
          str_cat("'", object.type_name(), " object' has no element ", key.as_int()));
    }
    if (object.is_list()) return object.list()[static_cast<size_t>(index)];
    const auto cps = code_points(object.str());
    return Value(from_code_points(cps, static_cast<size_t>(index), static_cast<size_t>(index) + 1));
  }
  if (key.is_string()) return get_attribute(object, key.str());
  return Value::undefined(
      str_cat("'", object.type_name(), " object' has no element ", key.to_string()));
}

Value slice(const Value& object, const Value& start, const Value& stop, const Value& step) {
  if (object.is_undefined()) fail_undefined(object);
  if (!object.is_list() && !object.is_string()) {
    throw TemplateError(str_cat("'", object.type_name(), "' object is not subscriptable"));
  }
  std::vector<char32_t> cps;
  if (object.is_string()) cps = code_points(object.str());
  const int64_t n = object.is_list() ? static_cast<int64_t>(object.list().size())
                                     : static_cast<int64_t>(cps.size());
  auto given = [](const Value& v) { return !v.is_undefined() && !v.is_none(); };
  const int64_t stride = given(step) ? need_int(step, "slice step") : 1;
  if (stride == 0) throw TemplateError("slice step cannot be zero");
  // Python's slice.indices().
  auto clamp = [&](const Value& v, int64_t fallback) {
    if (!given(v)) return fallback;
    int64_t i = need_int(v, "slice index");
    if (i < 0) i += n;
    if (stride > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t begin = clamp(start, stride > 0 ? 0 : n - 1);
  const int64_t end = clamp(stop, stride > 0 ? n : -1);
  ValueList items;
  std::string text;
  for (int64_t i = begin; stride > 0 ? i < end : i > end; i += stride) {
    if (object.is_list()) {
      items.push_back(object.list()[static_cast<size_t>(i)]);
    } else {
      utf8::append(text, cps[static_cast<size_t>(i)]);
    }
  }
  return object.is_list() ? Value(std::move(items), object.is_tuple()) : Value(std::move(text));
}

namespace {

// Python ints are unbounded; template ints are 64-bit, and leaving that range is an error.
int64_t checked(char op, int64_t a, int64_t b) {
  int64_t r = 0;
  const bool overflow = op == '+'   ? __builtin_add_overflow(a, b, &r)
                        : op == '-' ? __builtin_sub_overflow(a, b, &r)
                                    : __builtin_mul_overflow(a, b, &r);
  if (overflow) throw TemplateError(str_cat("integer overflow in '", op, "'"));
  return r;
}

int64_t int_power(int64_t base, int64_t exponent) {
  int64_t result = 1;
  while (exponent > 0) {  // by squaring: at most 63 steps
    if (exponent & 1) result = checked('*', result, base);
    exponent >>= 1;
    if (exponent > 0) base = checked('*', base, base);
  }
  return result;
}

}  // namespace

int64_t negate_int(int64_t v) {
  return checked('-', 0, v);
}

Value arithmetic(const std::string& op, const Value& left, const Value& right) {
  if (left.is_undefined()) fail_undefined(left);
  if (right.is_undefined()) fail_undefined(right);
  const bool numbers = left.is_number() && right.is_number();
  const bool floats = numbers && (left.is_float() || right.is_float());
  if (op == "+") {
    if (numbers)
      return floats ? Value(left.as_double() + right.as_double())
                    : Value(checked('+', left.as_int(), right.as_int()));
    if (left.is_string() && right.is_string()) return Value(left.str() + right.str());
    if (left.is_list() && right.is_list() && left.is_tuple() == right.is_tuple()) {
      ValueList out = left.list();
      out.insert(out.end(), right.list().begin(), right.list().end());
      return Value(std::move(out), left.is_tuple());
    }
    if (left.is_string() || left.is_list()) {
      throw TemplateError(str_cat("can only concatenate ", left.type_name(), " (not \"",
                                  right.type_name(), "\") to ", left.type_name()));
    }
  } else if (op == "-" && numbers) {
    return floats ? Value(left.as_double() - right.as_double())
                  : Value(checked('-', left.as_int(), right.as_int()));
  } else if (op == "*") {
    if (numbers)
      return floats ? Value(left.as_double() * right.as_double())
                    : Value(checked('*', left.as_int(), right.as_int()));
    if ((left.is_string() || left.is_list()) && (right.is_int() || right.is_bool()))
      return repeat(left, right.as_int());
    if ((right.is_string() || right.is_list()) && (left.is_int() || left.is_bool()))
      return repeat(right, left.as_int());
  } else if (op == "/" && numbers) {
    if (right.as_double() == 0.0) throw TemplateError("division by zero");
    return Value(left.as_double() / right.as_double());
  } else if (op == "%" && left.is_string()) {
    return Value(percent_format(left.str(), right));
  } else if ((op == "//" || op == "%") && numbers) {
    return floor_div_or_mod(left, right, op == "%");
  } else if (op == "**" && numbers) {
    if (!floats && right.as_int() >= 0) return Value(int_power(left.as_int(), right.as_int()));
    return Value(std::pow(left.as_double(), right.as_double()));
  }
  throw TemplateError(str_cat("unsupported operand type(s) for ", op, ": '", left.type_name(),
                              "' and '", right.type_name(), "'"));
}

bool contains(const Value& container, const Value& item) {
  switch (container.type()) {
    case Value::Type::kUndefined:
      fail_undefined(container);
    case Value::Type::kString:
      if (!item.is_string()) {
        throw TemplateError(
            str_cat("'in <string>' requires string as left operand, not ", item.type_name()));
      }
      return container.str().find(item.str()) != std::string::npos;
    case Value::Type::kList:
      return std::any_of(container.list().begin(), container.list().end(),
                         [&](const Value& v) { return v.equals(item); });
    case Value::Type::kDict:
      return item.is_string() && container.dict().find(item.str()) != nullptr;
    default:
      throw TemplateError(
          str_cat("argument of type '", container.type_name(), "' is not iterable"));
  }
}

ValueList iterate(const Value& value) {
  charge_work(value.is_list()     ? static_cast<int64_t>(value.list().size())
              : value.is_dict()   ? static_cast<int64_t>(value.dict().entries.size())
              : value.is_string() ? static_cast<int64_t>(value.str().size())
                                  : 0);
  switch (value.type()) {
    case Value::Type::kUndefined:
      return {};
    case Value::Type::kList:
      return value.list();
    case Value::Type::kDict: {
      ValueList keys;
      for (const auto& [k, v] : value.dict().entries) keys.emplace_back(k);
      return keys;
    }
    case Value::Type::kString: {
      check_list_size(utf8::count_code_points(value.str()));
      ValueList chars;
      for (const char32_t c : code_points(value.str())) {
        std::string s;
        utf8::append(s, c);
        chars.emplace_back(std::move(s));
      }
      return chars;
    }
    default:
      throw TemplateError(str_cat("'", value.type_name(), "' object is not iterable"));
  }
}

Value apply_filter(const std::string& name, const Value& input, const ValueList& args,
                   const KwArgs& kwargs) {
  const std::string what = "filter '" + name + "'";
  if (name == "trim") {
    Args a(what, args, kwargs, {"chars"});
    return Value(strip(input.to_string(), a.get(0), true, true));
  }
  if (name == "tojson") {
    Args a(what, args, kwargs, {"indent", "ensure_ascii", "separators", "sort_keys"});
    std::optional<int> indent_width;
    if (a.has(0) && !a.get(0).is_none()) {
      const int64_t width = need_int(a.get(0), "indent");
      if (width < 0 || width > 64) {
        throw TemplateError(str_cat("tojson indent ", width, " is out of range (0..64)"));
      }
      indent_width = static_cast<int>(width);
    }
    std::string item_separator = indent_width ? "," : ", ", key_separator = ": ";
    if (a.has(2) && !a.get(2).is_none()) {
      const Value seps = a.get(2);
      if (!seps.is_list() || seps.list().size() != 2)
        throw TemplateError("tojson separators must be a pair of strings");
      item_separator = need_string(seps.list()[0], "separator");
      key_separator = need_string(seps.list()[1], "separator");
    }
    if (a.get(1, Value(false)).truthy())
      throw TemplateError("tojson(ensure_ascii=true) is not supported");
    return Value(input.to_json(indent_width, item_separator, key_separator,
                               a.get(3, Value(false)).truthy()));
  }
  if (name == "length" || name == "count") {
    Args a(what, args, kwargs, {});
    if (input.is_undefined()) return Value(0);
    if (input.is_string()) return Value(static_cast<int64_t>(utf8::count_code_points(input.str())));
    if (input.is_list()) return Value(static_cast<int64_t>(input.list().size()));
    if (input.is_dict()) return Value(static_cast<int64_t>(input.dict().entries.size()));
    throw TemplateError(str_cat("object of type '", input.type_name(), "' has no len()"));
  }
  if (name == "first" || name == "last") {
    Args a(what, args, kwargs, {});
    const ValueList items = iterate(input);
    if (items.empty()) return Value::undefined(str_cat("No ", name, " item, sequence was empty."));
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    Args a(what, args, kwargs, {"d", "attribute"});
    const std::string separator = a.get(0, Value("")).to_string();
    std::string out;
    bool first = true;
    for (const Value& item : iterate(input)) {
      const Value v = a.has(1) ? attribute_path(item, a.get(1).to_string()) : item;
      out.append(first ? "" : separator).append(v.to_string());
      check_text_size(out.size());
      first = false;
    }
    return Value(out);
  }
  if (name == "default" || name == "d") {
    Args a(what, args, kwargs, {"default_value", "boolean"});
    const bool use_default =
        input.is_undefined() || (a.get(1, Value(false)).truthy() && !input.truthy());
    return use_default ? a.get(0, Value("")) : input;
  }
  if (name == "title") {  // Jinja's do_title: words split at -, whitespace and ({[<
    Args a(what, args, kwargs, {});
    std::string out;
    bool word_start = true;
    for (const char32_t c : code_points(input.to_string())) {
      const bool separator =
          c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || utf8::is_space(c);
      std::string one;
      utf8::append(one, c);
      out += separator ? one : word_start ? utf8::to_upper(one) : utf8::to_lower(one);
      word_start = separator;
    }
    return Value(out);
  }
  if (name == "upper" || name == "lower" || name == "capitalize") {
    Args a(what, args, kwargs, {});
    return call_string_method(input.to_string(), name, {}, {});
  }
  if (name == "replace") {
    Args a(what, args, kwargs, {"old", "new", "count"});
    return Value(replace(input.to_string(), a.get(0).to_string(), a.get(1).to_string(),
                         a.has(2) && !a.get(2).is_none() ? need_int(a.get(2), "count") : -1));
  }
  if (name == "map") {
    ValueList out;
    const Value* attribute = nullptr;
    const Value* fallback = nullptr;
    for (const auto& [key, value] : kwargs) {
      if (key == "attribute")
        attribute = &value;
      else if (key == "default")
        fallback = &value;
    }
    if (attribute) {
      for (const Value& item : iterate(input)) {
        Value v = attribute_path(item, attribute->to_string());
        out.push_back(v.is_undefined() && fallback ? *fallback : v);
      }
    } else {
      if (args.empty()) throw TemplateError("map() needs a filter name or attribute=");
      const std::string filter = need_string(args[0], "map filter name");
      const ValueList rest = sequence_args(args, 1);
      for (const Value& item : iterate(input))
        out.push_back(apply_filter(filter, item, rest, kwargs));
    }
    return Value(std::move(out));
  }
  if (name == "select" || name == "reject") return select(input, args, false, name == "select");
  if (name == "selectattr" || name == "rejectattr")
    return select(input, args, true, name == "selectattr");
  if (name == "items") {
    Args a(what, args, kwargs, {});
    if (input.is_undefined()) return Value(ValueList{});
    if (!input.is_dict())
      throw TemplateError(
          str_cat("Can only get item pairs from a mapping, not ", input.type_name()));
    ValueList out;
    for (const auto& [k, v] : input.dict().entries) out.push_back(pair(k, v));
    return Value(std::move(out));
  }
  if (name == "list") return Value(iterate(input));
  if (name == "string") return Value(input.to_string());
  if (name == "int") {
    Args a(what, args, kwargs, {"default", "base"});
    return to_int(input, a.get(0, Value(0)));
  }
  if (name == "float") {
    Args a(what, args, kwargs, {"default"});
    return to_float(input, a.get(0, Value(0.0)));
  }
  if (name == "abs") {
    if (input.is_float()) return Value(std::fabs(input.as_double()));
    if (input.is_int() || input.is_bool())
      return Value(input.as_int() < 0 ? negate_int(input.as_int()) : input.as_int());
    throw TemplateError(str_cat("bad operand type for abs(): '", input.type_name(), "'"));
  }
  if (name == "round") {
    Args a(what, args, kwargs, {"precision", "method"});
    const double scale =
        std::pow(10.0, static_cast<double>(need_int(a.get(0, Value(0)), "precision")));
    const std::string method = a.get(1, Value("common")).to_string();
    const double x = input.as_double() * scale;
    // "common" is Python's round(): halves go to the even neighbour.
    const double r = method == "floor"  ? std::floor(x)
                     : method == "ceil" ? std::ceil(x)
                                        : std::nearbyint(x);
    return Value(r / scale);
  }
  if (name == "indent") {
    Args a(what, args, kwargs, {"width", "first", "blank"});
    return Value(indent(input.to_string(), a.get(0, Value(4)), a.get(1, Value(false)).truthy(),
                        a.get(2, Value(false)).truthy()));
  }
  if (name == "safe") return input;
  if (name == "format") return Value(percent_format(input.to_string(), Value(args, true)));
  if (name == "escape" || name == "e") return Value(html_escape(input.to_string()));
  if (name == "reverse") {
    if (input.is_string()) {
      auto cps = code_points(input.str());
      std::reverse(cps.begin(), cps.end());
      return Value(from_code_points(cps, 0, cps.size()));
    }
    ValueList items = iterate(input);
    std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (name == "sort" || name == "unique" || name == "min" || name == "max") {
    Args a(what, args, kwargs, {"reverse", "case_sensitive", "attribute"});
    const bool case_sensitive = a.get(1, Value(false)).truthy();
    auto key = [&](const Value& item) {
      Value k = a.has(2) ? attribute_path(item, a.get(2).to_string()) : item;
      return k.is_string() && !case_sensitive ? Value(utf8::to_lower(k.str())) : k;
    };
    ValueList items = iterate(input);
    if (name == "unique") {
      ValueList out, seen;
      for (const Value& item : items) {
        charge_work(static_cast<int64_t>(seen.size()));
        const Value k = key(item);
        if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return s.equals(k); })) {
          seen.push_back(k);
          out.push_back(item);
        }
      }
      return Value(std::move(out));
    }
    charge_work(static_cast<int64_t>(items.size()) * 20);  // n log n comparisons
    std::stable_sort(items.begin(), items.end(),
                     [&](const Value& x, const Value& y) { return key(x).less(key(y)); });
    if (name == "min")
      return items.empty() ? Value::undefined("No aggregated item, sequence was empty.")
                           : items.front();
    if (name == "max")
      return items.empty() ? Value::undefined("No aggregated item, sequence was empty.")
                           : items.back();
    if (a.get(0, Value(false)).truthy()) std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (name == "sum") {
    Args a(what, args, kwargs, {"attribute", "start"});
    Value total = a.get(1, Value(0));
    for (const Value& item : iterate(input)) {
      total = arithmetic("+", total, a.has(0) ? attribute_path(item, a.get(0).to_string()) : item);
    }
    return total;
  }
  if (name == "dictsort") {
    if (!input.is_dict()) throw TemplateError("dictsort needs a mapping");
    ValueList items;
    for (const auto& [k, v] : input.dict().entries) items.push_back(pair(k, v));
    std::stable_sort(items.begin(), items.end(), [](const Value& x, const Value& y) {
      return utf8::to_lower(x.list()[0].str()) < utf8::to_lower(y.list()[0].str());
    });
    return Value(std::move(items));
  }
  throw TemplateError(str_cat("no filter named '", name, "'"));
}

bool apply_test(const std::string& name, const Value& input, const ValueList& args) {
  auto arg = [&](size_t i) -> const Value& {
    if (i >= args.size()) throw TemplateError(str_cat("test '", name, "' needs an argument"));
    return args[i];
  };
  if (name == "defined") return !input.is_undefined();
  if (name == "undefined") return input.is_undefined();
  if (name == "none") return input.is_none();
  if (name == "string") return input.is_string();
  if (name == "number") return input.is_number();
  if (name == "integer") return input.is_int();
  if (name == "float") return input.is_float();
  if (name == "boolean") return input.is_bool();
  if (name == "true") return input.is_bool() && input.as_bool();
  if (name == "false") return input.is_bool() && !input.as_bool();
  if (name == "mapping") return input.is_dict() && !input.dict().is_namespace;
  if (name == "iterable")
    return input.is_list() || input.is_dict() || input.is_string() || input.is_undefined();
  if (name == "sequence") return input.is_list() || input.is_dict() || input.is_string();
  if (name == "callable") return input.is_function();
  if (name == "odd" || name == "even") {
    if (!input.is_int()) throw TemplateError(str_cat("test '", name, "' needs an integer"));
    return (input.as_int() % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    const int64_t d = need_int(arg(0), "divisibleby");
    if (d == 0) throw TemplateError("integer division or modulo by zero");
    return input.as_int() % d == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return input.equals(arg(0));
  if (name == "ne" || name == "!=") return !input.equals(arg(0));
  if (name == "lt" || name == "lessthan" || name == "<") return input.less(arg(0));
  if (name == "gt" || name == "greaterthan" || name == ">") return arg(0).less(input);
  if (name == "le" || name == "<=") return !arg(0).less(input);
  if (name == "ge" || name == ">=") return !input.less(arg(0));
  if (name == "in") return contains(arg(0), input);
  if (name == "lower") return input.is_string() && utf8::to_lower(input.str()) == input.str();
  if (name == "upper") return input.is_string() && utf8::to_upper(input.str()) == input.str();
  if (name == "sameas") return input.equals(arg(0)) && input.type() == arg(0).type();
  throw TemplateError(str_cat("no test named '", name, "'"));
}

}  // namespace turbokv::jinja
