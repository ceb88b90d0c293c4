// Chat templates against Python Jinja2 renderings made the way transformers renders them
// (tests/fixtures/chat-templates.json, strftime_now pinned to 26 Jul 2024), plus Python
// semantics the fixtures do not reach and syntax errors with line:column.
#include "template/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "template/template_value.h"

namespace turbokv {
namespace {

using ojson = nlohmann::ordered_json;

std::tm fixture_date() {
  std::tm tm{};
  tm.tm_year = 2024 - 1900;
  tm.tm_mon = 6;
  tm.tm_mday = 26;
  tm.tm_wday = 5;
  tm.tm_yday = 207;
  return tm;
}

ojson load_fixture() {
  std::ifstream in(std::string(TURBOKV_SOURCE_DIR) + "/tests/fixtures/chat-templates.json");
  return ojson::parse(in);
}

TEST(ChatTemplate, FixtureCasesAreByteIdentical) {
  const ojson fixture = load_fixture();
  ASSERT_EQ(fixture["cases"].size(), 80u);
  int errors = 0;
  for (const auto& c : fixture["cases"]) {
    const std::string name = c["template"].get<std::string>() + "/" +
                             c["conversation"].get<std::string>() + "/" +
                             (c["add_generation_prompt"].get<bool>() ? "gen" : "nogen");
    ChatTemplate tmpl = ChatTemplate::parse(fixture["templates"][c["template"].get<std::string>()]);
    tmpl.set_now(fixture_date());
    ojson vars = {{"messages", fixture["conversations"][c["conversation"].get<std::string>()]},
                  {"add_generation_prompt", c["add_generation_prompt"]},
                  {"bos_token", fixture["bos_token"]},
                  {"eos_token", fixture["eos_token"]}};
    for (const auto& [key, value] : c["extra"].items()) vars[key] = value;
    if (c.contains("error")) {
      ++errors;
      try {
        tmpl.render_ordered(vars);
        ADD_FAILURE() << name << ": expected error " << c["error"];
      } catch (const TemplateError& e) {
        EXPECT_EQ(std::string(e.what()), c["error"].get<std::string>()) << name;
      }
    } else {
      EXPECT_EQ(tmpl.render_ordered(vars), c["output"].get<std::string>()) << name;
    }
  }
  EXPECT_GT(errors, 0);
}

std::string render(const std::string& source, const ojson& vars = ojson::object()) {
  return ChatTemplate::parse(source).render_ordered(vars);
}

TEST(ChatTemplate, PythonValueSemantics) {
  EXPECT_EQ(render("{{ none }}|{{ true }}|{{ 1 }}|{{ 1.0 }}|{{ 2.5e-7 }}|{{ 7 / 2 }}|{{ 7 // 2 }}"),
            "None|True|1|1.0|2.5e-07|3.5|3");
  EXPECT_EQ(
      render("{{ -7 // 2 }}|{{ -7 % 3 }}|{{ 2 ** 10 }}|{{ 'ab' * 2 }}|{{ 1e16 }}|{{ 0.1 + 0.2 }}"),
      "-4|2|1024|abab|1e+16|0.30000000000000004");
  EXPECT_EQ(render("{{ x }}", {{"x", {{"b", 1}, {"a", {nullptr, true, "it's"}}}}}),
            "{'b': 1, 'a': [None, True, \"it's\"]}");
  EXPECT_EQ(
      render("{{ missing }}|{{ d.missing }}|{{ d.get('k', 'dflt') }}", {{"d", ojson::object()}}),
      "||dflt");
  EXPECT_EQ(render("{{ [] or 'empty' }}|{{ 0 and 1 }}|{{ '' is string }}|{{ 3 is number }}"),
            "empty|0|True|True");
  EXPECT_EQ(render("{{ x | tojson }}", {{"x", {{"z", "ü\n\"q\""}, {"a", {1, 2.0}}}}}),
            "{\"z\": \"ü\\n\\\"q\\\"\", \"a\": [1, 2.0]}");
  // printf-style formatting; expected strings are Python's.
  EXPECT_EQ(render("{{ '%s-%d' % ('a', 3) }}|{{ '%05.2f' % 3.14159 }}|{{ '%s' % [1, 'a'] }}|"
                   "{{ '%s and %s' | format('a', 2) }}|{{ '%.3e' % 12345.678 }}"),
            "a-3|03.14|[1, 'a']|a and 2|1.235e+04");
  EXPECT_EQ(render("{{ x | tojson(indent=2) }}", {{"x", {{"a", {1}}, {"b", ojson::object()}}}}),
            "{\n  \"a\": [\n    1\n  ],\n  \"b\": {}\n}");
}

TEST(ChatTemplate, StringMethodsAndFilters) {
  EXPECT_EQ(render("{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ 'a,b,,c'.split(',') }}"),
            "a b|a|['a', 'b', '', 'c']");
  EXPECT_EQ(render("{{ ' a  b '.split() }}|{{ 'héllo wörld'.title() }}|{{ 'ÉCOLE'.lower() }}"),
            "['a', 'b']|Héllo Wörld|école");
  EXPECT_EQ(render("{{ 'abc'[::-1] }}|{{ '日本語'[1:] }}|{{ [1,2,3,4][1:3] }}|{{ [1,2,3][-1] }}"),
            "cba|本語|[2, 3]|3");
  EXPECT_EQ(
      render("{{ 'a' ~ 1 ~ none }}|{{ 'x' in 'xyz' }}|{{ 2 not in [1] }}|{{ 'k' in {'k': 1} }}"),
      "a1None|True|True|True");
  EXPECT_EQ(render("{{ items | map(attribute='n') | join(', ') }}|{{ items | selectattr('n', "
                   "'equalto', 2) | list | length }}",
                   {{"items", {{{"n", 1}}, {{"n", 2}}}}}),
            "1, 2|1");
  EXPECT_EQ(render("{{ 'a\nb\n\nc' | indent(2) }}|{{ 'hello' | capitalize }}|{{ undefined_var | "
                   "default('d') }}"),
            "a\n  b\n\n  c|Hello|d");
  EXPECT_EQ(render("{{ {'a': 1, 'b': 2} | items | list }}|{{ '42' | int + 1 }}|{{ 'x' | upper }}"),
            "[('a', 1), ('b', 2)]|43|X");
}

TEST(ChatTemplate, StatementsAndWhitespaceControl) {
  EXPECT_EQ(render("{% for x in [1,2,3] %}{{ loop.index }}{{ '-' if not loop.last }}{% endfor %}"),
            "1-2-3");
  EXPECT_EQ(
      render("{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}"
             "{% endif %}{{ x }}{% else %}none{% endfor %}",
             {{"xs", {1, 2, 3, 4, 5}}}),
      "13");
  EXPECT_EQ(render("{% for x in [] %}{{ x }}{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for x in [1,2] %}{% set ns.n = ns.n + x %}"
                   "{% set local = x %}{% endfor %}{{ ns.n }}{{ local is defined }}"),
            "3False");
  EXPECT_EQ(render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
                   "{{ greet('A') }} {{ greet('B', punct='?') }}"),
            "Hi A! Hi B?");
  EXPECT_EQ(
      render("{% macro wrap() %}[{{ caller() }}]{% endmacro %}{% call wrap() %}in{% endcall %}"),
      "[in]");
  EXPECT_EQ(render("{% set block %}  x  {% endset %}[{{ block | trim }}]{% filter upper %}up{% "
                   "endfilter %}"),
            "[x]UP");
  // trim_blocks + lstrip_blocks as transformers configures Jinja2; one trailing newline dropped.
  EXPECT_EQ(render("a\n  {% if true %}\n  b\n  {% endif %}\nc\n"), "a\n  b\nc");
  EXPECT_EQ(render("a  {{- ' b ' -}}  c"), "a b c");
  EXPECT_EQ(render("{# comment #}\nx{%+ if true %}y{% endif %}"), "xy");
  EXPECT_EQ(render("  {%+ if true +%}\nx{% endif %}"), "  \nx");
  EXPECT_EQ(render("{% raw %}\n{{ not evaluated }}{% if %}\n  {% endraw %}|"),
            "\n{{ not evaluated }}{% if %}\n|");
}

TEST(ChatTemplate, RuntimeErrorsUsePythonMessages) {
  auto error_of = [](const std::string& source, const ojson& vars = ojson::object()) {
    try {
      render(source, vars);
    } catch (const TemplateError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error_of("{{ raise_exception('Bad role: ' + r) }}", {{"r", "x"}}), "Bad role: x");
  EXPECT_EQ(error_of("{{ 'a' + 1 }}"), "can only concatenate str (not \"int\") to str");
  EXPECT_EQ(error_of("{{ 1 + 'a' }}"), "unsupported operand type(s) for +: 'int' and 'str'");
  EXPECT_EQ(error_of("{{ missing.attr }}"), "'missing' is undefined");
  EXPECT_EQ(error_of("{{ 1 / 0 }}"), "division by zero");
  EXPECT_EQ(error_of("{{ x | nosuchfilter }}"), "no filter named 'nosuchfilter'");
  EXPECT_EQ(error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"),
            "macro 'f' recursed deeper than 100 calls");
}

// The message of the TemplateError that rendering source must throw.
std::string render_error(const std::string& source, const ojson& vars = ojson::object()) {
  try {
    render(source, vars);
  } catch (const TemplateError& e) {
    return e.what();
  }
  return "no error";
}

TEST(ChatTemplateBounds, OutputAndStringsAreBounded) {
  const std::string limit = std::to_string(jinja::kMaxTextBytes);
  for (const char* source : {
           "{{ 'x' * 100000000000 }}",               // one multiplication
           "{{ 'x' * 10000000 ~ 'y' * 10000000 }}",  // concatenation past the limit
           "{% for i in range(100) %}{{ 'x' * 1000000 }}{% endfor %}",  // output grows
           "{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
           "{% endfor %}",  // doubling
           "{{ ('x' * 100000) | replace('x', 'x' * 1000) }}",
           "{{ ('x' * 10000) | indent(100000000000) }}",
           "{{ [('x' * 1000000)] * 100000 }}",  // printing a list
           "{{ (['x'] * 1000) | join('y' * 100000) }}",
       }) {
    const std::string e = render_error(source);
    EXPECT_NE(e.find("more than the limit of " + limit), std::string::npos) << source << ": " << e;
  }
  EXPECT_NE(render_error("{{ [1] * 100000000000 }}").find("limit"), std::string::npos);
  EXPECT_NE(render_error("{{ '%999999999d' % 1 }}").find("too large"), std::string::npos);
  EXPECT_NE(render_error("{{ x | tojson(indent=1000000000) }}", {{"x", {1}}}).find("indent"),
            std::string::npos);
  // Within the bounds nothing changes.
  EXPECT_EQ(render("{{ ('ab' * 3) | replace('b', 'c') }}|{{ '%5d' % 42 }}"), "acacac|   42");
}

TEST(ChatTemplateBounds, IterationsAreBounded) {
  for (const char* source : {
           "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
           "{% for i in range(1000000) %}{{ i }}{% endfor %}{% for i in range(1000000) %}"
           "{% for j in range(1000) %}{% endfor %}{% endfor %}",
           // Exponential macro recursion within the depth limit.
           "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
           "{{ f(60) }}",
           "{{ range(1000000) | list | unique | length }}",
       }) {
    const std::string e = render_error(source);
    EXPECT_NE(e.find("ran longer than its budget"), std::string::npos) << source << ": " << e;
  }
}

TEST(ChatTemplateBounds, NestingCyclesAndIntegersAreErrors) {
  EXPECT_NE(render_error("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}"
                         "{% set ns.x = [ns.x] %}{% endfor %}")
                .find("nest deeper than"),
            std::string::npos);
  // Namespaces holding themselves or each other: printing, tojson and == end in an error.
  const std::string cycle =
      "{% set ns = namespace() %}{% set ns.me = ns %}{% set a = namespace() %}"
      "{% set b = namespace(me=a) %}{% set a.me = b %}";
  for (const char* use : {"{{ ns }}", "{{ ns | tojson }}", "{{ a == b }}"}) {
    EXPECT_NE(render_error(cycle + use).find("contains itself"), std::string::npos) << use;
  }
  // A macro that escapes the loop that defined it.
  EXPECT_NE(render_error("{% set ns = namespace() %}{% for i in [1] %}{% macro m() %}x"
                         "{% endmacro %}{% set ns.m = m %}{% endfor %}{{ ns.m() }}")
                .find("after the block that defined it"),
            std::string::npos);
  for (const char* source :
       {"{{ 9223372036854775807 + 1 }}", "{{ -9223372036854775807 - 2 }}", "{{ 2 ** 64 }}",
        "{{ 3037000500 * 3037000500 }}", "{{ (-9223372036854775807 - 1) // -1 }}",
        "{{ -(-9223372036854775807 - 1) }}", "{{ 1e300 | int }}"}) {
    EXPECT_NE(render_error(source).find("integer"), std::string::npos) << source;
  }
  EXPECT_EQ(render("{{ 2 ** 62 }}|{{ (-9223372036854775807 - 1) % -1 }}|{{ '%c' % 233 }}"),
            "4611686018427387904|0|\xC3\xA9");
  EXPECT_EQ(render("{{ range(9223372036854775800, 9223372036854775807, 5) | list }}"),
            "[9223372036854775800, 9223372036854775805]");
}

// Number literals past the C++ types: an integer beyond 64 bits is a syntax error at it (also
// after a dot, x.0 being x[0]); a float literal overflows to inf and underflows to 0 as Python's.
TEST(ChatTemplate, NumberLiteralsOutOfRange) {
  auto error_of = [](const std::string& source) {
    try {
      ChatTemplate::parse(source);
    } catch (const FormatError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error_of("{{ 99999999999999999999 }}"),
            "template syntax error at 1:4: integer literal 99999999999999999999 is out of the "
            "64-bit range");
  EXPECT_EQ(error_of("{{ loop.777777777777777777777777777777777777777777index0 }}"),
            "template syntax error at 1:9: integer literal 77777777777777777777777777777777... is "
            "out of the 64-bit range");
  EXPECT_EQ(render("{{ 9223372036854775807 }}|{{ [5].0 }}|{{ 1e999 }}|{{ -1e999 }}|{{ 1e-999 }}"),
            "9223372036854775807|5|inf|-inf|0.0");
}

TEST(ChatTemplate, SyntaxErrorsNameLineAndColumn) {
  auto error_of = [](const std::string& source) {
    try {
      ChatTemplate::parse(source);
    } catch (const FormatError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error_of("ok\n{% if x %}\nyes"),
            "template syntax error at 3:4: unexpected end of template, expected 'elif' or 'else' "
            "or 'endif'");
  EXPECT_EQ(error_of("line1\n  {{ a + }}"),
            "template syntax error at 2:10: unexpected '}}' in expression");
  EXPECT_EQ(error_of("{% frobnicate %}"), "template syntax error at 1:4: unknown tag 'frobnicate'");
  EXPECT_EQ(error_of("{{ 'open }}"), "template syntax error at 1:4: unterminated string literal");
  std::string deep = "{{ ";
  for (int i = 0; i < 100000; ++i) deep += "-";
  EXPECT_NE(error_of(deep + "1 }}").find("nesting is deeper than 200"), std::string::npos);
  std::string deep_ifs;
  for (int i = 0; i < 1000; ++i) deep_ifs += "{% if x %}";
  EXPECT_NE(error_of(deep_ifs).find("nesting is deeper than 200"), std::string::npos);
  // Operator, attribute and filter chains build left-deep trees: bounded the same way.
  for (const char* link : {" + 1", " ~ 1", ".a", "[0]", " | f", " and 1", "()"}) {
    std::string chain = "{{ x";
    for (int i = 0; i < 100000; ++i) chain += link;
    EXPECT_NE(error_of(chain + " }}").find("nesting is deeper than 200"), std::string::npos)
        << link;
  }
  EXPECT_EQ(error_of("{% for x y %}{% endfor %}"),
            "template syntax error at 1:10: expected 'in' in for loop, got 'y'");
}

}  // namespace
}  // namespace turbokv
