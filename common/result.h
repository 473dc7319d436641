#pragma once
// Result<T> and Error: how every arlo module reports failure.
//
// Errors are values. An Error carries a machine-readable code, a message that says what went wrong,
// where, and what to do, and a chain of context frames added as it travels up
// ("loading configs/x.yaml: orchestrator.batch_size: must be >= 1, got 0").
// Exceptions are converted at the edges (yaml-cpp, libtorch) and never cross module boundaries.
#include <expected>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace arlo {

enum class ErrorCode {
  kInvalidArgument,    // caller passed something wrong (bad config value, bad request field)
  kParse,              // malformed input: YAML, JSON, safetensors header, wire frame
  kNotFound,           // file, key, route, tensor name missing
  kIo,                 // filesystem or socket failure
  kTimeout,            // a deadline expired
  kCancelled,          // work was cancelled on purpose (shutdown, abort)
  kMismatch,           // two sides disagree: manifest, version, checksum, schema
  kUnavailable,        // peer down, circuit open, try again later
  kResourceExhausted,  // a size limit was hit
  kInternal,           // a bug in arlo: the message says which invariant broke
};

std::string_view to_string(ErrorCode code);

class Error {
 public:
  Error(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  ErrorCode code() const { return code_; }
  // The innermost message, without context.
  const std::string& message() const { return message_; }
  // Context frames, outermost first.
  const std::vector<std::string>& context() const { return context_; }

  // Adds an outer frame: "loading configs/x.yaml". Returns *this for chaining.
  Error& with_context(std::string frame) & {
    context_.insert(context_.begin(), std::move(frame));
    return *this;
  }
  Error&& with_context(std::string frame) && { return std::move(with_context(std::move(frame))); }

  // "outer: inner: message"
  std::string what() const;

 private:
  ErrorCode code_;
  std::string message_;
  std::vector<std::string> context_;
};

template <typename T>
using Result = std::expected<T, Error>;
using Status = std::expected<void, Error>;

inline std::unexpected<Error> make_error(ErrorCode code, std::string message) {
  return std::unexpected<Error>(Error(code, std::move(message)));
}

inline Status ok() { return {}; }

// Adds context to the error of a failed Result, passing success through unchanged.
template <typename T>
Result<T> with_context(Result<T> r, std::string frame) {
  if (!r) r.error().with_context(std::move(frame));
  return r;
}

}  // namespace arlo

// ARLO_TRY(expr): evaluates a Result/Status; on failure returns its error from the enclosing function.
#define ARLO_TRY(expr)                                                                  \
  do {                                                                                  \
    auto arlo_try_result_ = (expr);                                                     \
    if (!arlo_try_result_) return std::unexpected(std::move(arlo_try_result_).error()); \
  } while (0)

// ARLO_ASSIGN_OR_RETURN(lhs, expr): lhs = *expr, or returns its error.
#define ARLO_CONCAT_INNER_(a, b) a##b
#define ARLO_CONCAT_(a, b) ARLO_CONCAT_INNER_(a, b)
#define ARLO_ASSIGN_OR_RETURN(lhs, expr) ARLO_ASSIGN_OR_RETURN_IMPL_(ARLO_CONCAT_(arlo_r_, __LINE__), lhs, expr)
#define ARLO_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr)         \
  auto tmp = (expr);                                        \
  if (!tmp) return std::unexpected(std::move(tmp).error()); \
  lhs = std::move(*tmp)
