#pragma once
// Where tasks come from: task sources (JSONL datasets, built-in procedural tasks), eval splits, and
// a TaskStream that walks a source in seeded shuffled order over epochs with a cursor that can be
// saved and restored, so a resumed run continues with exactly the task it would have served next.
//
// Thread-safety: sources are immutable after construction and safe to share; a TaskStream is used
// by one thread (the orchestrator's event loop).
#include <cstdint>
#include <memory>
#include <optional>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/option_spec.h"
#include "common/registry.h"
#include "common/result.h"
#include "rollout/types.h"

namespace arlo::rollout {

class MultiTurnEnvironment;  // rollout/multi_turn.h

// An immutable, indexable list of tasks.
class TaskSet {
 public:
  virtual ~TaskSet() = default;
  virtual const std::string& name() const = 0;
  virtual std::size_t size() const = 0;
  virtual const Task& at(std::size_t index) const = 0;
};

// Tasks held in memory.
class VectorTaskSet : public TaskSet {
 public:
  VectorTaskSet(std::string name, std::vector<Task> tasks) : name_(std::move(name)), tasks_(std::move(tasks)) {}
  const std::string& name() const override { return name_; }
  std::size_t size() const override { return tasks_.size(); }
  const Task& at(std::size_t index) const override { return tasks_.at(index); }

 private:
  std::string name_;
  std::vector<Task> tasks_;
};

// Loads a JSONL file: one object per line with "prompt" (string) or "messages" ([{role, content}]),
// optional "answer" (string or number), optional "id" (default "<name>-<line>") and "info" (object).
// Blank lines are skipped. Errors cite "path:line: what is wrong". max_tasks > 0 keeps the first
// max_tasks tasks (env.size), 0 keeps all.
Result<std::shared_ptr<const TaskSet>> load_jsonl(const std::string& path, std::string name, std::size_t max_tasks = 0);

// The procedural kinds' task set: `size` tasks of environment `env`, task i with id "<env>-<i>" and
// env `env`, and the rest (prompt, answer, info) set by `fill`, called for i = 0, 1, ... in order (so
// a seeded generator that `fill` draws from gives the same tasks every time).
std::shared_ptr<const TaskSet> generated_tasks(std::string env, std::size_t size,
                                               const std::function<void(Task&)>& fill);

struct ArithmeticOptions {
  std::uint64_t seed = 0;
  std::size_t size = 1000;
  int num_terms = 2;               // terms per sum
  std::optional<int> min_value{};  // each term in [min_value, max_value]; default min(10, max_value)
  int max_value = 49;              // env.max_operand; 10..49 gives two-digit answers: "23+45=" -> "68"
};
// Sums of small numbers: prompt "23+45=", answer "68", info {"terms": [23, 45]}.
Result<std::shared_ptr<const TaskSet>> make_arithmetic(const ArithmeticOptions& options);

struct ReverseTextOptions {
  std::uint64_t seed = 0;
  std::size_t size = 1000;
  int min_length = 3;
  int max_length = 8;
};
// Reverse a short lowercase string: prompt "reverse abc:", answer "cba".
Result<std::shared_ptr<const TaskSet>> make_reverse_text(const ReverseTextOptions& options);

// Task sources by kind (env.kind, eval.env_kind). Each kind is one file under rollout/environments/
// defining `EnvironmentKind <name>_environment()` and one line in rollout/environments/registry.inc;
// the config's allowed kinds and their env.* keys and docs come from the registered kinds.
struct EnvironmentSpec {
  std::uint64_t seed = 0;
  std::size_t size = 0;           // tasks generated (procedural kinds) or kept (datasets; 0: all)
  std::string path;               // kinds that read a file (needs_path)
  Json options = Json::object();  // the kind's own options (make_task_source checks and defaults them)
};
struct EnvironmentKind {
  // What a config calls a name, in errors: "unknown environment kind 'x': use ...".
  static constexpr const char* kWhat = "environment kind";
  std::string name;  // the value of env.kind
  std::string doc;   // a few words for docs/configuration.md
  // Its own options; each is a key of the env section (env.max_operand, ...).
  std::vector<OptionSpec> options;
  bool needs_path = false;  // the config must give env.path (eval.env_path) for it
  std::function<Result<std::shared_ptr<const TaskSet>>(const EnvironmentSpec&)> make;
  // Config: a check across its options ({} when fine; else the key to blame and what is wrong,
  // e.g. {"min_len", "must be <= env.max_len"}). The config checks it whatever env.kind is (eval
  // may use the kind). nullptr: none.
  std::pair<std::string, std::string> (*check)(const Json& options) = nullptr;
  std::string check_doc;  // the check in words, for docs/configuration.md ("env.min_len <= env.max_len.")
  // Multi-turn kinds: the environment its tasks run in (rollout/multi_turn.h), made from the same
  // spec (options resolved). nullptr: a single-turn kind.
  std::function<Result<std::shared_ptr<MultiTurnEnvironment>>(const EnvironmentSpec&)> make_environment = nullptr;
  // Its tasks run through the policy gateway (session/gateway.h): a program outside arlo calls the
  // model for each trajectory (verifiers). A run serves the gateway when env.kind, any env.sources
  // item's kind or eval.env_kind is such a kind.
  bool via_gateway = false;
};
// Every registered kind, in registration order (rollout/environments/registry.inc).
const ExtensionRegistry<EnvironmentKind>& environment_kinds();
// The kind named `name`; the error lists the registered names.
inline Result<const EnvironmentKind*> find_environment_kind(std::string_view name) {
  return environment_kinds().find(name);
}
// Kind `kind`'s own options `options` checked, with the defaults filled in.
Result<Json> resolve_environment_options(std::string_view kind, const Json& options);
// A source of kind `kind` (its options checked, defaults filled in).
Result<std::shared_ptr<const TaskSet>> make_task_source(std::string_view kind, const EnvironmentSpec& spec);
// The multi-turn environment of kind `kind` (options checked and defaulted as above); nullptr for a
// single-turn kind.
Result<std::shared_ptr<MultiTurnEnvironment>> make_multi_turn_environment(std::string_view kind,
                                                                          const EnvironmentSpec& spec);

// Splits a source into disjoint train and eval views: `eval_size` tasks chosen by a seeded shuffle
// go to eval, the rest to train. Both views keep the parent's task objects (no copies).
struct SplitSources {
  std::shared_ptr<const TaskSet> train;
  std::shared_ptr<const TaskSet> eval;
};
Result<SplitSources> split_eval(std::shared_ptr<const TaskSet> source, std::size_t eval_size, std::uint64_t seed);

// Walks a source in order (or a seeded shuffle per epoch) for `epochs` epochs (nullopt = forever).
class TaskStream {
 public:
  struct Options {
    std::uint64_t seed = 0;
    bool shuffle = true;
    std::optional<std::uint64_t> epochs{};  // nullopt: cycle forever
  };
  TaskStream(std::shared_ptr<const TaskSet> source, Options options);

  // The next task, or kNotFound once all epochs are served.
  Result<Task> next();
  bool exhausted() const;

  std::uint64_t epoch() const { return epoch_; }
  std::uint64_t served() const { return served_; }

  // {"source", "size", "seed", "shuffle", "epoch", "index", "served"}: everything needed to resume.
  Json cursor() const;
  // Continues from a saved cursor. kMismatch when the cursor was saved for a different source
  // (name, size, seed or shuffle differ), kParse when it is malformed.
  Status restore(const Json& cursor);

 private:
  void build_order();

  std::shared_ptr<const TaskSet> source_;
  Options options_;
  std::vector<std::size_t> order_;
  std::uint64_t epoch_ = 0;
  std::size_t index_ = 0;
  std::uint64_t served_ = 0;
};

// Deterministic helpers shared by the procedural tasks and the stream (stable across platforms,
// unlike std::shuffle's distribution).
std::uint64_t splitmix64(std::uint64_t& state);
// Uniform in [0, bound).
std::uint64_t uniform_below(std::uint64_t& state, std::uint64_t bound);
std::vector<std::size_t> seeded_permutation(std::size_t n, std::uint64_t seed);

}  // namespace arlo::rollout
