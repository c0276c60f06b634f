#include "common/test_log_capture.h"

#include "common/mutex.h"
#include "glog/logging.h"

namespace hymcache::testing {

class LogCapture::Sink : public google::LogSink {
 public:
  void send(google::LogSeverity /*severity*/, const char* /*full_filename*/,
            const char* /*base_filename*/, int /*line*/,
            const struct ::tm* /*tm_time*/, const char* message,
            size_t message_len) override {
    MutexLock l(&mu_);
    lines_.emplace_back(message, message_len);
  }
  std::vector<std::string> Lines() const {
    MutexLock l(&mu_);
    return lines_;
  }

 private:
  mutable Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

LogCapture::LogCapture() : sink_(std::make_unique<Sink>()) {
  google::AddLogSink(sink_.get());
}

LogCapture::~LogCapture() { google::RemoveLogSink(sink_.get()); }

std::vector<std::string> LogCapture::Lines() const { return sink_->Lines(); }

int LogCapture::Count(const std::string& text) const {
  int n = 0;
  for (const std::string& l : Lines()) n += l.find(text) != std::string::npos;
  return n;
}

}  // namespace hymcache::testing
