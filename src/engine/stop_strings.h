// Stop strings over streamed text. Text is released only once it cannot be the start of a stop
// string any more, so a streaming client never sees part of a stop string.
#pragma once

#include <string>
#include <vector>

namespace turbokv {

class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops);

  // Appends newly decoded text. Returns the text that is now safe to release; sets *stopped when
  // a stop string completed (the returned text then ends right before it).
  std::string push(const std::string& text, bool* stopped);
  // End of generation: releases what was held back.
  std::string flush();
  // All released text so far.
  const std::string& released() const { return released_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;  // text that may be the start of a stop string
  std::string released_;
};

}  // namespace turbokv
