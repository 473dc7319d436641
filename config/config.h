#pragma once
// Loading, validating and reading an arlo configuration (YAML, checked against config/schema.h).
//
//   ARLO_ASSIGN_OR_RETURN(config::Config cfg, config::load_file("configs/quickstart.yaml", {"run.max_steps=5"}));
//   int64_t batch = cfg.integer("orchestrator.batch_size");
//
// Loading collects EVERY problem (malformed YAML, unknown keys with the nearest known key suggested,
// wrong types, out-of-range or not-allowed values, broken cross-key rules), each citing
// `file:line:column` (1-based) or the `--set a.b=value` it came from. Defaults fill every key the user
// left out, so a loaded Config holds a value for every declared key.
//
// Value rules (documented in docs/configuration.md):
//   - `${VAR}` in any scalar value is replaced by the environment variable VAR (an error when unset);
//     `${VAR:-fallback}` uses fallback when VAR is unset or empty; `$${` is a literal `${`.
//   - A key with no value (`key:` or `~`) means: empty string, empty list, empty map; it is an error
//     for bool, int and float keys.
//   - Booleans are `true` / `false`; integers are decimal or 0x-hex and must fit in 64 bits; floats
//     must be finite; numbers written in quotes are strings, not numbers.
//
// Thread-safety: a Config is immutable and cheap to copy (shared state); any thread may read it.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/schema.h"
#include "common/result.h"

namespace arlo::config {

// One problem found while loading: where it is and what is wrong.
struct Diagnostic {
  std::string where;    // "configs/x.yaml:3:5", "--set orchestrator.batch_size=0", "default"
  std::string message;  // "orchestrator.batchsize: unknown key (did you mean 'batch_size'?)"
  std::string text() const { return where + ": " + message; }
};

// Looks up an environment variable; nullopt when unset. The default reads the process environment.
using EnvLookup = std::function<std::optional<std::string>(std::string_view name)>;
EnvLookup process_env();

struct LoadOptions {
  // "section.key=value" strings; value is parsed as YAML and checked like file input. Applied in
  // order after the file, so a later --set wins.
  std::vector<std::string> overrides;
  EnvLookup env = process_env();
  const Schema* schema = nullptr;  // nullptr: product_schema()
};

class Config {
 public:
  // Typed getters by dotted path ("orchestrator.batch_size"; inside an object list item just the
  // key, "weight"). For a key the schema declares with that type they cannot fail; asking for an
  // undeclared key or with the wrong type is a programming error and aborts with a message naming
  // the key.
  std::int64_t integer(std::string_view path) const;
  double number(std::string_view path) const;  // float keys
  bool boolean(std::string_view path) const;
  const std::string& string(std::string_view path) const;
  const std::vector<std::string>& strings(std::string_view path) const;
  // A free-form map key, as a JSON object (scalars typed as YAML resolves them).
  const nlohmann::json& map(std::string_view path) const;
  // A list-of-objects key: one Config per item, read with the item's keys ("kind", "weight").
  const std::vector<Config>& objects(std::string_view path) const;

  // Whether `path` is a declared key of this config (or item).
  bool has(std::string_view path) const;
  // Where the value of `path` came from: "configs/x.yaml:3:5", "--set a.b=1", or "default".
  // Use it to cite the user's line in errors found later ("reward.modules[0].path: no such file").
  std::string where(std::string_view path) const;
  // True when the user gave `path` (in the file or with --set) rather than leaving the default.
  bool is_set(std::string_view path) const;

  // The resolved configuration as YAML: every section and key in schema order, defaults filled.
  // Loading this text again yields the same configuration.
  std::string to_yaml() const;

  // Internal to config/ (the loader builds Configs; the printer walks them).
  struct Impl;
  explicit Config(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  const Impl& impl() const { return *impl_; }

 private:
  std::shared_ptr<const Impl> impl_;
};

// Everything a load found: a Config when there was no problem, otherwise every diagnostic.
struct Resolution {
  std::optional<Config> config;
  std::vector<Diagnostic> diagnostics;
  std::vector<Diagnostic> warnings;  // loaded anyway: a renamed or retired key (schema.h, FormerKey)
};

// Checks YAML text (source_name is used in locations, e.g. the file path) plus overrides against the
// schema. Never throws.
Resolution resolve(std::string_view yaml_text, std::string_view source_name, const LoadOptions& options = {});

// Reads and checks a file; an unreadable or oversized file is a diagnostic citing the path.
Resolution resolve_file(const std::string& path, const LoadOptions& options = {});

// The Result forms. On failure the Error (kInvalidArgument, or kNotFound/kIo for an unreadable file)
// has one line per diagnostic: "N problems in configs/x.yaml:\n<where>: <message>\n...".
Result<Config> load_file(const std::string& path, const LoadOptions& options = {});
Result<Config> load_string(std::string_view yaml_text, std::string_view source_name = "<string>",
                           const LoadOptions& options = {});
// Every key at its default (convenient in tests of other modules).
Config defaults();

// docs/configuration.md, generated from the schema (`arlo config-doc`).
std::string generate_markdown(const Schema& schema);

}  // namespace arlo::config
