// Jinja2-compatible template engine for HF chat templates (rendering equals Python Jinja2
// configured as transformers does: trim_blocks, lstrip_blocks, loopcontrols, tojson,
// raise_exception, strftime_now).
#pragma once

#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"

namespace turbokv {

// A template's raise_exception(msg) or a runtime error while rendering; what() is the message.
class TemplateError : public Error {
 public:
  using Error::Error;
};

class ChatTemplate {
 public:
  // Throws FormatError with line:column for a syntax error.
  static ChatTemplate parse(const std::string& source);
  // vars: messages, tools, add_generation_prompt, bos_token, eos_token, anything else.
  // Throws TemplateError (a turbokv::Error) for runtime errors and raise_exception.
  std::string render(const nlohmann::json& vars) const;
  // The same with the variables' key order kept: tojson of tools/arguments prints keys in the
  // order Python would (nlohmann::json sorts keys). Prefer this when vars come from JSON text.
  std::string render_ordered(const nlohmann::ordered_json& vars) const;

  // Pins the time strftime_now() formats (default: the local time when rendering).
  void set_now(const std::tm& now);

  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;
  ~ChatTemplate();

 private:
  struct Impl;
  explicit ChatTemplate(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace turbokv
