// THE configuration schema of arlo: every section and key, its type, default, documentation and
// validation. Add keys here (one line each), then run `arlo config-doc --output docs/configuration.md`.
//
// Defaults are sized for the built-in CPU quickstart (a 2-layer, 64-wide policy learning arithmetic on
// a 2-core machine).
#include "config/schema.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "config/config.h"
#include "common/registry.h"
#include "rollout/admin.h"
#include "rollout/environment.h"
#include "rollout/reward.h"
#include "weight_sync/transport.h"

namespace arlo::config {

std::string_view type_name(Type type) {
  switch (type) {
    case Type::kBool: return "bool";
    case Type::kInt: return "int";
    case Type::kFloat: return "float";
    case Type::kString: return "string";
    case Type::kStringList: return "list of strings";
    case Type::kMap: return "map";
    case Type::kObjectList: return "list of objects";
  }
  return "unknown";
}

Key Key::range(double lo, double hi) && {
  min = lo;
  max = hi;
  return std::move(*this);
}
Key Key::at_least(double lo) && {
  min = lo;
  return std::move(*this);
}
Key Key::at_most(double hi) && {
  max = hi;
  return std::move(*this);
}
Key Key::one_of(std::vector<std::string> allowed) && {
  choices = std::move(allowed);
  return std::move(*this);
}
Key Key::must_be_given() && {
  required = true;
  return std::move(*this);
}

namespace {
Key make(std::string name, Type type, Default def, std::string doc) {
  Key key;
  key.name = std::move(name);
  key.type = type;
  key.default_value = std::move(def);
  key.doc = std::move(doc);
  return key;
}
}  // namespace

Key bool_key(std::string name, bool def, std::string doc) {
  return make(std::move(name), Type::kBool, def, std::move(doc));
}
Key int_key(std::string name, std::int64_t def, std::string doc) {
  return make(std::move(name), Type::kInt, def, std::move(doc));
}
Key float_key(std::string name, double def, std::string doc) {
  return make(std::move(name), Type::kFloat, def, std::move(doc));
}
Key string_key(std::string name, std::string def, std::string doc) {
  return make(std::move(name), Type::kString, std::move(def), std::move(doc));
}
Key strings_key(std::string name, std::vector<std::string> def, std::string doc) {
  return make(std::move(name), Type::kStringList, std::move(def), std::move(doc));
}
Key map_key(std::string name, std::string def_yaml, std::string doc) {
  return make(std::move(name), Type::kMap, std::move(def_yaml), std::move(doc));
}
Key objects_key(std::string name, std::vector<Key> item_keys, std::string def_yaml, std::string doc) {
  Key key = make(std::move(name), Type::kObjectList, std::move(def_yaml), std::move(doc));
  key.item_keys = std::move(item_keys);
  return key;
}

const Key* Section::find(std::string_view key) const {
  for (const auto& k : keys) {
    if (k.name == key) return &k;
  }
  return nullptr;
}

Schema::Schema(std::vector<Section> sections, std::vector<Rule> rules, std::vector<FormerKey> former)
    : sections_(std::move(sections)), rules_(std::move(rules)), former_(std::move(former)) {}

const FormerKey* Schema::find_former(std::string_view dotted) const {
  for (const auto& f : former_) {
    if (f.path == dotted) return &f;
  }
  return nullptr;
}

const Section* Schema::find_section(std::string_view name) const {
  for (const auto& s : sections_) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

const Key* Schema::find_key(std::string_view dotted) const {
  const std::size_t dot = dotted.find('.');
  if (dot == std::string_view::npos) return nullptr;
  const Section* section = find_section(dotted.substr(0, dot));
  return section ? section->find(dotted.substr(dot + 1)) : nullptr;
}

namespace {

// One config key from an extension's option (common/option_spec.h), documented as `doc`.
Key key_from_option(const OptionSpec& o, std::string doc) {
  using T = OptionSpec::Type;
  const nlohmann::json& def = o.config_value();
  Key k;
  switch (o.type) {
    case T::kBool: k = bool_key(o.key, def.get<bool>(), std::move(doc)); break;
    case T::kInt: k = int_key(o.key, def.get<std::int64_t>(), std::move(doc)); break;
    case T::kFloat: k = float_key(o.key, def.get<double>(), std::move(doc)); break;
    case T::kString: k = string_key(o.key, def.is_null() ? "" : def.get<std::string>(), std::move(doc)); break;
    case T::kAny: k = map_key(o.key, "{}", std::move(doc)); break;
  }
  if (o.min) k.min = o.min;
  if (o.max) k.max = o.max;
  k.choices = o.choices;
  return k;
}

// Appends the config keys among `options` (those marked user_key()) to `keys`, each documented as
// `doc_prefix` + its doc + `doc_suffix`; a key two extensions share is one config key, documented
// for both.
void add_option_keys(std::vector<Key>& keys, const std::vector<OptionSpec>& options, const std::string& doc_prefix,
                     const std::string& doc_suffix = "") {
  for (const auto& o : options) {
    if (!o.config_key) continue;
    Key k = key_from_option(o, doc_prefix + o.doc + doc_suffix);
    auto same = std::find_if(keys.begin(), keys.end(), [&](const Key& e) { return e.name == k.name; });
    if (same == keys.end())
      keys.push_back(std::move(k));
    else
      same->doc += " " + k.doc;
  }
}

// The shared keys, then every registered transport's own (transports/registry.inc).
Section weight_sync_section() {
  std::vector<std::string> names;
  std::string kinds;
  for (const auto& d : weight_sync::transports()) {
    names.push_back(d.name);
    kinds += (kinds.empty() ? "" : "; ") + d.name + ": " + d.doc;
  }
  Section s{
      "weight_sync",
      "How new weights move from the trainer to every worker (docs/weight-sync.md).",
      {
          string_key("transport", "filesystem", kinds + ".").one_of(names),
          string_key("payload", "full", "full (as trained), cast (to cast_dtype), delta (changed elements only).")
              .one_of({"full", "cast", "delta"}),
          string_key("cast_dtype", "bf16", "cast payload: bf16, or fp8_e4m3 with one fp32 scale per 128 elements.")
              .one_of({"bf16", "fp8_e4m3"}),
          bool_key("zstd", false, "Compress each bucket with zstd (level 1)."),
          int_key("bucket_mb", 256, "Bucket size in MiB; memory on each side stays within model + 2 buckets.")
              .range(1, 65536),
          float_key("delta_density_threshold", 0.25,
                    "delta payload: above this fraction of changed elements a bucket is sent dense.")
              .range(0.0, 1.0),
          int_key("keep_last", 2,
                  "Versions the trainer's publisher keeps staged (durable transports: on disk), at least 2.")
              .range(2, 1 << 20),
          string_key("topology", "star",
                     "star (the trainer serves every worker) or chain (each worker relays to the next, so every "
                     "link carries the stream once; transports that relay).")
              .one_of({"chain", "star"}),
          int_key("relay_port", 0,
                  "chain with external workers (inference.launch external): worker k of inference.urls relays on "
                  "port relay_port + k of its URL's host (0: external workers do not relay; a chain needs it).")
              .range(0, 65535),
          float_key("timeout_s", 120.0, "Deadline for moving one version to a worker.").range(0.001, 86400.0),
          int_key("gather_window_ms", 50,
                  "Streaming transports: once the first worker came for a version, how long the trainer's "
                  "publisher waits for the others before it streams to those present (a late or stopped "
                  "worker gets a later transfer and holds nobody).")
              .range(0, 600000),
      }};
  // A key two transports share (tcp's and nccl's `address`) is one config key, documented for both.
  for (const auto& d : weight_sync::transports()) add_option_keys(s.keys, d.options, d.name + " transport: ", ".");
  return s;
}

Section run_section() {
  return {"run",
          "What this run is called, where it writes, how long it lasts.",
          {
              string_key("name", "quickstart", "Name of the run; shown in logs and used in the default run directory."),
              string_key("dir", "runs/{run.name}",
                         "Run directory: checkpoints, metrics.jsonl, rollouts, weights and logs go here."),
              int_key("seed", 42, "Seed for everything the orchestrator draws at random (task order, sampling seeds).")
                  .at_least(0),
              int_key("max_steps", 150, "Number of training steps (optimizer updates) to run, warm-up included.")
                  .at_least(1),
          }};
}

Section orchestrator_section() {
  return {
      "orchestrator",
      "The asynchronous main loop: batches, groups, in-flight work and the staleness bound.",
      {
          int_key("batch_size", 32, "Samples per training step (a whole number of groups).").range(1, 1 << 20),
          int_key("group_size", 8, "Samples per prompt (one group); advantages are computed within a group.")
              .range(1, 4096),
          int_key("max_inflight", 64, "Most sample requests in flight across all inference workers at once.")
              .range(1, 1 << 20),
          int_key("max_async_level", 1,
                  "How many policy versions rollouts may run ahead of the trainer: rollouts for step s are "
                  "dispatched only while (s - 1) - current_version <= max_async_level. 0 is synchronous RL.")
              .range(0, 1024),
          int_key("max_off_policy_steps", 2,
                  "When the batch for step s is cut, samples whose oldest token came from a version below "
                  "s - 1 - max_off_policy_steps are dropped (time spent queued counts).")
              .range(0, 1 << 20),
          int_key("sft_warmup_steps", 0,
                  "Supervised steps on the tasks' reference answers before RL starts (they count toward "
                  "run.max_steps).")
              .at_least(0),
          int_key("seq_len", 256, "Length in tokens of one packed training sequence.").range(8, 1 << 20),
          int_key("queue_capacity", 256, "Most finished rollouts waiting to be packed into a batch.").range(1, 1 << 24),
          string_key("weight_update_mode", "keep",
                     "How workers take a new version: keep (pause, swap, resume in-flight requests; a "
                     "completion may span versions), wait (let in-flight requests finish, then swap), abort "
                     "(abort in-flight requests and continue them on the new version).")
              .one_of({"keep", "wait", "abort"}),
          string_key("advantage", "grpo",
                     "Advantage estimator within a group: grpo (mean and std), dr_grpo (mean only), rloo "
                     "(leave-one-out mean).")
              .one_of({"grpo", "dr_grpo", "rloo"}),
          bool_key("filter_equal_reward_groups", true,
                   "Drop groups whose rewards are all equal (they carry no learning signal)."),
          int_key("max_filtered_groups_per_step", 0,
                  "Bound on the equal-reward groups dropped (and replaced by new rollouts) for one step; past "
                  "it they are trained on with zero advantage, so a policy that solves (or fails) every task "
                  "still makes progress. 0: 4 x batch_size/group_size.")
              .at_least(0),
          string_key("overlong", "keep",
                     "Completions cut off by sampling.max_tokens: keep (train on them), drop (discard the "
                     "sample), mask (keep it but exclude its tokens from the loss).")
              .one_of({"keep", "drop", "mask"}),
          float_key("length_penalty", 0.0, "Reward subtracted per generated token (0 disables).").range(0.0, 1.0),
      }};
}

Section sampling_section() {
  return {"sampling",
          "How training rollouts are sampled.",
          {
              float_key("temperature", 1.0, "Sampling temperature (0 is greedy).").range(0.0, 10.0),
              float_key("top_p", 1.0, "Nucleus sampling: keep the smallest set of tokens with this total probability.")
                  .range(0.0, 1.0),
              int_key("max_tokens", 16, "Most tokens generated per completion.").range(1, 1 << 20),
              strings_key("stop", {}, "Strings that end a completion (not included in it)."),
              int_key("seed", 0, "Base sampling seed; each request gets a distinct seed derived from it.").at_least(0),
          }};
}

// --- Extensions (common/registry.h): kinds and their keys come from the registries -------------

// "a (doc a), b, c (doc c)": each registered name with its doc when it has one.
template <typename Registry>
std::string names_with_docs(const Registry& entries) {
  std::string out;
  for (const auto& e : entries) out += (out.empty() ? "" : ", ") + e.name + (e.doc.empty() ? "" : " (" + e.doc + ")");
  return out;
}

// The environment kinds that read a file (env.path), as "a or b".
std::string path_kinds() {
  std::vector<std::string> names;
  for (const auto& k : rollout::environment_kinds())
    if (k.needs_path) names.push_back(k.name);
  return join_names(names);
}

std::vector<Key> reward_module_keys();

// env.sources[]: one task source each.
std::vector<Key> source_item_keys() {
  return {
      string_key("kind", "", "The source's environment kind (as env.kind).")
          .one_of(entry_names(rollout::environment_kinds()))
          .must_be_given(),
      string_key("name", "",
                 "Its tasks' env name, by which eval and the step records report it and reward modules are chosen "
                 "(empty: the kind; names are unique)."),
      string_key("path", "", "The dataset, for kinds that read one (as env.path)."),
      int_key("size", 10000, "Tasks generated or used (as env.size; 0: all of a dataset).").at_least(0),
      int_key("seed", 1, "Seed for generating and shuffling its tasks.").at_least(0),
      float_key("ratio", 1.0, "Its share of the tasks is ratio / (sum of the ratios).").range(1e-6, 1e6),
      map_key("options", "{}",
              "The kind's own options by their env.* names without `env.`, e.g. {max_operand: 50} or "
              "{prompt_column: question, answer_column: solution}."),
      objects_key("reward", reward_module_keys(), "[]",
                  "Its own reward modules, each with the keys of a reward.modules item (empty: reward.modules).")
          .range(0, 64),
      map_key("sampling", "{}",
              "Its training rollouts' sampling where it differs from the sampling section: any of temperature, "
              "top_p, max_tokens and stop, e.g. {temperature: 0.7, max_tokens: 512}."),
  };
}

// What an env.sources item's `sampling` map may override, with the sampling section's bounds.
std::vector<OptionSpec> source_sampling_options() {
  return {
      float_option("temperature", nullptr, "Sampling temperature.").range(0.0, 10.0),
      float_option("top_p", nullptr, "Nucleus sampling.").range(0.0, 1.0),
      int_option("max_tokens", nullptr, "Most tokens per completion.").range(1, 1 << 20),
      any_option("stop", "Strings that end a completion.").checked_by([](const nlohmann::json& v) -> std::string {
        if (v.is_array() && std::all_of(v.begin(), v.end(), [](const auto& x) { return x.is_string(); })) return "";
        return "must be a list of strings";
      }),
  };
}

Section env_section() {
  Section s{
      "env",
      "Where training tasks come from.",
      {
          string_key("kind", "arithmetic", "Task source: " + names_with_docs(rollout::environment_kinds()) + ".")
              .one_of(entry_names(rollout::environment_kinds())),
          string_key("path", "",
                     path_kinds() + " only: the dataset (jsonl: one object per line with prompt or messages, "
                                    "answer, info; the others' columns: env.prompt_column and the rest)."),
          int_key("seed", 1, "Seed for generating and shuffling tasks.").at_least(0),
          int_key("size", 10000, "Number of tasks generated (procedural kinds) or used (jsonl; 0 means all).")
              .at_least(0),
          bool_key("shuffle", true, "Shuffle the tasks each epoch."),
          objects_key("sources", source_item_keys(), "[]",
                      "Several task sources in one run, served in the ratio of their `ratio`s, which holds exactly "
                      "over time (each source within one task of its share); they replace env.kind, path, size, "
                      "seed and the kinds' env.* keys (env.shuffle applies to each). Empty: the one source of "
                      "env.kind (docs/environments.md, Several sources).")
              .range(0, 64),
          int_key("max_turns", 8, "Multi-turn kinds: model turns per trajectory at most (then it ends, finish length).")
              .at_least(1),
          int_key("max_trajectory_tokens", 1024,
                  "Multi-turn kinds: the model's and the environment's tokens after the prompt at most (then the "
                  "trajectory ends, finish length).")
              .at_least(1),
          float_key("step_timeout_s", 30.0,
                    "Multi-turn kinds: deadline for one environment call (reset, or step with its tokenizing); a "
                    "missed one fails that sample (env_timeout).")
              .range(0.001, 86400.0),
      }};
  for (const auto& k : rollout::environment_kinds()) add_option_keys(s.keys, k.options, k.name + ": ");
  return s;
}

// eval.env_kind: same, or a registered environment kind.
std::vector<std::string> eval_env_kinds() {
  std::vector<std::string> kinds = {"same"};
  for (const auto& k : rollout::environment_kinds()) kinds.push_back(k.name);
  return kinds;
}

Section eval_section() {
  return {
      "eval",
      "Periodic evaluation on held-out tasks: avg@k and pass@k.",
      {
          int_key("interval", 10, "Evaluate at start and every this many steps (0 disables).").at_least(0),
          int_key("k", 4, "Samples per eval task (pass@k, avg@k).").range(1, 1024),
          strings_key("pass_k", {},
                      "The k of each pass@k reported, e.g. [1, 4]; each in 1..eval.k (empty: 1 and eval.k)."),
          float_key("correct_threshold", 1.0, "A sample with reward >= this counts as correct for pass@k."),
          int_key("size", 64, "Number of eval tasks.").range(1, 1 << 20),
          float_key("temperature", 1.0, "Sampling temperature for eval.").range(0.0, 10.0),
          string_key("env_kind", "same",
                     "Eval task source: same (the training kind and settings with eval.seed), or one of " +
                         join_names(entry_names(rollout::environment_kinds()), ", ") + ".")
              .one_of(eval_env_kinds()),
          string_key("env_path", "", path_kinds() + " eval only: the dataset."),
          int_key("seed", 7, "Seed for the eval tasks (differs from env.seed so eval tasks are held out).").at_least(0),
      }};
}

// reward.modules[]: kind and weight, the registered kinds' own keys (path, url, pattern, ...), config.
std::vector<Key> reward_module_keys() {
  std::vector<std::string> kinds;
  std::string kinds_doc, options_doc;
  for (const auto& k : rollout::reward_kinds()) {
    if (!k.in_config) continue;
    kinds.push_back(k.name);
    kinds_doc += (kinds_doc.empty() ? "" : "; ") + k.name + ": " + k.doc;
    // Options in `config` (a kind that takes `config` whole hands it on as is).
    if (std::any_of(k.options.begin(), k.options.end(), [](const auto& o) { return o.key == "config"; })) continue;
    std::string own;
    for (const auto& o : k.options)
      if (!o.config_key)
        own += (own.empty() ? "" : ", ") + o.key + " (" + std::string(arlo::type_name(o.type)) + ", " +
               o.default_value.dump() + ": " + o.doc + ")";
    if (!own.empty()) options_doc += (options_doc.empty() ? "" : "; ") + k.name + ": " + own;
  }
  std::vector<Key> keys = {
      string_key("kind", "exact_match", kinds_doc + ".").one_of(kinds).must_be_given(),
      float_key("weight", 1.0, "Weight of this module in the sum.").range(-1e6, 1e6),
  };
  for (const auto& k : rollout::reward_kinds())
    if (k.in_config) add_option_keys(keys, k.options, k.name + ": ");
  keys.push_back(map_key("config", "{}",
                         "Free-form settings handed to the module (plugins get it as JSON). The built-ins' options: " +
                             options_doc + "."));
  return keys;
}

Section reward_section() {
  return {"reward",
          "How rollouts are scored: a weighted sum of reward modules.",
          {
              objects_key("modules", reward_module_keys(), "[{kind: exact_match, weight: 1.0}]",
                          "Reward modules; the reward is sum(weight * score).")
                  .range(1, 64),
              float_key("timeout_s", 10.0, "Deadline for scoring one rollout (or group).").range(0.001, 3600.0),
              string_key("on_failure", "assign",
                         "When a module fails, times out or returns a non-finite value: assign failure_value, drop "
                         "the sample, or fail the run.")
                  .one_of({"assign", "drop", "fail"}),
              float_key("failure_value", 0.0, "Reward assigned when on_failure is assign.").range(-1e6, 1e6),
          }};
}

Section inference_section() {
  Section s{
      "inference",
      "The inference workers that generate rollouts.",
      {
          string_key("launch", "embedded",
                     "embedded: arlo starts the servers on free loopback ports (arlo-worker for inference.kind arlo, "
                     "`vllm serve` from the project's Python for vllm), waits for their /health and restarts one "
                     "that dies; external: connect to inference.urls.")
              .one_of({"embedded", "external"}),
          string_key("kind", "arlo",
                     "Server dialect for admin calls: " + names_with_docs(rollout::admin_dialects()) + ".")
              .one_of(entry_names(rollout::admin_dialects())),
          int_key("num_workers", 2, "embedded: number of servers arlo starts.").range(1, 1024),
          string_key("model", "",
                     "embedded vllm: the Hugging Face model directory each vLLM server loads (empty: trainer.model)."),
          strings_key("server_args", {},
                      "embedded vllm: more flags for each server, after the ones arlo sets (--model, "
                      "--served-model-name, --host, --port, --seed and arlo's weight-transfer backend), e.g. "
                      "[--dtype, float32, --max-model-len, \"512\", --enforce-eager] on a CPU."),
          float_key("start_timeout_s", 120.0,
                    "embedded: how long arlo run waits for every server it started to answer /health before it "
                    "gives up (vLLM on a CPU needs 30-90 s).")
              .range(1.0, 86400.0),
          strings_key("urls", {}, "external: base URLs of the servers (http://host:port)."),
          float_key("request_timeout_s", 120.0, "Deadline for one completion request.").range(0.001, 86400.0),
          float_key("admin_timeout_s", 30.0, "Deadline for one admin call (pause, weights, resume).")
              .range(0.001, 3600.0),
          float_key("health_timeout_s", 2.0,
                    "Deadline for one health check of a server (GET /health, every 2 s); a check that gets no "
                    "answer in it counts as a failure.")
              .range(0.01, 600.0),
          bool_key("failover_on_silence", true,
                   "A health check that gets no answer at all (not a refusal or an error status) while the server "
                   "holds requests, none of them answered since the check started, opens its circuit at once: its "
                   "requests move to other servers and weight updates leave it out until it answers (a dark link "
                   "or a hung host). false: only failed checks in a row do (3, each waiting out "
                   "health_timeout_s). A slow server that answers its requests is never cut off by this."),
          int_key("threads", 1, "embedded: compute threads per worker.").range(1, 1024),
      }};
  for (const auto& d : rollout::admin_dialects()) add_option_keys(s.keys, d.options, d.name + ": ");
  return s;
}

Section model_section() {
  return {"model",
          "The built-in policy (arlo-worker, arlo-trainer). The vocabulary comes from the tokenizer.",
          {
              int_key("layers", 2, "Transformer layers.").range(1, 256),
              int_key("hidden", 64, "Model width.").range(8, 65536),
              int_key("heads", 4, "Attention heads (must divide hidden).").range(1, 1024),
              int_key("context", 256, "Longest sequence (prompt + completion) in tokens.").range(8, 1 << 20),
              int_key("seed", 0, "Seed for the initial weights.").at_least(0),
          }};
}

Section trainer_section() {
  return {
      "trainer",
      "The trainer that learns from rollouts and publishes new weights.",
      {
          string_key("launch", "embedded",
                     "embedded: arlo starts arlo-trainer; external: a trainer you start connects through the "
                     "bridge; command: arlo starts trainer.command (your trainer) with the bridge address, run "
                     "dir, weight-sync block and model shape in its environment (docs/bring-your-own-trainer.md); "
                     "hf: arlo starts its reference trainer for the Hugging Face model in trainer.model "
                     "(examples/hf_trainer/train.py on arlo.hf_trainer, FSDP2 over trainer.num_ranks ranks) in the "
                     "project's Python environment.")
              .one_of({"embedded", "external", "command", "hf"}),
          string_key("model", "",
                     "hf: the causal LM to train, a Hugging Face model directory (config.json, safetensors, "
                     "tokenizer), e.g. one scripts/make-tiny-model made."),
          int_key("warmup_steps", 0, "hf: the learning rate rises linearly from 0 over this many steps.")
              .range(0, 1 << 30),
          int_key("max_tokens_per_micro_batch", 4096,
                  "hf: samples are packed into micro-batches of at most this many tokens; gradients accumulate "
                  "over the step's micro-batches (the update does not depend on it).")
              .range(1, 1 << 30),
          string_key("python", "",
                     "hf: the Python interpreter that runs the reference trainer (empty: $ARLO_PYTHON, else the "
                     "environment `scripts/bootstrap --python` makes in the source tree)."),
          strings_key("command", {},
                      "command: the argv of your trainer, e.g. [/usr/bin/python3, examples/pytorch_trainer/train.py]; "
                      "started in the directory arlo run is started in (relative paths are relative to it), "
                      "stopped with SIGTERM when the run ends."),
          int_key("num_ranks", 1,
                  "command, hf and external: the trainer's data-parallel ranks. The bridge splits each step's "
                  "batch over them (balanced by tokens); arlo run starts the trainer once per rank with ARLO_RANK, "
                  "ARLO_NUM_RANKS and torch.distributed's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in its "
                  "environment. The ranks are one group: when one exits or is killed, arlo run stops the "
                  "others and starts all again (fresh MASTER_PORT; one restart under the supervisor's limits) "
                  "where the trainer resumes (hf with checkpoints on, command with trainer.ckpt_interval > 0), "
                  "else the run stops naming the rank and its exit status. The built-in trainer is one rank.")
              .range(1, 1024),
          float_key("lr", 1e-3, "AdamW learning rate.").range(0.0, 10.0),
          float_key("sft_lr", 0.0,
                    "Learning rate on the supervised warm-up batches (orchestrator.sft_warmup_steps); 0 uses lr. "
                    "Supervised steps tolerate a rate that makes policy-gradient steps diverge.")
              .range(0.0, 10.0),
          float_key("weight_decay", 0.0, "AdamW weight decay.").range(0.0, 10.0),
          float_key("beta1", 0.9, "AdamW beta1.").range(0.0, 0.999999),
          float_key("beta2", 0.999, "AdamW beta2.").range(0.0, 0.999999),
          float_key("max_grad_norm", 1.0, "Clip the gradient norm to this (0 disables).").range(0.0, 1e6),
          string_key("is_correction", "token_tis",
                     "Importance-sampling correction for the mismatch between inference and trainer logprobs: "
                     "none, token_tis (per-token ratio truncated at is_high), seq_tis (per-sequence), token_mis "
                     "(mask tokens whose ratio is outside [is_low, is_high]).")
              .one_of({"none", "token_tis", "seq_tis", "token_mis"}),
          float_key("is_low", 0.5, "Lower importance-ratio bound (token_mis).").range(0.0, 1e6),
          float_key("is_high", 2.0, "Upper importance-ratio bound (truncation or mask).").range(0.0, 1e6),
          float_key("accept_timeout_s", 3600.0,
                    "Deadline for the trainer to accept one batch (back-pressure included); past it the run stops "
                    "with an error naming the step. 0: no deadline.")
              .range(0.0, 1e7),
          float_key("alarm_s", 60.0,
                    "While the trainer has not accepted a batch, or has not been heard from (silence_timeout_s), "
                    "a warning every this many seconds. 0: none.")
              .range(0.0, 1e7),
          float_key("silence_timeout_s", 600.0,
                    "How long the run waits for a trainer it has not heard from (it heartbeats every second over "
                    "the socket bridge; silence: its host is unreachable, or it is stopped or gone), once it was "
                    "heard from; past it the run stops with an error naming the trainer and this key. 0: wait for "
                    "it as long as it takes (a warning every alarm_s). A dir bridge trainer that writes no "
                    "heartbeats is never timed.")
              .range(0.0, 1e7),
          int_key("ckpt_interval", 0,
                  "Steps between trainer checkpoints (weights and optimizer); 0: ckpt.interval, so that "
                  "`arlo run --resume` finds the trainer at the orchestrator's step. The trainer also "
                  "checkpoints when it stops. trainer.launch command: > 0 says your trainer checkpoints before "
                  "each ack and resumes, so arlo run restarts it after a crash (else its exit stops the run).")
              .at_least(0),
          int_key("threads", 1, "Compute threads of the built-in trainer.").range(1, 1024),
      }};
}

Section bridge_section() {
  return {
      "bridge",
      "How batches travel from the orchestrator to the trainer.",
      {
          string_key("transport", "dir",
                     "dir: safetensors files under <run.dir>/rollouts/ (written then renamed); socket: streamed with "
                     "acknowledgement and back-pressure.")
              .one_of({"dir", "socket"}),
          string_key("address", "127.0.0.1:0",
                     "socket transport: host:port the orchestrator listens on (port 0: any free port)."),
          int_key("max_pending_batches", 2, "Batches handed over but not yet acknowledged before the sink waits.")
              .range(1, 1024),
      }};
}

Section log_section() {
  return {"log",
          "Console and file logging.",
          {
              string_key("level", "info", "Log level.").one_of({"trace", "debug", "info", "warn", "error", "off"}),
              string_key("file", "", "Also append logs to this file (empty: console only)."),
              float_key("interval_s", 10.0, "Seconds between pipeline views (in flight, queued, event-loop lag).")
                  .range(0.1, 86400.0),
              bool_key("progress", true, "Show a progress bar and ETA toward run.max_steps when stdout is a terminal."),
              float_key("step_interval_s", 2.0,
                        "At most one step line per this many seconds on the console (the first and last step and the "
                        "first of each phase always print; metrics.jsonl has every step). 0: every step.")
                  .range(0.0, 86400.0),
              int_key("rollouts_every", 10,
                      "rollouts.jsonl in the run dir: every n-th scored train group, its prompt and each sample's "
                      "completion, reward, module scores, versions and worker (the W&B monitor's table). 0: none.")
                  .at_least(0),
          }};
}

Section ckpt_section() {
  return {"ckpt",
          "Orchestrator checkpoints for `arlo run --resume`.",
          {
              int_key("interval", 50, "Steps between orchestrator checkpoints (0 disables).").at_least(0),
          }};
}

Section status_section() {
  return {"status",
          "The status server: the live run page at /, Prometheus /metrics, /api/records, /api/status.",
          {
              string_key("bind", "127.0.0.1", "Address the status server listens on."),
              int_key("port", 0, "Port of the status server (0: any free port, logged at start).").range(0, 65535),
              float_key("linger_s", 3.0,
                        "Seconds the status server stays up after the run ends, so the live page and scrapers see the "
                        "end (the final records and finished).")
                  .range(0.0, 3600.0),
          }};
}

Section security_section() {
  return {"security",
          "The run's token (docs/reliability.md, Security model). Without one `arlo run` makes one per run "
          "(written to <run.dir>/token, mode 0600) and gives it to the workers and the trainer it starts.",
          {
              string_key("token", "",
                         "The token every plane of the run wants (bearer on HTTP, challenge-response on the bridge and "
                         "the tcp weight publisher). Prefer token_file: a config file is easily shared."),
              string_key("token_file", "", "File holding the token (surrounding whitespace ignored)."),
          }};
}

Section gateway_section() {
  return {
      "gateway",
      "The policy gateway (docs/environments.md): an OpenAI-compatible endpoint that agent programs use as "
      "their model; each call goes through the run's workers and is recorded into the trajectory it names.",
      {
          bool_key("enabled", false, "Serve the gateway (on whenever agent_url is set)."),
          string_key("bind", "127.0.0.1",
                     "Address the gateway listens on; off loopback it needs the run's token (security)."),
          int_key("port", 0, "Port of the gateway (0: any free port, logged at start).").range(0, 65535),
          string_key("agent_url", "",
                     "The agent program's URL: each trajectory of an agent task is POSTed there ({task, trajectory, "
                     "base_url, api_key, sampling}) and closed by its answer {\"reward\": r}."),
          strings_key("envs", {},
                      "Task environments the agent program drives (empty: every task, when agent_url is set)."),
          float_key("agent_timeout_s", 600.0,
                    "How long the program may take for one trajectory when its group has no deadline of its own.")
              .range(0.001, 86400.0),
          float_key("call_timeout_s", 0.0,
                    "How long one model call through the gateway may take (0: up to its trajectory's deadline); a "
                    "call past it gets a 504 naming the trajectory, is counted, and the trajectory goes on.")
              .range(0.0, 86400.0),
      }};
}

Section monitors_section() {
  return {"monitors",
          "Where else the run's records go: Weights & Biases and TensorBoard, through their own clients in a "
          "helper process each (python/arlo_monitor.py, under the project's Python environment). A monitor that "
          "fails costs a warning and a restart, never the run (docs/watching-a-run.md).",
          {
              strings_key("use", {}, "The monitors to run: wandb, tensorboard (none by default)."),
              string_key("python", "",
                         "The monitors' Python interpreter, with wandb and tensorboard installed (empty: $ARLO_PYTHON, "
                         "else the environment `scripts/bootstrap --python` makes in the source tree)."),
              string_key("wandb_project", "arlo", "wandb: the W&B project."),
              string_key("wandb_entity", "", "wandb: the W&B entity (team or user; empty: your default)."),
              string_key("wandb_name", "{run.name}", "wandb: the W&B run's display name."),
              string_key("wandb_mode", "online",
                         "wandb: online (needs WANDB_API_KEY or `wandb login`), or offline (files only; upload "
                         "later with `wandb sync`).")
                  .one_of({"online", "offline"}),
              strings_key("wandb_tags", {}, "wandb: tags of the W&B run."),
              string_key("wandb_dir", "{run.dir}", "wandb: where the client keeps its files (a wandb/ folder in it)."),
              string_key("tensorboard_dir", "{run.dir}/tensorboard",
                         "tensorboard: the log dir of the event files (tensorboard --logdir DIR)."),
          }};
}

// Every section, in the order of docs/configuration.md.
std::vector<Section> product_sections() {
  return {run_section(),         orchestrator_section(), sampling_section(), env_section(),     eval_section(),
          reward_section(),      inference_section(),    model_section(),    trainer_section(), bridge_section(),
          weight_sync_section(), log_section(),          ckpt_section(),     status_section(),  security_section(),
          gateway_section(),     monitors_section()};
}

// --- Rules between keys ---------------------------------------------------------------------------

void batch_is_whole_groups(const Config& c, std::vector<Violation>& out) {
  const auto batch = c.integer("orchestrator.batch_size");
  const auto group = c.integer("orchestrator.group_size");
  if (batch % group != 0) {
    out.push_back({c.where("orchestrator.batch_size"), "orchestrator.batch_size (" + std::to_string(batch) +
                                                           ") must be a multiple of orchestrator.group_size (" +
                                                           std::to_string(group) + ")"});
  }
}

void kind_needs_path(const Config& c, std::vector<Violation>& out) {
  for (const auto& k : rollout::environment_kinds()) {
    const std::string used = c.string("env.kind") == k.name ? "env.kind" : "eval.env_kind";
    for (const auto& o : k.options)  // the kind's keys that must be given (the http kind's env.url)
      if (o.required && o.config_key && c.string(used) == k.name && c.string("env." + o.key).empty())
        out.push_back({c.where(used), "env." + o.key + " is required when " + used + " is " + k.name});
    if (!k.needs_path) continue;
    if (c.string("env.kind") == k.name && c.string("env.path").empty())
      out.push_back({c.where("env.kind"), "env.path is required when env.kind is " + k.name});
    if (c.string("eval.env_kind") == k.name && c.string("eval.env_path").empty())
      out.push_back({c.where("eval.env_kind"), "eval.env_path is required when eval.env_kind is " + k.name});
  }
}

void pass_k_within_samples(const Config& c, std::vector<Violation>& out) {
  const auto n = c.integer("eval.k");
  for (const auto& k : c.strings("eval.pass_k")) {
    char* end = nullptr;
    const long long v = std::strtoll(k.c_str(), &end, 10);
    if (k.empty() || *end != '\0' || v < 1 || v > n) {
      out.push_back({c.where("eval.pass_k"),
                     "eval.pass_k: '" + k + "' is not an integer in 1..eval.k (" + std::to_string(n) + ")"});
    }
  }
}

}  // namespace

nlohmann::json option_value(const Config& config, std::string_view dotted, OptionSpec::Type type) {
  switch (type) {
    case OptionSpec::Type::kBool: return config.boolean(dotted);
    case OptionSpec::Type::kInt: return config.integer(dotted);
    case OptionSpec::Type::kFloat: return config.number(dotted);
    case OptionSpec::Type::kString: return config.string(dotted);
    case OptionSpec::Type::kAny: return config.map(dotted);
  }
  return nullptr;
}

namespace {

// Each environment kind's own check of its env.* keys, whatever env.kind is (eval may use the kind).
void environment_checks(const Config& c, std::vector<Violation>& out) {
  for (const auto& k : rollout::environment_kinds()) {
    if (!k.check) continue;
    nlohmann::json options = nlohmann::json::object();
    for (const auto& o : k.options) options[o.key] = option_value(c, "env." + o.key, o.type);
    const auto [key, what] = k.check(options);
    if (!key.empty()) out.push_back({c.where("env." + key), "env." + key + " " + what});
  }
}

void external_inference_needs_urls(const Config& c, std::vector<Violation>& out) {
  const bool external = c.string("inference.launch") == "external";
  if (external && c.strings("inference.urls").empty()) {
    out.push_back(
        {c.where("inference.launch"), "inference.urls must list the servers when inference.launch is external"});
  }
  const auto& kind = c.string("inference.kind");
  if (!external && kind != "arlo" && kind != "vllm") {
    out.push_back(
        {c.where("inference.kind"),
         "inference.kind " + kind + " needs inference.launch: external (arlo launches arlo-worker and vLLM)"});
  }
  if (!external && kind == "vllm" && c.string("inference.model").empty() && c.string("trainer.model").empty()) {
    out.push_back({c.where("inference.launch"),
                   "inference.model (or trainer.model) must name the model directory when arlo launches vLLM"});
  }
}

void heads_divide_hidden(const Config& c, std::vector<Violation>& out) {
  if (c.integer("model.hidden") % c.integer("model.heads") != 0) {
    out.push_back({c.where("model.heads"), "model.heads must divide model.hidden"});
  }
}

void is_bounds_ordered(const Config& c, std::vector<Violation>& out) {
  if (c.number("trainer.is_low") >= c.number("trainer.is_high")) {
    out.push_back({c.where("trainer.is_low"), "trainer.is_low must be below trainer.is_high"});
  }
}

void command_trainer_needs_command(const Config& c, std::vector<Violation>& out) {
  if (c.string("trainer.launch") == "command" && c.strings("trainer.command").empty()) {
    out.push_back(
        {c.where("trainer.launch"),
         "trainer.command must give the trainer's argv (e.g. [/usr/bin/python3, train.py]) when trainer.launch "
         "is command"});
  }
}

void hf_trainer_needs_a_model(const Config& c, std::vector<Violation>& out) {
  if (c.string("trainer.launch") != "hf") return;
  const auto& model = c.string("trainer.model");
  if (model.empty()) {
    out.push_back({c.where("trainer.launch"),
                   "trainer.model must name a Hugging Face model directory when trainer.launch is hf"});
  } else if (std::error_code ec; !std::filesystem::is_regular_file(std::filesystem::path(model) / "config.json", ec)) {
    out.push_back({c.where("trainer.model"),
                   "trainer.model " + model + " is not a Hugging Face model directory (no config.json in it)"});
  }
}

void embedded_trainer_is_one_rank(const Config& c, std::vector<Violation>& out) {
  if (c.string("trainer.launch") == "embedded" && c.integer("trainer.num_ranks") != 1) {
    out.push_back({c.where("trainer.num_ranks"),
                   "trainer.num_ranks is " + std::to_string(c.integer("trainer.num_ranks")) +
                       ", but the built-in trainer (trainer.launch: embedded) is one rank; data parallel needs "
                       "trainer.launch command or external"});
  }
}

// The map `key` of item `m` (named `name`) as options of `declared`: known, of their type, within
// their bounds and choices, and passing their checks. The options resolved (defaults filled in), or
// nullopt when something is wrong (each problem in `out`, as "<name>.<key>.<option>: what").
std::optional<nlohmann::json> checked_options(const Config& m, const std::string& key,
                                              const std::vector<OptionSpec>& declared, const std::string& name,
                                              std::vector<Violation>& out) {
  const nlohmann::json& given = m.map(key);
  auto resolved = resolve_options(name + "." + key, declared, given, {});
  if (!resolved) {
    out.push_back({m.where(key), resolved.error().message()});
    return std::nullopt;
  }
  const std::size_t before = out.size();
  for (const auto& o : declared)
    if (given.is_object() && given.contains(o.key))
      if (const std::string what = check_option_value(o, given[o.key]); !what.empty())
        out.push_back({m.where(key), name + "." + key + "." + o.key + ": " + what});
  if (out.size() != before) return std::nullopt;
  return *resolved;
}

// The options a built-in kind reads from a reward.modules item's `config` map (a plugin's map is its own).
void reward_config_options(const Config& m, const rollout::RewardKind& kind, const std::string& name,
                           std::vector<Violation>& out) {
  if (std::any_of(kind.options.begin(), kind.options.end(), [](const auto& o) { return o.key == "config"; })) return;
  (void)checked_options(m, "config", kind.options, name, out);
}

// Each item of a list of reward modules (reward.modules, env.sources[i].reward, named `list`) gives
// the keys its kind requires, with values its kind accepts.
void check_reward_modules(const std::vector<Config>& modules, const std::string& list, std::vector<Violation>& out) {
  for (std::size_t i = 0; i < modules.size(); ++i) {
    const Config& m = modules[i];
    const std::string name = list + "[" + std::to_string(i) + "]";
    const std::string& kind_name = m.string("kind");
    const rollout::RewardKind* kind = find_entry(rollout::reward_kinds(), kind_name);
    if (!kind) continue;  // the loader already refused it (not one of kind's choices)
    for (const auto& o : kind->options) {
      if (!o.config_key || o.type != OptionSpec::Type::kString) continue;
      if (o.required && m.string(o.key).empty())
        out.push_back({m.where("kind"), name + ": kind " + kind_name + " needs '" + o.key + "'"});
      if (!o.check) continue;
      if (const std::string what = o.check(m.string(o.key)); !what.empty())
        out.push_back({m.where(o.key), name + "." + o.key + ": " + what});
    }
    reward_config_options(m, *kind, name, out);
  }
}

void reward_modules_complete(const Config& c, std::vector<Violation>& out) {
  check_reward_modules(c.objects("reward.modules"), "reward.modules", out);
}

// An env.sources item's options: as checked_options, the ones its kind requires given (as the
// env.* keys it requires: verifiers_env, url), then the kind's own check across them.
void source_options(const Config& s, const rollout::EnvironmentKind& kind, const std::string& item,
                    std::vector<Violation>& out) {
  const nlohmann::json& given = s.map("options");
  for (const auto& o : kind.options) {
    if (!o.required || !o.config_key) continue;
    const bool missing = !given.is_object() || !given.contains(o.key) ||
                         (given[o.key].is_string() && given[o.key].get<std::string>().empty());
    if (missing)
      out.push_back({s.where("kind"), item + ".options." + o.key + " is required when its kind is " + kind.name});
  }
  const auto resolved = checked_options(s, "options", kind.options, item, out);
  if (!resolved || !kind.check) return;
  if (const auto [key, what] = kind.check(*resolved); !key.empty())
    out.push_back({s.where("options"), item + ".options." + key + " " + what});
}

// Each env.sources item: a path where its kind reads a dataset, options its kind accepts, its own
// reward modules complete, and a name no other source has.
void sources_complete(const Config& c, std::vector<Violation>& out) {
  const auto& sources = c.objects("env.sources");
  std::vector<std::string> names;
  for (std::size_t i = 0; i < sources.size(); ++i) {
    const Config& s = sources[i];
    const std::string item = "env.sources[" + std::to_string(i) + "]";
    const rollout::EnvironmentKind* kind = find_entry(rollout::environment_kinds(), s.string("kind"));
    if (!kind) continue;  // the loader already refused it
    if (kind->needs_path && s.string("path").empty())
      out.push_back({s.where("kind"), item + ".path is required when its kind is " + kind->name});
    source_options(s, *kind, item, out);
    (void)checked_options(s, "sampling", source_sampling_options(), item, out);
    const std::string name = s.string("name").empty() ? kind->name : s.string("name");
    if (auto same = std::find(names.begin(), names.end(), name); same != names.end())
      out.push_back({s.where("name"), item + ".name: '" + name + "' is also env.sources[" +
                                          std::to_string(same - names.begin()) +
                                          "]'s name; give each source its own name"});
    names.push_back(name);
    check_reward_modules(s.objects("reward"), item + ".reward", out);
  }
}

// monitors.use names known monitors, each once.
void monitors_known(const Config& c, std::vector<Violation>& out) {
  std::vector<std::string> seen;
  for (const auto& m : c.strings("monitors.use")) {
    if (m != "wandb" && m != "tensorboard")
      out.push_back({c.where("monitors.use"), "monitors.use: unknown monitor '" + m + "' (wandb, tensorboard)"});
    else if (std::find(seen.begin(), seen.end(), m) != seen.end())
      out.push_back({c.where("monitors.use"), "monitors.use: '" + m + "' is given twice"});
    seen.push_back(m);
  }
}

// The rules' docs that name registered kinds.
std::string path_rule_doc() {
  const std::string kinds = path_kinds();
  std::string required;
  for (const auto& k : rollout::environment_kinds())
    for (const auto& o : k.options)
      if (o.required && o.config_key)
        required += " env." + o.key + " is given when env.kind or eval.env_kind is " + k.name + ".";
  return "env.path is given when env.kind is " + kinds + "; eval.env_path when eval.env_kind is " + kinds + "." +
         required;
}
std::string environment_checks_doc() {
  std::string doc;
  for (const auto& k : rollout::environment_kinds())
    if (k.check) doc += (doc.empty() ? "" : " ") + k.check_doc;
  return doc;
}
std::string reward_rule_doc() {
  std::string needs;
  for (const auto& k : rollout::reward_kinds())
    for (const auto& o : k.options)
      if (k.in_config && o.config_key && (o.required || o.check))
        needs += (needs.empty() ? "" : ", ") + k.name + " a " + (o.check ? "valid " : "") + o.key;
  return "reward modules give what their kind needs: " + needs + ".";
}

std::vector<Rule> product_rules() {
  return {
      {"orchestrator.batch_size is a multiple of orchestrator.group_size.", batch_is_whole_groups},
      {path_rule_doc(), kind_needs_path},
      {"Each eval.pass_k is an integer in 1..eval.k.", pass_k_within_samples},
      {environment_checks_doc(), environment_checks},
      {"inference.urls is not empty when inference.launch is external; embedded launch means inference.kind arlo, or "
       "vllm with a model.",
       external_inference_needs_urls},
      {"model.heads divides model.hidden.", heads_divide_hidden},
      {"trainer.is_low < trainer.is_high.", is_bounds_ordered},
      {"trainer.command is not empty when trainer.launch is command.", command_trainer_needs_command},
      {"trainer.num_ranks is 1 when trainer.launch is embedded.", embedded_trainer_is_one_rank},
      {"trainer.model is a Hugging Face model directory when trainer.launch is hf.", hf_trainer_needs_a_model},
      {reward_rule_doc(), reward_modules_complete},
      {"Each env.sources item has a path when its kind reads a dataset, options its kind accepts (as its env.* keys; "
       "the ones it requires given, e.g. verifiers_env), "
       "its own reward modules complete, and a name (or kind) no other source has.",
       sources_complete},
      {"monitors.use names wandb or tensorboard, each at most once.", monitors_known},
  };
}

}  // namespace

namespace {

// Keys renamed or retired in this release; each goes in the next one.
std::vector<FormerKey> former_keys() {
  return {
      {"ckpt.keep", "",
       "the orchestrator keeps one checkpoint (checkpoint.json, replaced atomically at every batch cut) and its "
       "batch journal; the trainer's checkpoints are its own (trainer.ckpt_interval)"},
  };
}

}  // namespace

const Schema& product_schema() {
  static const Schema schema(product_sections(), product_rules(), former_keys());
  return schema;
}

}  // namespace arlo::config
