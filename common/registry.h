#pragma once
// What every registry of extensions shares: the reward kinds (rollout/rewards/), admin dialects
// (rollout/admin_dialects/), environments (rollout/environments/) and weight-sync transports
// (weight_sync/transports/). A registry has one file per entry, which defines the function that
// makes the entry (`RewardKind exact_match_reward()`), and one line per entry in its registry.inc
// (`ARLO_REWARD(exact_match)`): adding an entry is that file and that line. The .cc file that owns
// a registry lists it once, in registry.inc order:
//
//   const ExtensionRegistry<RewardKind>& reward_kinds() {
//     static const ExtensionRegistry<RewardKind> kinds = {
//   #include "rollout/rewards/registry.inc"
//     };
//     return kinds;
//   }
//
// where registry.inc defines its line's macro as an ARLO_REGISTRY_ENTRY:
//
//   #define ARLO_REWARD(x) ARLO_REGISTRY_ENTRY(RewardKind, x##_reward)
//   ARLO_REWARD(exact_match)
//   ...
//   #undef ARLO_REWARD
//
// An entry type has a `name` (what a config writes to choose it) and a static `kWhat`, what the
// config calls such a name ("reward kind"), for the error of a name that is not registered.
#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "common/result.h"

namespace arlo {

// One entry of a registry's list: declares `Entry maker()`, which the entry's own file defines in
// the namespace of the registry, and calls it. (The declaration is local to a lambda so that one
// pass over registry.inc both declares and lists the makers; `extern` says it is not a variable.)
#define ARLO_REGISTRY_ENTRY(Entry, maker) \
  [] {                                    \
    extern Entry maker();                 \
    return maker();                       \
  }(),

// "a, b or c" (`last_sep` before the last name).
inline std::string join_names(const std::vector<std::string>& names, std::string_view last_sep = " or ") {
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? std::string(last_sep) : std::string(", ");
    out += names[i];
  }
  return out;
}

// The entry of `registry` (any range of entries) named `name`, or nullptr.
template <typename Registry>
auto find_entry(const Registry& registry, std::string_view name) -> decltype(&*registry.begin()) {
  for (const auto& e : registry)
    if (e.name == name) return &e;
  return nullptr;
}

// The names of `registry`'s entries, in its order.
template <typename Registry>
std::vector<std::string> entry_names(const Registry& registry) {
  std::vector<std::string> names;
  for (const auto& e : registry) names.push_back(e.name);
  return names;
}

// The entries of one registry, in registration order, and lookup by name.
template <typename Entry>
class ExtensionRegistry {
 public:
  ExtensionRegistry(std::initializer_list<Entry> entries) : entries_(entries) {}

  auto begin() const { return entries_.begin(); }
  auto end() const { return entries_.end(); }
  std::size_t size() const { return entries_.size(); }
  const Entry& front() const { return entries_.front(); }

  // The entry named `name`; the error lists the registered names: "unknown reward kind 'x': use
  // exact_match, ... or weighted".
  Result<const Entry*> find(std::string_view name) const {
    if (const Entry* e = find_entry(*this, name)) return e;
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("unknown {} '{}': use {}", Entry::kWhat, name, join_names(entry_names(*this))));
  }

 private:
  std::vector<Entry> entries_;
};

}  // namespace arlo
