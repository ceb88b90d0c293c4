// Errors thrown by turbokv, in three tiers:
//  - user input / configuration  -> InvalidArgument (CLI exit 2, Python ValueError, HTTP 400);
//                                   param() names the offending field when there is one
//                                   ("kv_bits", "max_tokens", ...)
//  - malformed or missing files  -> FormatError / IoError (CLI exit 1)
//  - valid but unsupported input -> Unsupported (CLI exit 1)
// Every message names the bad value and, where it makes sense, what is allowed.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace turbokv {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class InvalidArgument : public Error {
 public:
  explicit InvalidArgument(const std::string& message, std::string param = "")
      : Error(message), param_(std::move(param)) {}
  // The request or option field the error is about; "" when none applies.
  const std::string& param() const { return param_; }

 private:
  std::string param_;
};

class FormatError : public Error {
 public:
  using Error::Error;
};

class IoError : public Error {
 public:
  using Error::Error;
};

class Unsupported : public Error {
 public:
  using Error::Error;
};

}  // namespace turbokv
