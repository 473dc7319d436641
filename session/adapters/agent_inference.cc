#include "session/adapters/agent_inference.h"

namespace arlo::session::adapters {

AgentInference::AgentInference(orch::InferencePort& inner, AgentRunner& runner,
                               std::optional<boost::asio::any_io_executor> network)
    : inner_(inner), runner_(runner), network_(std::move(network)) {}

Awaitable<Result<orch::GenerateResult>> AgentInference::generate(orch::GenerateRequest request) {
  // A continuation (prompt ids beyond the task's: a partial completion) is never an agent's: the
  // gateway continues aborted calls itself, so only whole groups reach the runner.
  const bool agent = request.task && runner_.handles(*request.task) &&
                     (request.prompt_tokens.empty() || request.prompt_tokens == request.task->prompt_tokens);
  if (!agent) {
    auto op = inner_.generate(std::move(request));
    co_return co_await std::move(op);
  }
  if (!network_) {
    auto op = runner_.run(std::move(request));
    co_return co_await std::move(op);
  }
  auto op = run_on<Result<orch::GenerateResult>>(
      *network_, [this, request = std::move(request)]() mutable { return runner_.run(std::move(request)); });
  co_return co_await std::move(op);
}

}  // namespace arlo::session::adapters
