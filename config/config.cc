// Config: typed getters over resolved values, and printing the resolved configuration as YAML.
#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "config/config.h"
#include "config/config_impl.h"

namespace arlo::config {
namespace {

// Reading an undeclared key, or a key with the wrong getter, is a bug in the caller, not a user
// error: the schema guarantees every declared key has a value of its declared type.
[[noreturn]] void misuse(std::string_view path, std::string_view problem) {
  std::fprintf(stderr, "arlo::config: %.*s: %.*s (see config/schema.cc)\n", static_cast<int>(path.size()), path.data(),
               static_cast<int>(problem.size()), problem.data());
  std::fflush(stderr);
  std::abort();
}

const Value& lookup(const Config::Impl& impl, std::string_view path) {
  const auto found = impl.values.find(path);
  if (found == impl.values.end()) misuse(path, "not a declared configuration key");
  return found->second;
}

template <typename T>
const T& typed(const Config::Impl& impl, std::string_view path, Type type) {
  const Value& value = lookup(impl, path);
  if (value.type != type) {
    misuse(path, "is declared as " + std::string(type_name(value.type)) + ", read as " + std::string(type_name(type)));
  }
  return std::get<T>(value.data);
}

// Plain scalars the loader would read as something other than this string get quotes.
bool needs_quotes(const std::string& s) {
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return true;
  if (s == "true" || s == "True" || s == "TRUE" || s == "false" || s == "False" || s == "FALSE") return true;
  const char first = s[0];
  if ((first >= '0' && first <= '9') || first == '-' || first == '+' || first == '.') return true;
  return s.front() == ' ' || s.back() == ' ';
}

// "${" in a resolved string must not be expanded again when the printed YAML is loaded.
std::string escape_dollar(const std::string& s) {
  std::string out;
  std::size_t i = 0;
  while (i < s.size()) {
    if (s.compare(i, 2, "${") == 0) {
      out += "$${";
      i += 2;
    } else {
      out += s[i++];
    }
  }
  return out;
}

void emit_string(YAML::Emitter& out, const std::string& s) {
  const std::string text = escape_dollar(s);
  if (needs_quotes(text)) out << YAML::DoubleQuoted;
  out << text;
}

void emit_json(YAML::Emitter& out, const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: out << YAML::Null; break;
    case nlohmann::json::value_t::boolean: out << j.get<bool>(); break;
    case nlohmann::json::value_t::number_integer: out << j.get<std::int64_t>(); break;
    case nlohmann::json::value_t::number_unsigned: out << j.get<std::uint64_t>(); break;
    case nlohmann::json::value_t::number_float: out << format_float(j.get<double>()); break;
    case nlohmann::json::value_t::string: emit_string(out, j.get<std::string>()); break;
    case nlohmann::json::value_t::array:
      out << YAML::BeginSeq;
      for (const auto& item : j) emit_json(out, item);
      out << YAML::EndSeq;
      break;
    case nlohmann::json::value_t::object:
      out << YAML::BeginMap;
      for (const auto& [k, v] : j.items()) {
        out << YAML::Key;
        emit_string(out, k);
        out << YAML::Value;
        emit_json(out, v);
      }
      out << YAML::EndMap;
      break;
    default: out << YAML::Null; break;
  }
}

void emit_value(YAML::Emitter& out, const Value& value);

void emit_keys(YAML::Emitter& out, const Config::Impl& impl, const std::vector<Key>& keys, const std::string& prefix) {
  out << YAML::BeginMap;
  for (const auto& key : keys) {
    out << YAML::Key << key.name << YAML::Value;
    emit_value(out, lookup(impl, prefix + key.name));
  }
  out << YAML::EndMap;
}

void emit_value(YAML::Emitter& out, const Value& value) {
  switch (value.type) {
    case Type::kBool: out << std::get<bool>(value.data); break;
    case Type::kInt: out << std::get<std::int64_t>(value.data); break;
    case Type::kFloat: out << format_float(std::get<double>(value.data)); break;
    case Type::kString: emit_string(out, std::get<std::string>(value.data)); break;
    case Type::kStringList: {
      const auto& items = std::get<std::vector<std::string>>(value.data);
      out << YAML::Flow << YAML::BeginSeq;
      for (const auto& item : items) emit_string(out, item);
      out << YAML::EndSeq;
      break;
    }
    case Type::kMap: emit_json(out, std::get<nlohmann::json>(value.data)); break;
    case Type::kObjectList: {
      const auto& items = std::get<std::vector<Config>>(value.data);
      out << YAML::BeginSeq;
      for (const auto& item : items) {
        const Config::Impl& impl = item.impl();
        emit_keys(out, impl, *impl.item_keys, "");
      }
      out << YAML::EndSeq;
      break;
    }
  }
}

}  // namespace

std::string format_float(double value) {
  char buf[64];
  const auto [ptr, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  std::string s = ec == std::errc() ? std::string(buf, ptr) : std::to_string(value);
  if (std::isfinite(value) && s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string format_bound(double value) {
  if (std::floor(value) == value && std::fabs(value) < 1e15) {
    return std::to_string(static_cast<long long>(value));
  }
  return format_float(value);
}

std::int64_t Config::integer(std::string_view path) const { return typed<std::int64_t>(*impl_, path, Type::kInt); }
double Config::number(std::string_view path) const { return typed<double>(*impl_, path, Type::kFloat); }
bool Config::boolean(std::string_view path) const { return typed<bool>(*impl_, path, Type::kBool); }
const std::string& Config::string(std::string_view path) const {
  return typed<std::string>(*impl_, path, Type::kString);
}
const std::vector<std::string>& Config::strings(std::string_view path) const {
  return typed<std::vector<std::string>>(*impl_, path, Type::kStringList);
}
const nlohmann::json& Config::map(std::string_view path) const {
  return typed<nlohmann::json>(*impl_, path, Type::kMap);
}
const std::vector<Config>& Config::objects(std::string_view path) const {
  return typed<std::vector<Config>>(*impl_, path, Type::kObjectList);
}

bool Config::has(std::string_view path) const { return impl_->values.find(path) != impl_->values.end(); }
std::string Config::where(std::string_view path) const { return lookup(*impl_, path).where; }
bool Config::is_set(std::string_view path) const { return lookup(*impl_, path).set; }

std::string Config::to_yaml() const {
  YAML::Emitter out;
  if (impl_->item_keys != nullptr) {
    emit_keys(out, *impl_, *impl_->item_keys, "");
  } else {
    out << YAML::BeginMap;
    for (const auto& section : impl_->schema->sections()) {
      out << YAML::Key << section.name << YAML::Value;
      emit_keys(out, *impl_, section.keys, section.name + ".");
    }
    out << YAML::EndMap;
  }
  return std::string(out.c_str()) + "\n";
}

}  // namespace arlo::config
