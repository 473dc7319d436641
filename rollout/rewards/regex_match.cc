// regex_match: 1 when the pattern is found (and, with compare_answer, its capture equals the answer).
#include <regex>

#include <fmt/format.h>

#include "rollout/reward.h"

namespace arlo::rollout {

namespace {
class RegexMatch : public NamedModule {
 public:
  RegexMatch(std::string name, std::regex re, bool compare_answer)
      : NamedModule(std::move(name)), re_(std::move(re)), compare_answer_(compare_answer) {}
  Result<Score> score(const Task& task, const Rollout& r) override {
    std::smatch m;
    const std::string& text = r.text;
    if (!std::regex_search(text, m, re_)) return Score{0.0, {}};
    if (!compare_answer_) return Score{1.0, {}};
    const std::string captured = m.size() > 1 ? m[1].str() : m[0].str();
    return Score{trim(captured) == trim(task.answer) ? 1.0 : 0.0, {}};
  }

 private:
  std::regex re_;  // std::regex matching is const and safe to share across threads
  bool compare_answer_;
};

// The config's check of a pattern, before anything starts.
std::string check_pattern(const Json& value) {
  const std::string pattern = value.is_string() ? value.get<std::string>() : std::string();
  constexpr std::size_t kMaxPattern = 1024;  // libstdc++ compiles regexes recursively
  if (pattern.size() > kMaxPattern) return "longer than 1024 characters";
  // std::regex reports a bad pattern by throwing; caught here, at the edge.
  try {
    std::regex compiled(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return std::string("not a valid regular expression: ") + e.what();
  }
  return {};
}

Result<std::unique_ptr<RewardModule>> make(const RewardSpec& s) {
  if (!s.options.contains("pattern"))
    return make_error(ErrorCode::kInvalidArgument, "reward 'regex_match': needs 'pattern'");
  const std::string pattern = s.options["pattern"].get<std::string>();
  try {
    return std::make_unique<RegexMatch>(s.name, std::regex(pattern), s.options["compare_answer"].get<bool>());
  } catch (const std::regex_error& e) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("reward 'regex_match': bad pattern '{}': {}", pattern, e.what()));
  }
}
}  // namespace

RewardKind regex_match_reward() {
  return {"regex_match",
          "1 when the pattern is found in the completion",
          {string_option("pattern", nullptr, "ECMAScript regular expression to search for.")
               .user_key("")
               .must_be_given()
               .checked_by(check_pattern),
           bool_option("compare_answer", false, "the first capture (else the match) must equal the answer")},
          true,
          make};
}

}  // namespace arlo::rollout
