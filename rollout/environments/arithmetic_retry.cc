// arithmetic_retry: a sum with feedback and another try. A wrong answer gets "\nwrong, try again\n"
// and the prompt again, up to env.max_tries tries; reward retry_discount^(tries - 1) for solving it,
// 0 when every try was wrong. The model's turn ends at the stop "\n", which its text leaves out, so
// the feedback starts a new line: "23+45=67\nwrong, try again\n23+45=68".
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "rollout/environment.h"
#include "rollout/multi_turn.h"

namespace arlo::rollout {
namespace {

constexpr const char* kRetryName = "arithmetic_retry";

class ArithmeticRetry : public LocalEnvironment {
 public:
  ArithmeticRetry(int max_tries, double discount) : max_tries_(max_tries), discount_(discount) {}

  Result<EnvTurn> reset_now(const Task& /*task*/) const override { return EnvTurn{{}, false, {}, {{"tries", 0}}}; }

  Result<EnvTurn> step_now(const Task& task, const Json& state, const std::vector<ChatMessage>& turns) const override {
    ARLO_ASSIGN_OR_RETURN(const std::string answer, last_model_turn(kRetryName, turns));
    ARLO_ASSIGN_OR_RETURN(const std::int64_t tried, state_counter(kRetryName, state, "tries"));
    const std::int64_t tries = tried + 1;
    EnvTurn t;
    t.state = {{"tries", tries}};
    if (answer == task.answer) {
      t.done = true;
      t.reward = std::pow(discount_, static_cast<double>(tries - 1));
    } else if (tries >= max_tries_) {
      t.done = true;
      t.reward = 0.0;
    } else {
      t.messages.push_back({"user", "\nwrong, try again\n" + task.prompt.value_or("")});
    }
    return t;
  }

 private:
  int max_tries_;
  double discount_;
};

}  // namespace

EnvironmentKind arithmetic_retry_environment() {
  return {kRetryName,
          "sums with feedback and up to env.max_tries tries",
          {int_option("max_operand", 20, "largest operand.").range(1, 1000000000).user_key(),
           int_option("num_terms", 2, "numbers in each sum.").range(2, 16).user_key(),
           int_option("max_tries", 3, "tries at each sum (the first included).").range(1, 100).user_key(),
           float_option("retry_discount", 1.0, "the reward of a sum solved at try k is retry_discount^(k-1).")
               .range(0.0, 1.0)
               .user_key()},
          false,
          [](const EnvironmentSpec& s) -> Result<std::shared_ptr<const TaskSet>> {
            ArithmeticOptions o;
            o.seed = s.seed;
            o.size = s.size;
            o.num_terms = static_cast<int>(s.options["num_terms"].get<std::int64_t>());
            o.max_value = static_cast<int>(s.options["max_operand"].get<std::int64_t>());
            ARLO_ASSIGN_OR_RETURN(auto sums, make_arithmetic(o));
            std::size_t i = 0;
            return generated_tasks(kRetryName, sums->size(), [&](Task& t) {
              const Task& sum = sums->at(i++);
              t.prompt = sum.prompt;
              t.answer = sum.answer;
              t.info = sum.info;
            });
          },
          nullptr,
          {},
          [](const EnvironmentSpec& s) -> Result<std::shared_ptr<MultiTurnEnvironment>> {
            return std::make_shared<ArithmeticRetry>(static_cast<int>(s.options["max_tries"].get<std::int64_t>()),
                                                     s.options["retry_discount"].get<double>());
          }};
}

}  // namespace arlo::rollout
