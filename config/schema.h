#pragma once
// The declared configuration schema: every section and key of an arlo config, each with its type,
// default, documentation and validation in one place (config/schema.cc).
//
// The loader (config.h) checks user files against it, the typed getters of Config trust it, and
// `arlo config-doc` renders it to docs/configuration.md. To add a key, add one line to the section in
// schema.cc and regenerate the doc; nothing else needs to change.
//
// Thread-safety: a Schema is immutable after construction; product_schema() is built once and may be
// read from any thread.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/option_spec.h"

namespace arlo::config {

enum class Type {
  kBool,
  kInt,    // 64-bit signed integer
  kFloat,  // double; integers are accepted
  kString,
  kStringList,  // list of strings
  kMap,         // free-form mapping (scalars, lists, nested maps), handed on as JSON
  kObjectList,  // list of mappings, each checked against the key's item schema
};

// "bool", "int", "float", "string", "list of strings", "map", "list of objects".
std::string_view type_name(Type type);

// A key's default. The alternative matches the key's type: bool, int64_t, double, std::string,
// std::vector<std::string>; for kMap and kObjectList it is YAML text (std::string) checked like user
// input. String defaults may refer to other string or int keys as "{section.key}" (e.g.
// "runs/{run.name}"); the reference is filled from the resolved value when the key is left unset.
using Default = std::variant<bool, std::int64_t, double, std::string, std::vector<std::string>>;

struct Key {
  std::string name;
  Type type = Type::kString;
  Default default_value;
  std::string doc;
  // Inclusive bounds: the value for kInt/kFloat, the number of items for lists and maps.
  std::optional<double> min;
  std::optional<double> max;
  // Allowed values of a kString key (an enum). Empty: any string.
  std::vector<std::string> choices;
  // kObjectList only: the keys of each item.
  std::vector<Key> item_keys;
  // Item keys only: the user must give it (its default is then not used).
  bool required = false;

  // Builder-style modifiers for schema.cc: int_key("batch_size", 32, "...").at_least(1).
  Key range(double lo, double hi) &&;
  Key at_least(double lo) &&;
  Key at_most(double hi) &&;
  Key one_of(std::vector<std::string> allowed) &&;
  Key must_be_given() &&;
};

Key bool_key(std::string name, bool def, std::string doc);
Key int_key(std::string name, std::int64_t def, std::string doc);
Key float_key(std::string name, double def, std::string doc);
Key string_key(std::string name, std::string def, std::string doc);
Key strings_key(std::string name, std::vector<std::string> def, std::string doc);
// def_yaml: the default mapping as YAML text, "{}" for empty.
Key map_key(std::string name, std::string def_yaml, std::string doc);
// def_yaml: the default list as YAML text, e.g. "[{kind: exact_match, weight: 1.0}]".
Key objects_key(std::string name, std::vector<Key> item_keys, std::string def_yaml, std::string doc);

// A relation between keys that one key's own validation cannot express ("inference.urls must not be
// empty when inference.launch is external"). A rule's check appends one Violation per problem, citing
// the location of the key to blame (Config::where).
class Config;
struct Violation {
  std::string where;    // "configs/x.yaml:3:5", "--set a.b=1" or "default"
  std::string message;  // "inference.urls: must not be empty when inference.launch is external"
};
struct Rule {
  std::string doc;  // the rule in words, rendered in the documentation
  void (*check)(const Config& config, std::vector<Violation>& out) = nullptr;
};

struct Section {
  std::string name;
  std::string doc;
  std::vector<Key> keys;

  const Key* find(std::string_view key) const;
};

// The value of `dotted` as JSON: a config key that schema.cc made from an extension's option of type
// `type` (common/option_spec.h: weight_sync.<transport key>, env.<environment key>, ...).
nlohmann::json option_value(const Config& config, std::string_view dotted, OptionSpec::Type type);

// A key that was renamed or retired. For one release a config that still uses it loads: a renamed
// key's value is read as its new name, a retired key's value is ignored, and each use is a warning
// naming what to write instead (Resolution::warnings). Giving a former key and its new name in the
// same file is an error.
struct FormerKey {
  std::string path;        // "section.key" as it was
  std::string renamed_to;  // its new "section.key"; empty: retired
  std::string why;         // retired: why it has no effect any more
};

class Schema {
 public:
  Schema(std::vector<Section> sections, std::vector<Rule> rules, std::vector<FormerKey> former = {});

  const std::vector<Section>& sections() const { return sections_; }
  const std::vector<Rule>& rules() const { return rules_; }
  const Section* find_section(std::string_view name) const;
  // "section.key" -> its Key, or nullptr.
  const Key* find_key(std::string_view dotted) const;
  // "section.key" -> what became of a former key, or nullptr.
  const FormerKey* find_former(std::string_view dotted) const;
  const std::vector<FormerKey>& former_keys() const { return former_; }

 private:
  std::vector<Section> sections_;
  std::vector<Rule> rules_;
  std::vector<FormerKey> former_;
};

// The one schema of the whole product (defined in schema.cc).
const Schema& product_schema();

}  // namespace arlo::config
