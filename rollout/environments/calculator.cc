// calculator: sums with more terms than the small model adds reliably, and a tool. A model turn that
// is a call, "calc(12+34+56+7)" (integers joined by + or -, spaces allowed), gets the result and the
// prompt again, "=109\n12+34+56+7=", as a "tool" message; any other turn is the final answer: reward
// 1 when it is the sum, 0 otherwise. Up to env.max_calls calls; one more ends the trajectory with
// reward 0. A malformed call is answered "=error" and counts as a call. The state counts the calls
// ({"calls": n}), so a run can report its tool-use rate.
//
// The task's answer (what the supervised warm-up trains on and single-turn rewards compare) is set by
// env.calc_answer: "call" makes it the ideal trajectory's first model turn, the call itself, so the
// warm-up teaches the syntax (a char-level model would never emit "calc(" by chance) and reinforcement
// learning then has to learn to read the tool's answer; "sum" makes it the sum, for a run that must
// find the tool without being shown it; "mix" makes every other task's answer the ideal trajectory
// written out, "calc(12+34+56+7)\n=109\n12+34+56+7=109", and the others' the sum, so the warmed-up
// model sometimes calls and sometimes adds by itself, and reinforcement learning can find that calling
// pays (the multi-turn learning test). info holds {"terms", "sum"} either way.
#include <charconv>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "rollout/environment.h"
#include "rollout/multi_turn.h"

namespace arlo::rollout {
namespace {

constexpr const char* kCalculatorName = "calculator";

// The value of "a+b-c..." (integers of at most 12 digits, at most 64 of them); nullopt when malformed.
std::optional<long long> evaluate_calc(std::string_view expr) {
  long long total = 0;
  int terms = 0;
  int sign = 1;
  std::size_t i = 0;
  while (true) {
    while (i < expr.size() && expr[i] == ' ') ++i;
    const std::size_t start = i;
    while (i < expr.size() && expr[i] >= '0' && expr[i] <= '9') ++i;
    if (i == start || i - start > 12 || ++terms > 64) return std::nullopt;
    long long value = 0;
    std::from_chars(expr.data() + start, expr.data() + i, value);
    total += sign * value;
    while (i < expr.size() && expr[i] == ' ') ++i;
    if (i == expr.size()) return total;
    if (expr[i] != '+' && expr[i] != '-') return std::nullopt;
    sign = expr[i++] == '+' ? 1 : -1;
  }
}

class Calculator : public LocalEnvironment {
 public:
  explicit Calculator(int max_calls) : max_calls_(max_calls) {}

  Result<EnvTurn> reset_now(const Task& /*task*/) const override { return EnvTurn{{}, false, {}, {{"calls", 0}}}; }

  Result<EnvTurn> step_now(const Task& task, const Json& state, const std::vector<ChatMessage>& turns) const override {
    ARLO_ASSIGN_OR_RETURN(const std::string text, last_model_turn(kCalculatorName, turns));
    ARLO_ASSIGN_OR_RETURN(std::int64_t calls, state_counter(kCalculatorName, state, "calls"));
    if (!task.info.contains("sum") || !task.info["sum"].is_number_integer())
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("{}: task {} has no info.sum", kCalculatorName, task.id));
    const std::string_view turn = text;
    EnvTurn t;
    if (turn.starts_with("calc(")) {
      ++calls;
      if (calls > max_calls_) {
        t.done = true;
        t.reward = 0.0;
      } else {
        std::optional<long long> value;
        if (turn.ends_with(")")) value = evaluate_calc(turn.substr(5, turn.size() - 6));
        const std::string result = value ? std::to_string(*value) : "error";
        t.messages.push_back({"tool", "=" + result + "\n" + task.prompt.value_or("")});
      }
    } else {
      t.done = true;
      t.reward = turn == std::to_string(task.info["sum"].get<std::int64_t>()) ? 1.0 : 0.0;
    }
    t.state = {{"calls", calls}};
    return t;
  }

 private:
  std::int64_t max_calls_;
};

Result<std::shared_ptr<const TaskSet>> make_calculator_tasks(const EnvironmentSpec& s) {
  ArithmeticOptions o;
  o.seed = s.seed ^ 0x63616c63ULL;  // "calc": other sums than arithmetic's with the same seed
  o.size = s.size;
  o.num_terms = static_cast<int>(s.options["calc_terms"].get<std::int64_t>());
  o.max_value = static_cast<int>(s.options["max_operand"].get<std::int64_t>());
  ARLO_ASSIGN_OR_RETURN(auto sums, make_arithmetic(o));
  const std::string answer = s.options["calc_answer"].get<std::string>();
  if (answer != "call" && answer != "sum" && answer != "mix")
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("{}: calc_answer must be call, sum or mix, got '{}'", kCalculatorName, answer));
  std::size_t i = 0;
  return generated_tasks(kCalculatorName, sums->size(), [&](Task& t) {
    const bool even = i % 2 == 0;
    const Task& sum = sums->at(i++);
    const std::string& p = *sum.prompt;  // "12+34+56+7="
    const std::string call = "calc(" + p.substr(0, p.size() - 1) + ")";
    t.prompt = p;
    if (answer == "call")
      t.answer = call;
    else if (answer == "mix" && even)
      t.answer = call + "\n=" + sum.answer + "\n" + p + sum.answer;  // the model's stop "\n", the tool's reply, the sum
    else
      t.answer = sum.answer;
    t.info = {{"terms", sum.info["terms"]}, {"sum", std::stoll(sum.answer)}};
  });
}

}  // namespace

EnvironmentKind calculator_environment() {
  EnvironmentKind kind;
  kind.name = kCalculatorName;
  kind.doc = "long sums with a calc(...) tool";
  // max_operand is arithmetic's key (one config key for both); the number of terms is its own.
  kind.options.push_back(int_option("max_operand", 20, "largest operand.").range(1, 1000000000).user_key());
  kind.options.push_back(int_option("calc_terms", 4, "numbers in each sum.").range(2, 8).user_key());
  kind.options.push_back(int_option("max_calls", 1, "tool calls allowed before the answer.").range(0, 100).user_key());
  kind.options.push_back(string_option("calc_answer", "call",
                                       "the task's answer: call (the ideal first turn), sum, or mix (every other "
                                       "task's the whole ideal trajectory, the others' the sum).")
                             .one_of({"call", "sum", "mix"})
                             .user_key());
  kind.make = make_calculator_tasks;
  kind.make_environment = [](const EnvironmentSpec& s) -> Result<std::shared_ptr<MultiTurnEnvironment>> {
    return std::make_shared<Calculator>(static_cast<int>(s.options["max_calls"].get<std::int64_t>()));
  };
  return kind;
}

}  // namespace arlo::rollout
