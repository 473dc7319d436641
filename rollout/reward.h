#pragma once
// Reward modules: score one rollout (or a whole group) against its task.
//
// Contract for implementers: score() and score_group() may be called concurrently from several
// threads (RewardScorer runs them on its own worker threads, never on the event loop) and must be
// thread-safe. They return errors as values; RewardScorer also catches exceptions, enforces a
// timeout and rejects non-finite rewards, then applies the configured failure policy.
//
// Modules are built from a JSON spec (the orchestrator converts its YAML section):
//   {"kind": "exact_match"}                                 trimmed completion == answer
//   {"kind": "numeric_match", "rel_tol": 1e-6, "abs_tol": 1e-9}  last number in completion == answer
//   {"kind": "lcs_ratio"}                                   2*LCS/(|completion|+|answer|)
//   {"kind": "regex_match", "pattern": "...", "compare_answer": false}
//   {"kind": "length_penalty", "max_tokens": 256, "free_tokens": 0, "coef": 1.0}
//   {"kind": "plugin", "path": "libmy_reward.so", "config": "<string or JSON>", "isolate": "none",
//    "timeout_s": 30}                                        isolate: none | process (rollout/reward_process.h)
//   {"kind": "http", "url": "http://127.0.0.1:9000/score", "timeout_s": 10}
//   {"kind": "weighted", "modules": [{"kind": ..., "weight": 0.8, "name": "acc"}, ...]}
// A list of specs is shorthand for "weighted". Every spec accepts "name" (default: its kind), used
// as the metric prefix. "type", the former name of "kind", is read for one release with a warning.
// The config schema's form is accepted too: a built-in's options inside "config" ({kind:
// numeric_match, config: {rel_tol: 1e-3}}), and empty "path"/"url"/"pattern" values are ignored (so
// reward.modules converted to JSON works as is).
//
// Each built-in kind is one file under rollout/rewards/ defining `RewardKind <name>_reward()` and one
// line in rollout/rewards/registry.inc; the factory, reward.modules[].kind and its config keys and
// docs come from the registered kinds.
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/option_spec.h"
#include "common/registry.h"
#include "common/result.h"
#include "rollout/types.h"

namespace arlo::rollout {

struct Score {
  double reward = 0;
  std::map<std::string, double> metrics;
};

class RewardModule {
 public:
  virtual ~RewardModule() = default;
  virtual const std::string& name() const = 0;
  virtual Result<Score> score(const Task& task, const Rollout& rollout) = 0;
  // True when score_group() looks at the group as a whole (e.g. ranking); the scorer then makes one
  // call per group instead of one per sample.
  virtual bool scores_groups() const { return false; }
  // Default: score() per sample, failing on the first error.
  virtual Result<std::vector<Score>> score_group(const Task& task, std::span<const Rollout> group);
  // Ok while the module can go on scoring; an error once it cannot (a process-isolated plugin whose
  // host died more often in a row than its restart bound). RewardScorer then stops the run with it.
  virtual Status usable() const { return ok(); }
};

Result<std::unique_ptr<RewardModule>> make_reward_module(const Json& spec);

// What a kind's factory gets: its options checked and defaulted (common/option_spec.h resolve_options; the
// spec's "kind", "name" and "weight" stay in it), and the metric prefix.
struct RewardSpec {
  const Json& options;
  std::string name;    // the spec's "name", else the kind's name
  bool named = false;  // the spec gave "name"
};

// One registered kind of reward module.
struct RewardKind {
  // What a config calls a name, in errors: "unknown reward kind 'x': use ...".
  static constexpr const char* kWhat = "reward kind";
  std::string name;  // the spec's "kind" (reward.modules[].kind)
  std::string doc;   // one line for docs/configuration.md
  // Options: those marked user_key() are keys of a reward.modules item (path, url, pattern); the
  // others go in the item's `config` map. A kind with an option named "config" takes that map whole.
  std::vector<OptionSpec> options;
  bool in_config = true;  // offered as reward.modules[].kind (weighted: the list itself is the sum)
  std::function<Result<std::unique_ptr<RewardModule>>(const RewardSpec&)> make;
};

// Every registered kind, in registration order (rollout/rewards/registry.inc).
const ExtensionRegistry<RewardKind>& reward_kinds();
// The kind named `name`; the error lists the registered names.
inline Result<const RewardKind*> find_reward_kind(std::string_view name) { return reward_kinds().find(name); }

// Pieces the factory uses, exposed for tests and for composing in code.
std::string trim(std::string_view s);
// The last decimal number in `text` ("-12", "3.5", "1e3", "1,234"), or nullopt.
std::optional<double> last_number(std::string_view text);
// Longest common subsequence length (bytes).
std::size_t lcs_length(std::string_view a, std::string_view b);

struct WeightedPart {
  std::unique_ptr<RewardModule> module;
  double weight = 1.0;
};
// reward = sum(weight_i * reward_i); metrics: "<name_i>" = reward_i and "<name_i>/<metric>".
std::unique_ptr<RewardModule> make_weighted(std::string name, std::vector<WeightedPart> parts);

// A module with a fixed name, for kinds to derive from.
class NamedModule : public RewardModule {
 public:
  explicit NamedModule(std::string name) : name_(std::move(name)) {}
  const std::string& name() const override { return name_; }

 private:
  std::string name_;
};

}  // namespace arlo::rollout
