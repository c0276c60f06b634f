// Tests only: captures what the process logs through glog while alive, so a
// test can count log lines (e.g. that an event is logged once, not once per
// call). The header does not include glog (its CHECK collides with
// Catch2's).
//
// Thread safety: safe for concurrent use without external synchronization.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace hymcache::testing {

class LogCapture {
 public:
  LogCapture();
  ~LogCapture();
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  // The messages logged since construction (without glog's prefix).
  std::vector<std::string> Lines() const;
  // How many of them contain `text`.
  int Count(const std::string& text) const;

 private:
  class Sink;
  std::unique_ptr<Sink> sink_;
};

}  // namespace hymcache::testing
