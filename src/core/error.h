// The error types (include/turbokv/error.h) plus the helpers every library uses to build their
// messages. Programmer bugs are debug asserts (TKV_DCHECK), never user-facing errors.
#pragma once

#include <cassert>
#include <sstream>
#include <string>
#include <utility>

#include "turbokv/error.h"

namespace turbokv {

// str_cat("bits ", 9, " is not in 1..8") -> "bits 9 is not in 1..8"
template <typename... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}

}  // namespace turbokv

#define TKV_DCHECK(cond) assert(cond)
