// Stop-string matching with hold-back of possible stop-string prefixes (see stop_strings.h).
#include "engine/stop_strings.h"

#include <algorithm>

namespace turbokv {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) {
  for (auto& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

std::string StopStringMatcher::push(const std::string& text, bool* stopped) {
  *stopped = false;
  held_ += text;
  // The earliest complete match wins.
  size_t match = std::string::npos;
  for (const auto& s : stops_) match = std::min(match, held_.find(s));
  if (match != std::string::npos) {
    *stopped = true;
    std::string out = held_.substr(0, match);
    held_.clear();
    released_ += out;
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_) {
    for (size_t len = std::min(s.size() - 1, held_.size()); len > hold; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  released_ += out;
  return out;
}

std::string StopStringMatcher::flush() {
  std::string out;
  out.swap(held_);
  released_ += out;
  return out;
}

}  // namespace turbokv
