// arithmetic: sums of small numbers ("23+45=" -> "68").
#include <algorithm>

#include <fmt/format.h>

#include "rollout/environment.h"

namespace arlo::rollout {

Result<std::shared_ptr<const TaskSet>> make_arithmetic(const ArithmeticOptions& o) {
  if (o.size == 0) return make_error(ErrorCode::kInvalidArgument, "arithmetic: size must be >= 1");
  if (o.num_terms < 1 || o.num_terms > 8)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("arithmetic: num_terms must be in [1, 8], got {}", o.num_terms));
  const int min_value = o.min_value.value_or(std::min(10, o.max_value));
  if (min_value < 0 || o.max_value < min_value || o.max_value > 999999)
    return make_error(
        ErrorCode::kInvalidArgument,
        fmt::format("arithmetic: need 0 <= min_value <= max_value <= 999999, got [{}, {}]", min_value, o.max_value));
  std::uint64_t state = o.seed ^ 0x61726974686d6574ULL;  // "arithmet"
  const auto span = static_cast<std::uint64_t>(o.max_value - min_value + 1);
  return generated_tasks("arithmetic", o.size, [&](Task& t) {
    std::string prompt;
    long long sum = 0;
    Json terms = Json::array();
    for (int k = 0; k < o.num_terms; ++k) {
      const long long term = min_value + static_cast<long long>(uniform_below(state, span));
      if (k) prompt += '+';
      prompt += std::to_string(term);
      sum += term;
      terms.push_back(term);
    }
    prompt += '=';
    t.prompt = std::move(prompt);
    t.answer = std::to_string(sum);
    t.info = {{"terms", terms}};
  });
}

EnvironmentKind arithmetic_environment() {
  return {"arithmetic",
          "sums of small numbers",
          {int_option("max_operand", 20, "largest operand.").range(1, 1000000000).user_key(),
           int_option("num_terms", 2, "numbers in each sum.").range(2, 16).user_key()},
          false,
          [](const EnvironmentSpec& s) {
            ArithmeticOptions o;
            o.seed = s.seed;
            o.size = s.size;
            o.num_terms = static_cast<int>(s.options["num_terms"].get<std::int64_t>());
            o.max_value = static_cast<int>(s.options["max_operand"].get<std::int64_t>());
            return make_arithmetic(o);
          },
          nullptr,
          {}};
}

}  // namespace arlo::rollout
