// Python/Jinja2 semantics of the template engine's operations: attribute and item access,
// slicing, arithmetic and `in`, iteration, the filters, the `is` tests and the str/dict
// methods HF chat templates call. Errors carry Python's or Jinja's own message.
#pragma once

#include <string>

#include "template/template_value.h"

namespace turbokv::jinja {

Value get_attribute(const Value& object, const std::string& name);  // object.name
Value get_item(const Value& object, const Value& key);              // object[key]
Value slice(const Value& object, const Value& start, const Value& stop, const Value& step);
// + - * / // % ** on Python values; 64-bit integer overflow is a TemplateError.
Value arithmetic(const std::string& op, const Value& left, const Value& right);
// -v, failing for INT64_MIN.
int64_t negate_int(int64_t v);
bool contains(const Value& container, const Value& item);  // item in container
// The values a for loop visits (dict: keys, string: characters, undefined: none).
ValueList iterate(const Value& value);

// Applies a filter; `call_test` lets select/reject run tests by name.
Value apply_filter(const std::string& name, const Value& input, const ValueList& args,
                   const KwArgs& kwargs);
bool apply_test(const std::string& name, const Value& input, const ValueList& args);

// Throws TemplateError with the message of an undefined value used where a value is needed.
[[noreturn]] void fail_undefined(const Value& undefined);

}  // namespace turbokv::jinja
