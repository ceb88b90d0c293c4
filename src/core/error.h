// Errors in three tiers (see STYLE.md):
//  - user input / configuration  -> InvalidArgument (CLI exit 2, Python ValueError, HTTP 400)
//  - malformed or missing files  -> FormatError / IoError (CLI exit 1)
//  - valid but unsupported input -> Unsupported (CLI exit 1)
//  - programmer bugs             -> TKV_DCHECK (debug builds only)
// Every message names the bad value and, where it makes sense, what is allowed.
#pragma once

#include <cassert>
#include <sstream>
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
  using Error::Error;
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

// str_cat("bits ", 9, " is not in 1..8") -> "bits 9 is not in 1..8"
template <typename... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}

}  // namespace turbokv

#define TKV_DCHECK(cond) assert(cond)
