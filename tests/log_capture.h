#pragma once
// Log lines captured in a test, so it can check that something was logged and what it said. The
// capture joins the process's default logger on first use and keeps every line from then on.
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace arlo::test_log {

class LogCapture final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  // Lines that hold both `a` and `b`.
  std::size_t count(std::string_view a, std::string_view b = {}) {
    std::lock_guard lock(mutex_);
    return static_cast<std::size_t>(std::count_if(lines_.begin(), lines_.end(), [&](const std::string& l) {
      return l.find(a) != std::string::npos && l.find(b) != std::string::npos;
    }));
  }
  bool contains(std::string_view a, std::string_view b = {}) { return count(a, b) > 0; }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    lines_.emplace_back(msg.payload.data(), msg.payload.size());
  }
  void flush_() override {}

 private:
  std::vector<std::string> lines_;
};

inline LogCapture& log_capture() {
  static auto sink = [] {
    auto s = std::make_shared<LogCapture>();
    spdlog::default_logger()->sinks().push_back(s);
    return s;
  }();
  return *sink;
}

}  // namespace arlo::test_log
