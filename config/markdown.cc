// generate_markdown: docs/configuration.md from the schema. Deterministic: the same schema always
// gives the same bytes, so a test can compare it with the checked-in file.
#include <string>

#include "config/config.h"
#include "config/config_impl.h"
#include "common/escape.h"

namespace arlo::config {
namespace {

// A table cell: '|' would end it and a line break would end the row.
std::string cell(std::string_view text) { return escape_chars(text, {{'|', "\\|"}, {'\n', " "}}); }

std::string code(const std::string& text) { return "`" + text + "`"; }

std::string default_text(const Key& key) {
  if (key.required) return "(required)";
  switch (key.type) {
    case Type::kBool: return code(std::get<bool>(key.default_value) ? "true" : "false");
    case Type::kInt: return code(std::to_string(std::get<std::int64_t>(key.default_value)));
    case Type::kFloat: return code(format_float(std::get<double>(key.default_value)));
    case Type::kString: return code("\"" + std::get<std::string>(key.default_value) + "\"");
    case Type::kStringList: {
      std::string out = "[";
      const auto& items = std::get<std::vector<std::string>>(key.default_value);
      for (std::size_t i = 0; i < items.size(); ++i) out += (i ? ", \"" : "\"") + items[i] + "\"";
      return code(out + "]");
    }
    case Type::kMap:
    case Type::kObjectList: return code(std::get<std::string>(key.default_value));
  }
  return "";
}

std::string allowed_text(const Key& key) {
  if (!key.choices.empty()) {
    std::string out;
    for (std::size_t i = 0; i < key.choices.size(); ++i) out += (i ? ", " : "") + code(key.choices[i]);
    return out;
  }
  const bool counted = key.type == Type::kStringList || key.type == Type::kMap || key.type == Type::kObjectList;
  const std::string unit = counted ? " items" : "";
  if (key.min && key.max) return format_bound(*key.min) + " to " + format_bound(*key.max) + unit;
  if (key.min) return ">= " + format_bound(*key.min) + unit;
  if (key.max) return "<= " + format_bound(*key.max) + unit;
  return "";
}

void table(std::string& out, const std::vector<Key>& keys) {
  out += "| Key | Type | Default | Allowed | Description |\n";
  out += "|---|---|---|---|---|\n";
  for (const auto& key : keys) {
    out += "| " + code(key.name) + " | " + std::string(type_name(key.type)) + " | " + cell(default_text(key)) + " | " +
           cell(allowed_text(key)) + " | " + cell(key.doc) + " |\n";
  }
}

}  // namespace

std::string generate_markdown(const Schema& schema) {
  std::string out;
  out += "# Configuration reference\n\n";
  out +=
      "<!-- Generated from config/schema.cc by `arlo config-doc --output docs/configuration.md`. "
      "Do not edit by hand: change the schema and regenerate. -->\n\n";
  out +=
      "An arlo run is configured by one YAML file with the sections below; every key is optional and "
      "falls back to the default shown. Check a file without running it:\n\n";
  out += "```\narlo check-config configs/quickstart.yaml --set orchestrator.batch_size=64\n```\n\n";
  out +=
      "It prints the resolved configuration (every key, defaults filled), or every problem it found "
      "with its `file:line:column` and exits with status 2.\n\n";
  out += "## Rules for values\n\n";
  out +=
      "- Unknown sections and keys are errors; the message suggests the nearest known name "
      "(`did you mean 'batch_size'?`).\n";
  out +=
      "- `--set section.key=value` (repeatable, applied after the file, later wins) takes a YAML value and "
      "is checked like the file: `--set sampling.stop=[\"\\n\"]`; a list of objects is replaced whole: "
      "`--set 'reward.modules=[{kind: numeric_match}]'`.\n";
  out +=
      "- `${VAR}` in any value is replaced by the environment variable `VAR` (an error when unset); "
      "`${VAR:-fallback}` uses `fallback` when `VAR` is unset or empty; `$${` is a literal `${`.\n";
  out +=
      "- A key with no value (`key:` or `~`) means an empty string, list or map; bool, int and float keys "
      "need a value.\n";
  out +=
      "- Booleans are `true`/`false`; integers are decimal or `0x` hex and fit in 64 bits; floats are "
      "finite; a number in quotes is a string, not a number.\n";
  out +=
      "- A default written `{section.key}` is filled from that key's value (`run.dir` defaults to "
      "`runs/<run.name>`).\n\n";
  out += "## Sections\n\n";
  for (const auto& section : schema.sections()) {
    out += "- [`" + section.name + "`](#" + section.name + "): " + section.doc + "\n";
  }
  for (const auto& section : schema.sections()) {
    out += "\n## " + section.name + "\n\n" + section.doc + "\n\n";
    table(out, section.keys);
    for (const auto& key : section.keys) {
      if (key.type != Type::kObjectList) continue;
      out += "\nEach item of `" + section.name + "." + key.name + "`:\n\n";
      table(out, key.item_keys);
    }
  }
  if (!schema.rules().empty()) {
    out += "\n## Rules between keys\n\n";
    for (const auto& rule : schema.rules()) out += "- " + rule.doc + "\n";
  }
  if (!schema.former_keys().empty()) {
    out +=
        "\n## Renamed and retired keys\n\nThey still load in this release, each with a warning, and go in the next "
        "one.\n\n";
    for (const auto& f : schema.former_keys()) {
      out += "- `" + f.path +
             "`: " + (f.renamed_to.empty() ? "retired, ignored: " + f.why : "renamed `" + f.renamed_to + "`") + ".\n";
    }
  }
  LoadOptions options;
  options.schema = &schema;
  options.env = [](std::string_view) -> std::optional<std::string> { return std::nullopt; };
  Resolution defaults = resolve("", "defaults", options);
  if (defaults.config) {
    out += "\n## Every key at its default\n\n```yaml\n" + defaults.config->to_yaml() + "```\n";
  }
  return out;
}

}  // namespace arlo::config
