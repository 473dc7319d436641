// The config loader: YAML text + --set overrides -> a Config, or every problem found.
//
// yaml-cpp reports errors by throwing; every call into it that can throw is wrapped here and turned
// into a Diagnostic, so nothing escapes resolve().
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <expected>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <set>
#include <system_error>

#include "config/config.h"
#include "config/config_impl.h"
#include "config/text.h"
#include "common/log.h"

namespace arlo::config {
namespace {

// Bounds on what one load may build, so hostile input (aliases that multiply, deep free-form maps)
// gets an error instead of exhausting memory or the stack.
constexpr std::size_t kMaxValues = 100000;
constexpr int kMaxMapDepth = 32;
constexpr std::size_t kMaxFileBytes = 16u << 20;

std::string where_of(std::string_view source, const YAML::Mark& mark) {
  if (mark.is_null() || mark.line < 0 || mark.column < 0) return std::string(source);
  return std::string(source) + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
}

// A scalar written in quotes (or tagged !!str) is a string even when it looks like a number.
bool is_quoted(const YAML::Node& node) { return node.Tag() == "!" || node.Tag() == "tag:yaml.org,2002:str"; }

std::string_view kind_of(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null: return "nothing (null)";
    case YAML::NodeType::Scalar: return "a scalar";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a mapping";
    case YAML::NodeType::Undefined: return "nothing";
  }
  return "something else";
}

std::string shorten(std::string_view text) {
  constexpr std::size_t kMax = 60;
  if (text.size() <= kMax) return std::string(text);
  return std::string(text.substr(0, kMax)) + "...";
}

std::optional<bool> parse_bool(std::string_view s) {
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  return std::nullopt;
}

// Decimal, 0x-hex or 0o-octal, optional sign. The error says whether `text` is not an integer or
// too large ("integer '99999999999999999999' is out of range (must fit in 64 bits)").
std::expected<std::int64_t, std::string> parse_int(std::string_view text) {
  const auto not_integer = [&] { return std::unexpected("expected an integer, got '" + shorten(text) + "'"); };
  const auto out_of_range = [&] {
    return std::unexpected("integer '" + shorten(text) + "' is out of range (must fit in 64 bits)");
  };
  std::string_view s = text;
  bool negative = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  int base = 10;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    base = 16;
    s.remove_prefix(2);
  } else if (s.size() > 2 && s[0] == '0' && s[1] == 'o') {
    base = 8;
    s.remove_prefix(2);
  }
  if (s.empty()) return not_integer();
  std::uint64_t magnitude = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), magnitude, base);
  if (ptr != s.data() + s.size()) return not_integer();
  if (ec == std::errc::result_out_of_range) return out_of_range();
  if (ec != std::errc()) return not_integer();
  constexpr std::uint64_t kMaxPositive = static_cast<std::uint64_t>(INT64_MAX);
  if (negative) {
    if (magnitude > kMaxPositive + 1) return out_of_range();
    return magnitude == kMaxPositive + 1 ? INT64_MIN : -static_cast<std::int64_t>(magnitude);
  }
  if (magnitude > kMaxPositive) return out_of_range();
  return static_cast<std::int64_t>(magnitude);
}

// A finite number; the error says whether `text` is not a number, not finite or out of range.
std::expected<double, std::string> parse_float(std::string_view text) {
  const auto not_finite = [&] { return std::unexpected("must be a finite number, got '" + shorten(text) + "'"); };
  const auto not_number = [&] { return std::unexpected("expected a number, got '" + shorten(text) + "'"); };
  std::string_view s = text;
  if (s == ".inf" || s == "+.inf" || s == "-.inf" || s == ".Inf" || s == "-.Inf" || s == ".nan" || s == ".NaN" ||
      s == ".NAN" || s == ".INF" || s == "-.INF") {
    return not_finite();
  }
  if (!s.empty() && s[0] == '+') s.remove_prefix(1);
  if (s.empty()) return not_number();
  double out = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  if (ptr != s.data() + s.size()) return not_number();
  if (ec == std::errc::result_out_of_range) return std::unexpected("number '" + shorten(text) + "' is out of range");
  if (ec != std::errc()) return not_number();
  if (!std::isfinite(out)) return not_finite();
  return out;
}

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i];
  }
  return out;
}

std::string did_you_mean(std::string_view name, const std::vector<std::string>& candidates) {
  if (auto best = nearest(name, candidates)) return " (did you mean '" + *best + "'?)";
  return "";
}

// Records where each document starts and ignores everything else (the counting pass).
class DocumentCounter : public YAML::EventHandler {
 public:
  std::vector<YAML::Mark> starts;
  void OnDocumentStart(const YAML::Mark& mark) override { starts.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

// One value the user gave, not yet checked: the node and where its key was written.
struct Raw {
  YAML::Node node;
  std::string key_where;
  std::string source;  // file name, or "--set a.b=v" for an override
};

class Resolver {
 public:
  Resolver(const Schema& schema, const LoadOptions& options, std::string_view source)
      : schema_(schema), options_(options), source_(source) {}

  // The edge where yaml-cpp's exceptions stop: anything thrown while walking the document (which
  // should not happen after a successful parse) becomes a diagnostic.
  Resolution run(std::string_view text) {
    try {
      return run_unguarded(text);
    } catch (const std::exception& e) {
      Resolution out;
      out.diagnostics = std::move(diagnostics_);
      out.diagnostics.push_back({source_, std::string("could not read the configuration: ") + e.what()});
      return out;
    }
  }

 private:
  Resolution run_unguarded(std::string_view text) {
    read_document(text);
    for (const auto& override_text : options_.overrides) read_override(override_text);

    auto impl = std::make_shared<Config::Impl>();
    impl->schema = &schema_;
    for (const auto& section : schema_.sections()) {
      for (const auto& key : section.keys) {
        const std::string path = section.name + "." + key.name;
        if (auto value = resolve_key(key, path, raws_)) impl->values.emplace(path, std::move(*value));
      }
    }
    fill_templates(*impl);

    Resolution out;
    if (diagnostics_.empty()) {
      Config config(std::move(impl));
      std::vector<Violation> violations;
      for (const auto& rule : schema_.rules()) {
        if (rule.check) rule.check(config, violations);
      }
      for (auto& v : violations) add(std::move(v.where), std::move(v.message));
      if (diagnostics_.empty()) out.config = std::move(config);
    }
    out.diagnostics = std::move(diagnostics_);
    out.warnings = std::move(warnings_);
    return out;
  }

  void add(std::string where, std::string message) { diagnostics_.push_back({std::move(where), std::move(message)}); }
  void warn(std::string where, std::string message) { warnings_.push_back({std::move(where), std::move(message)}); }

  static std::string former_warning(const FormerKey& f) {
    if (f.renamed_to.empty())
      return f.path + " is retired and has no effect: " + f.why + "; remove it (it goes in the next release)";
    return f.path + " is renamed " + f.renamed_to + ": write " + f.renamed_to + " (" + f.path +
           " goes in the next release)";
  }

  // A former key in the file: warned; a renamed one's value is read as its new name.
  void read_former(const FormerKey& former, Raw raw) {
    warn(raw.key_where, former_warning(former));
    if (former.renamed_to.empty()) return;
    if (auto it = raws_.find(former.renamed_to); it != raws_.end() && it->second.source == source_) {
      add(raw.key_where, former.path + ": given twice, also as " + former.renamed_to + ": keep " + former.renamed_to);
      return;
    }
    from_former_[former.renamed_to] = former.path;
    raws_[former.renamed_to] = std::move(raw);
  }

  // Parses the text; a single YAML document whose root is a mapping of sections (or empty).
  void read_document(std::string_view text) {
    // A first pass only counts documents, at most two: yaml-cpp's LoadAll never returns on input
    // such as ", x" (the parser yields empty documents without advancing), so the count is bounded
    // and a second document starting where the first did is reported as the syntax error it is.
    const std::string owned(text);
    try {
      std::istringstream stream(owned);
      YAML::Parser parser(stream);
      DocumentCounter counter;
      int documents = 0;
      while (documents < 2 && parser.HandleNextDocument(counter)) ++documents;
      if (documents == 2) {
        const YAML::Mark& second = counter.starts[1];
        if (second.pos == counter.starts[0].pos) {
          const char c =
              second.pos >= 0 && static_cast<std::size_t>(second.pos) < owned.size() ? owned[second.pos] : '?';
          add(where_of(source_, second), std::string("malformed YAML: unexpected '") + c + "'");
        } else {
          add(where_of(source_, second), "only one YAML document is allowed (remove the '---' separating documents)");
        }
        return;
      }
    } catch (const YAML::Exception& e) {
      add(where_of(source_, e.mark), "malformed YAML: " + e.msg);
      return;
    }
    YAML::Node root;
    try {
      root = YAML::Load(owned);
    } catch (const YAML::Exception& e) {
      add(where_of(source_, e.mark), "malformed YAML: " + e.msg);
      return;
    } catch (const std::exception& e) {
      add(source_, std::string("malformed YAML: ") + e.what());
      return;
    }
    for_each_named(
        root, "the top level must be a mapping of sections (run:, orchestrator:, ...)",
        "a section name must be a plain word",
        [](const std::string& name) { return "section '" + shorten(name) + "' appears twice"; },
        [&](const std::string& name, const std::string& at, const YAML::Node& body) {
          const Section* section = schema_.find_section(name);
          if (section == nullptr) {
            add(at, "unknown section '" + shorten(name) + "'" + suggest_section(name));
            return;
          }
          read_section(*section, body);
        });
  }

  // The entries of a mapping of names (the document's sections, a section's keys), each name once:
  // calls each(name, at, value) for every entry whose name is a plain word not seen before. A null
  // node has no entries. The errors: `not_map` when the node is not a mapping, `not_word` for a name
  // that is not a scalar (both followed by ", got <what it is>"), twice(name) for a repeated name.
  template <typename Twice, typename Each>
  void for_each_named(const YAML::Node& map, const std::string& not_map, const std::string& not_word, Twice twice,
                      Each each) {
    if (map.IsNull()) return;
    if (!map.IsMap()) {
      add(where_of(source_, map.Mark()), not_map + ", got " + std::string(kind_of(map)));
      return;
    }
    std::set<std::string> seen;
    for (const auto& entry : map) {
      const YAML::Node& name_node = entry.first;
      const std::string at = where_of(source_, name_node.Mark());
      if (!name_node.IsScalar()) {
        add(at, not_word + ", got " + std::string(kind_of(name_node)));
        continue;
      }
      const std::string name = name_node.Scalar();
      if (!seen.insert(name).second) {
        add(at, twice(name));
        continue;
      }
      each(name, at, entry.second);
    }
  }

  std::string suggest_section(const std::string& name) const {
    std::vector<std::string> names;
    for (const auto& s : schema_.sections()) names.push_back(s.name);
    if (auto best = nearest(name, names)) return " (did you mean '" + *best + "'?)";
    for (const auto& s : schema_.sections()) {
      if (s.find(name)) return " (did you mean '" + s.name + "." + name + "'? keys go under their section)";
    }
    return " (sections: " + join(names, ", ") + ")";
  }

  void read_section(const Section& section, const YAML::Node& body) {
    for_each_named(
        body, section.name + ": a section must be a mapping of keys", section.name + ": a key must be a plain word",
        [&](const std::string& name) { return shorten(section.name + "." + name) + ": key appears twice"; },
        [&](const std::string& name, const std::string& at, const YAML::Node& value) {
          const std::string path = section.name + "." + name;
          if (section.find(name) == nullptr) {
            if (const FormerKey* former = schema_.find_former(path)) {
              read_former(*former, Raw{value, at, source_});
            } else {
              add(at, shorten(path) + ": unknown key" + suggest_key(section, name));
            }
            return;
          }
          if (auto it = from_former_.find(path); it != from_former_.end() && raws_.at(path).source == source_) {
            add(at,
                shorten(path) + ": given twice, also as " + it->second + " (its former name): keep " + shorten(path));
            return;
          }
          raws_[path] = Raw{value, at, source_};
        });
  }

  std::string suggest_key(const Section& section, const std::string& name) const {
    std::vector<std::string> names;
    for (const auto& k : section.keys) names.push_back(k.name);
    if (auto best = nearest(name, names)) return " (did you mean '" + *best + "'?)";
    for (const auto& other : schema_.sections()) {
      if (other.find(name))
        return " (did you mean '" + other.name + "." + name + "'? it belongs to section " + other.name + ")";
    }
    return " (keys of " + section.name + ": " + join(names, ", ") + ")";
  }

  void read_override(const std::string& text) {
    const std::string at = "--set " + shorten(text);
    const std::size_t eq = text.find('=');
    if (eq == std::string::npos) {
      add(at, "expected --set section.key=value");
      return;
    }
    std::string path = text.substr(0, eq);
    const std::string value_text = text.substr(eq + 1);
    const FormerKey* former = schema_.find_key(path) ? nullptr : schema_.find_former(path);
    if (former) {
      warn(at, former_warning(*former));
      if (former->renamed_to.empty()) return;
      path = former->renamed_to;
    }
    if (schema_.find_key(path) == nullptr) {
      std::vector<std::string> paths;
      for (const auto& s : schema_.sections()) {
        for (const auto& k : s.keys) paths.push_back(s.name + "." + k.name);
      }
      add(at, shorten(path) + ": unknown key" + did_you_mean(path, paths));
      return;
    }
    YAML::Node node;
    try {
      node = value_text.empty() ? YAML::Node(YAML::NodeType::Null) : YAML::Load(value_text);
    } catch (const YAML::Exception& e) {
      add(at, path + ": the value is not valid YAML: " + e.msg);
      return;
    } catch (const std::exception& e) {
      add(at, path + ": the value is not valid YAML: " + e.what());
      return;
    }
    raws_[path] = Raw{node, at, at};
  }

  // The location to cite for a problem with `node`: its own position in the file, else its key's.
  std::string where_value(const Raw& raw, const YAML::Node& node) const {
    if (raw.source != source_) return raw.source;  // an override: cite the --set text
    const YAML::Mark mark = node.Mark();
    return mark.is_null() ? raw.key_where : where_of(source_, mark);
  }

  bool spend(const std::string& at, const std::string& path) {
    if (++values_built_ <= kMaxValues) return true;
    if (!budget_reported_) {
      add(at, path + ": the configuration holds more than " + std::to_string(kMaxValues) +
                  " values (aliases that repeat large nodes?)");
      budget_reported_ = true;
    }
    return false;
  }

  // The expanded text of a scalar node, or nullopt after reporting why not.
  std::optional<std::string> scalar_text(const Raw& raw, const YAML::Node& node, const std::string& path) {
    auto expanded = expand_env(node.Scalar(), options_.env);
    if (!expanded) {
      add(where_value(raw, node), path + ": " + expanded.error().message());
      return std::nullopt;
    }
    return std::move(*expanded);
  }

  // Checks one key given by the user, or produces its default. nullopt: a problem was reported.
  std::optional<Value> resolve_key(const Key& key, const std::string& path,
                                   const std::map<std::string, Raw, std::less<>>& raws) {
    const auto found = raws.find(path);
    if (found == raws.end()) return default_value(key, path);
    std::optional<Value> value = convert(key, path, found->second, found->second.node);
    if (value) {
      value->set = true;
      value->where = found->second.source == source_ ? found->second.key_where : found->second.source;
    }
    return value;
  }

  std::optional<Value> default_value(const Key& key, const std::string& path) {
    Value value;
    value.type = key.type;
    value.where = "default";
    if (key.type == Type::kMap || key.type == Type::kObjectList) {
      // Defaults of structured keys are YAML text, checked exactly like user input.
      const std::string* text = std::get_if<std::string>(&key.default_value);
      YAML::Node node;
      try {
        node = YAML::Load(text ? *text : std::string());
      } catch (const YAML::Exception& e) {
        add("default", path + ": the schema's default is not valid YAML: " + e.msg);
        return std::nullopt;
      }
      auto converted = convert(key, path, Raw{node, "default", "default"}, node);
      if (converted) converted->where = "default";
      return converted;
    }
    std::visit([&](const auto& d) { value.data = d; }, key.default_value);
    return value;
  }

  // Converts the YAML value `node` at `path` to `key`'s type, checking choices and counts; errors
  // are recorded (file:line) and give nullopt.
  std::optional<Value> convert(const Key& key, const std::string& path, const Raw& raw, const YAML::Node& node) {
    const std::string at = where_value(raw, node);
    switch (key.type) {
      case Type::kBool:
      case Type::kInt:
      case Type::kFloat: return convert_scalar(key, path, raw, node, at);
      case Type::kString: return convert_string(key, path, raw, node, at);
      case Type::kStringList: return convert_string_list(key, path, raw, node, at);
      case Type::kMap: return convert_map(key, path, raw, node, at);
      case Type::kObjectList: return convert_object_list(key, path, raw, node, at);
    }
    return std::nullopt;
  }

  // A bool, int or float: an unquoted scalar (a quoted one is refused: the user wrote a string).
  std::optional<Value> convert_scalar(const Key& key, const std::string& path, const Raw& raw, const YAML::Node& node,
                                      const std::string& at) {
    const bool null = node.IsNull();
    if (null) {
      add(at, path + ": needs a value (" + std::string(type_name(key.type)) + ")");
      return std::nullopt;
    }
    if (!node.IsScalar()) {
      add(at, path + ": expected " + std::string(type_name(key.type)) + ", got " + std::string(kind_of(node)));
      return std::nullopt;
    }
    auto text = scalar_text(raw, node, path);
    if (!text) return std::nullopt;
    if (is_quoted(node)) {
      add(at, path + ": expected " + std::string(type_name(key.type)) + ", got the quoted string \"" + shorten(*text) +
                  "\" (remove the quotes)");
      return std::nullopt;
    }
    return convert_number_or_bool(key, path, at, *text);
  }

  // A string (null is the empty string), one of key.choices when it lists any.
  std::optional<Value> convert_string(const Key& key, const std::string& path, const Raw& raw, const YAML::Node& node,
                                      const std::string& at) {
    Value value;
    value.type = key.type;
    const bool null = node.IsNull();
    if (null) {
      value.data = std::string();
    } else if (!node.IsScalar()) {
      add(at, path + ": expected a string, got " + std::string(kind_of(node)));
      return std::nullopt;
    } else {
      auto text = scalar_text(raw, node, path);
      if (!text) return std::nullopt;
      value.data = std::move(*text);
    }
    const std::string& s = std::get<std::string>(value.data);
    if (!key.choices.empty() && std::find(key.choices.begin(), key.choices.end(), s) == key.choices.end()) {
      add(at, path + ": must be one of " + join(key.choices, ", ") + "; got '" + shorten(s) + "'" +
                  did_you_mean(s, key.choices));
      return std::nullopt;
    }
    return value;
  }

  // A list or mapping value: null is `items` as given (empty); a node of another kind is an error
  // saying what was `expected` (and `hint`, how to write it). `fill` converts the node's elements into
  // `items`, returning false when it reported an error; then the key's item-count bounds apply.
  template <typename Items, typename Fill>
  std::optional<Value> convert_container(const Key& key, const std::string& path, const YAML::Node& node,
                                         const std::string& at, Items items, YAML::NodeType::value kind,
                                         std::string_view expected, std::string_view hint, Fill fill) {
    if (!node.IsNull()) {
      if (node.Type() != kind) {
        add(at,
            path + ": expected " + std::string(expected) + ", got " + std::string(kind_of(node)) + std::string(hint));
        return std::nullopt;
      }
      if (!fill(items)) return std::nullopt;
    }
    if (!check_count(key, path, at, items.size())) return std::nullopt;
    Value value;
    value.type = key.type;
    value.data = std::move(items);
    return value;
  }

  // A sequence of scalar strings (null is empty), each element's error reported on its own line.
  std::optional<Value> convert_string_list(const Key& key, const std::string& path, const Raw& raw,
                                           const YAML::Node& node, const std::string& at) {
    auto fill = [&](std::vector<std::string>& items) {
      bool ok = true;
      for (std::size_t i = 0; i < node.size(); ++i) {
        const YAML::Node item = node[i];
        const std::string item_path = path + "[" + std::to_string(i) + "]";
        if (!spend(at, path)) return false;
        if (!item.IsScalar()) {
          add(where_value(raw, item), item_path + ": expected a string, got " + std::string(kind_of(item)));
          ok = false;
          continue;
        }
        auto text = scalar_text(raw, item, item_path);
        if (!text) {
          ok = false;
          continue;
        }
        items.push_back(std::move(*text));
      }
      return ok;
    };
    return convert_container(key, path, node, at, std::vector<std::string>{}, YAML::NodeType::Sequence,
                             "a list of strings", " (write [a, b])", fill);
  }

  // A mapping, kept as JSON (null is empty).
  std::optional<Value> convert_map(const Key& key, const std::string& path, const Raw& raw, const YAML::Node& node,
                                   const std::string& at) {
    auto fill = [&](nlohmann::json& object) {
      auto converted = to_json(raw, node, path, 0);
      if (!converted) return false;
      object = std::move(*converted);
      return true;
    };
    return convert_container(key, path, node, at, nlohmann::json::object(), YAML::NodeType::Map, "a mapping", "", fill);
  }

  // A sequence of mappings, each converted against key's item schema (null is empty).
  std::optional<Value> convert_object_list(const Key& key, const std::string& path, const Raw& raw,
                                           const YAML::Node& node, const std::string& at) {
    auto fill = [&](std::vector<Config>& items) {
      bool ok = true;
      for (std::size_t i = 0; i < node.size(); ++i) {
        if (!spend(at, path)) return false;
        auto item = convert_item(key, path + "[" + std::to_string(i) + "]", raw, node[i]);
        if (item) {
          items.push_back(std::move(*item));
        } else {
          ok = false;
        }
      }
      return ok;
    };
    return convert_container(key, path, node, at, std::vector<Config>{}, YAML::NodeType::Sequence,
                             "a list of mappings (- kind: ...)", "", fill);
  }

  std::optional<Value> convert_number_or_bool(const Key& key, const std::string& path, const std::string& at,
                                              const std::string& text) {
    Value value;
    value.type = key.type;
    if (key.type == Type::kBool) {
      auto b = parse_bool(text);
      if (!b) {
        add(at, path + ": expected true or false, got '" + shorten(text) + "'");
        return std::nullopt;
      }
      value.data = *b;
      return value;
    }
    // An int or float: its parse error, or the key's bounds (shown as the integer, or as written).
    auto number = [&](const auto& parsed, const std::string& shown) -> std::optional<Value> {
      if (!parsed) {
        add(at, path + ": " + parsed.error());
        return std::nullopt;
      }
      if (!check_range(key, path, at, static_cast<double>(*parsed), shown)) return std::nullopt;
      value.data = *parsed;
      return value;
    };
    if (key.type == Type::kInt) {
      const auto n = parse_int(text);
      return number(n, n ? std::to_string(*n) : "");
    }
    return number(parse_float(text), shorten(text));
  }

  bool check_range(const Key& key, const std::string& path, const std::string& at, double v, const std::string& shown) {
    const bool low = key.min && v < *key.min;
    const bool high = key.max && v > *key.max;
    if (!low && !high) return true;
    if (key.min && key.max) {
      add(at,
          path + ": must be between " + format_bound(*key.min) + " and " + format_bound(*key.max) + ", got " + shown);
    } else if (low) {
      add(at, path + ": must be >= " + format_bound(*key.min) + ", got " + shown);
    } else {
      add(at, path + ": must be <= " + format_bound(*key.max) + ", got " + shown);
    }
    return false;
  }

  bool check_count(const Key& key, const std::string& path, const std::string& at, std::size_t count) {
    const double n = static_cast<double>(count);
    if (key.min && n < *key.min) {
      add(at, path + ": needs at least " + format_bound(*key.min) + " item(s), got " + std::to_string(count));
      return false;
    }
    if (key.max && n > *key.max) {
      add(at, path + ": allows at most " + format_bound(*key.max) + " item(s), got " + std::to_string(count));
      return false;
    }
    return true;
  }

  std::optional<nlohmann::json> to_json(const Raw& raw, const YAML::Node& node, const std::string& path, int depth) {
    const std::string at = where_value(raw, node);
    if (depth > kMaxMapDepth) {
      add(at, path + ": nested deeper than " + std::to_string(kMaxMapDepth) + " levels");
      return std::nullopt;
    }
    if (!spend(at, path)) return std::nullopt;
    switch (node.Type()) {
      case YAML::NodeType::Null:
      case YAML::NodeType::Undefined: return nlohmann::json(nullptr);
      case YAML::NodeType::Scalar: {
        auto text = scalar_text(raw, node, path);
        if (!text) return std::nullopt;
        if (is_quoted(node)) return nlohmann::json(*text);
        if (auto b = parse_bool(*text)) return nlohmann::json(*b);
        if (auto n = parse_int(*text)) return nlohmann::json(*n);
        if (auto d = parse_float(*text)) return nlohmann::json(*d);
        return nlohmann::json(*text);
      }
      case YAML::NodeType::Sequence: {
        nlohmann::json array = nlohmann::json::array();
        for (std::size_t i = 0; i < node.size(); ++i) {
          auto item = to_json(raw, node[i], path + "[" + std::to_string(i) + "]", depth + 1);
          if (!item) return std::nullopt;
          array.push_back(std::move(*item));
        }
        return array;
      }
      case YAML::NodeType::Map: {
        nlohmann::json object = nlohmann::json::object();
        for (const auto& entry : node) {
          if (!entry.first.IsScalar()) {
            add(where_value(raw, entry.first),
                path + ": map keys must be scalars, got " + std::string(kind_of(entry.first)));
            return std::nullopt;
          }
          const std::string name = entry.first.Scalar();
          const std::string child = path + "." + shorten(name);
          if (object.contains(name)) {
            add(where_value(raw, entry.first), child + ": key appears twice");
            return std::nullopt;
          }
          auto item = to_json(raw, entry.second, child, depth + 1);
          if (!item) return std::nullopt;
          object[name] = std::move(*item);
        }
        return object;
      }
    }
    return std::nullopt;
  }

  // One object-list item: a mapping checked against the key's item schema, defaults filled.
  std::optional<Config> convert_item(const Key& key, const std::string& path, const Raw& raw, const YAML::Node& node) {
    const std::string at = where_value(raw, node);
    if (!node.IsMap()) {
      add(at, path + ": expected a mapping, got " + std::string(kind_of(node)));
      return std::nullopt;
    }
    std::map<std::string, Raw, std::less<>> item_raws;
    bool ok = true;
    for (const auto& entry : node) {
      const std::string key_at = where_value(raw, entry.first);
      if (!entry.first.IsScalar()) {
        add(key_at, path + ": a key must be a plain word, got " + std::string(kind_of(entry.first)));
        ok = false;
        continue;
      }
      const std::string name = entry.first.Scalar();
      const auto declared =
          std::find_if(key.item_keys.begin(), key.item_keys.end(), [&](const Key& k) { return k.name == name; });
      if (declared == key.item_keys.end()) {
        std::vector<std::string> names;
        for (const auto& k : key.item_keys) names.push_back(k.name);
        std::string hint = did_you_mean(name, names);
        if (hint.empty()) hint = " (item keys: " + join(names, ", ") + ")";
        add(key_at, path + "." + shorten(name) + ": unknown key" + hint);
        ok = false;
        continue;
      }
      if (item_raws.contains(name)) {
        add(key_at, path + "." + shorten(name) + ": key appears twice");
        ok = false;
        continue;
      }
      item_raws[name] = Raw{entry.second, key_at, raw.source};
    }
    auto impl = std::make_shared<Config::Impl>();
    impl->item_keys = &key.item_keys;
    for (const auto& item_key : key.item_keys) {
      if (item_key.required && !item_raws.contains(item_key.name)) {
        add(at, path + ": missing required key '" + item_key.name + "'");
        ok = false;
        continue;
      }
      // Messages name the full path; the item stores values under the bare key.
      const std::string full = path + "." + item_key.name;
      std::map<std::string, Raw, std::less<>> one;
      if (auto found = item_raws.find(item_key.name); found != item_raws.end()) one.emplace(full, found->second);
      auto value = resolve_key(item_key, full, one);
      if (!value) {
        ok = false;
        continue;
      }
      impl->values.emplace(item_key.name, std::move(*value));
    }
    if (!ok) return std::nullopt;
    return Config(std::move(impl));
  }

  // Fills "{section.key}" references in string defaults the user left unset, in schema order.
  void fill_templates(Config::Impl& impl) {
    for (const auto& section : schema_.sections()) {
      for (const auto& key : section.keys) {
        if (key.type != Type::kString) continue;
        auto found = impl.values.find(section.name + "." + key.name);
        if (found == impl.values.end() || found->second.set) continue;
        std::string& text = std::get<std::string>(found->second.data);
        std::string out;
        std::size_t i = 0;
        while (i < text.size()) {
          const std::size_t open = text.find('{', i);
          const std::size_t close = open == std::string::npos ? std::string::npos : text.find('}', open);
          if (close == std::string::npos) {
            out += text.substr(i);
            break;
          }
          out += text.substr(i, open - i);
          const std::string ref = text.substr(open + 1, close - open - 1);
          auto target = impl.values.find(ref);
          if (target != impl.values.end() && target->second.type == Type::kString) {
            out += std::get<std::string>(target->second.data);
          } else if (target != impl.values.end() && target->second.type == Type::kInt) {
            out += std::to_string(std::get<std::int64_t>(target->second.data));
          } else {
            out += text.substr(open, close - open + 1);
          }
          i = close + 1;
        }
        text = std::move(out);
      }
    }
  }

  const Schema& schema_;
  const LoadOptions& options_;
  std::string source_;
  std::map<std::string, Raw, std::less<>> raws_;
  std::vector<Diagnostic> diagnostics_;
  std::vector<Diagnostic> warnings_;
  std::map<std::string, std::string> from_former_;  // new path -> the former key it was read from
  std::size_t values_built_ = 0;
  bool budget_reported_ = false;
};

std::string describe(std::string_view source, const std::vector<Diagnostic>& diagnostics) {
  std::string out = std::to_string(diagnostics.size()) + (diagnostics.size() == 1 ? " problem" : " problems") +
                    " in config " + std::string(source) + ":";
  for (const auto& d : diagnostics) {
    out += '\n';
    out += d.text();
  }
  return out;
}

}  // namespace

EnvLookup process_env() {
  return [](std::string_view name) -> std::optional<std::string> {
    const char* value = std::getenv(std::string(name).c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

Resolution resolve(std::string_view yaml_text, std::string_view source_name, const LoadOptions& options) {
  const Schema& schema = options.schema ? *options.schema : product_schema();
  return Resolver(schema, options, source_name).run(yaml_text);
}

Result<Config> load_string(std::string_view yaml_text, std::string_view source_name, const LoadOptions& options) {
  Resolution r = resolve(yaml_text, source_name, options);
  for (const auto& w : r.warnings) ARLO_WARN("config: {}", w.text());
  if (r.config) return std::move(*r.config);
  return make_error(ErrorCode::kInvalidArgument, describe(source_name, r.diagnostics));
}

namespace {

// The text of a config file, refusing what is not a readable regular file of sane size.
Result<std::string> read_config_text(const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status)) {
    return make_error(ErrorCode::kNotFound, "config file " + path + " does not exist");
  }
  if (std::filesystem::is_directory(status)) {
    return make_error(ErrorCode::kInvalidArgument, "config " + path + " is a directory, not a file");
  }
  // Pipes (<(...), /dev/stdin) are read too; the size limit is enforced while reading.
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::kIo, "cannot open config file " + path);
  std::string text;
  char buf[65536];
  while (in.read(buf, sizeof(buf)) || in.gcount() > 0) {
    text.append(buf, static_cast<std::size_t>(in.gcount()));
    if (text.size() > kMaxFileBytes) {
      return make_error(ErrorCode::kResourceExhausted, "config file " + path + " is larger than 16 MiB");
    }
  }
  if (in.bad()) return make_error(ErrorCode::kIo, "cannot read config file " + path);
  return text;
}

}  // namespace

Resolution resolve_file(const std::string& path, const LoadOptions& options) {
  auto text = read_config_text(path);
  if (!text) {
    Resolution out;
    out.diagnostics.push_back({path, text.error().message()});
    return out;
  }
  return resolve(*text, path, options);
}

Result<Config> load_file(const std::string& path, const LoadOptions& options) {
  ARLO_ASSIGN_OR_RETURN(std::string text, read_config_text(path));
  return load_string(text, path, options);
}

Config defaults() {
  auto config = load_string("", "defaults");
  if (!config) {
    // The schema's own defaults are checked by a unit test; reaching this is a bug in schema.cc.
    std::fprintf(stderr, "arlo::config: the schema defaults do not load: %s\n", config.error().what().c_str());
    std::abort();
  }
  return std::move(*config);
}

}  // namespace arlo::config
