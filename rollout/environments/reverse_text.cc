// reverse_text: reverse a short lowercase string ("reverse abc:" -> "cba").
#include <algorithm>

#include <fmt/format.h>

#include "rollout/environment.h"

namespace arlo::rollout {

Result<std::shared_ptr<const TaskSet>> make_reverse_text(const ReverseTextOptions& o) {
  if (o.size == 0) return make_error(ErrorCode::kInvalidArgument, "reverse_text: size must be >= 1");
  if (o.min_length < 1 || o.max_length < o.min_length || o.max_length > 64)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("reverse_text: need 1 <= min_length <= max_length <= 64, got [{}, {}]", o.min_length,
                                  o.max_length));
  std::uint64_t state = o.seed ^ 0x7265766572736521ULL;  // "reverse!"
  return generated_tasks("reverse_text", o.size, [&](Task& t) {
    const int len = o.min_length +
                    static_cast<int>(uniform_below(state, static_cast<std::uint64_t>(o.max_length - o.min_length + 1)));
    std::string s;
    for (int k = 0; k < len; ++k) s += static_cast<char>('a' + uniform_below(state, 26));
    t.prompt = "reverse " + s + ":";
    t.answer = std::string(s.rbegin(), s.rend());
    t.info = {{"text", s}};
  });
}

EnvironmentKind reverse_text_environment() {
  return {"reverse_text",
          "reverse a short string",
          {int_option("min_len", 3, "shortest string.").range(1, 4096).user_key(),
           int_option("max_len", 8, "longest string.").range(1, 4096).user_key()},
          false,
          [](const EnvironmentSpec& s) {
            ReverseTextOptions o;
            o.seed = s.seed;
            o.size = s.size;
            o.min_length = static_cast<int>(s.options["min_len"].get<std::int64_t>());
            o.max_length = static_cast<int>(s.options["max_len"].get<std::int64_t>());
            return make_reverse_text(o);
          },
          [](const Json& o) -> std::pair<std::string, std::string> {
            if (o["min_len"].get<std::int64_t>() > o["max_len"].get<std::int64_t>())
              return {"min_len", "must be <= env.max_len"};
            return {};
          },
          "env.min_len <= env.max_len."};
}

}  // namespace arlo::rollout
